"""The CosmoFlow network as a framework-neutral layer list, shared by both implementations.

Reference (mlcommons/hpc cosmoflow/models/cosmoflow.py): n_conv_layers blocks of
Conv3D(conv_size * 2**i, kernel_size, padding 'same') -> LeakyReLU -> MaxPool3D(2);
Flatten; Dense(fc1) -> LeakyReLU -> Dropout; Dense(fc2) -> LeakyReLU -> Dropout;
Dense(4, tanh) -> x 1.2. Input is channels last (S, S, S, 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpckit.common.config import require

N_CHANNELS = 4
N_TARGETS = 4
OUTPUT_SCALE = 1.2


@dataclass(frozen=True)
class Layer:
    kind: str           # conv | act | pool | flatten | dense | dropout | tanh | scale
    out_shape: tuple
    params: int = 0
    detail: str = ""


def validate_model_config(cfg: dict) -> None:
    m, size = cfg["model"], cfg["data"]["sample_size"]
    for key in ("conv_size", "kernel_size", "n_conv_layers", "fc1_size", "fc2_size"):
        require(m[key] >= 1, f"model.{key}", f"must be >= 1 (got {m[key]})")
    require(0.0 <= m["dropout"] < 1.0, "model.dropout", f"must be in [0, 1) (got {m['dropout']})")
    require(m["l2"] >= 0.0, "model.l2", f"must be >= 0 (got {m['l2']})")
    require(m["leaky_relu_alpha"] >= 0.0, "model.leaky_relu_alpha", "must be >= 0")
    require(m.get("max_pool", "auto") in ("auto", "native", "deterministic"), "model.max_pool",
            f"must be auto, native or deterministic (got {m.get('max_pool')!r})")
    # 2 ** n of a huge n never ends: a count of poolings beyond the sample's halvings is refused first
    require(m["n_conv_layers"] <= max(int(size).bit_length(), 1), "model.n_conv_layers",
            f"{m['n_conv_layers']} halvings of a {size}^3 sample leave nothing (at most {int(size).bit_length()})")
    require(size % (2 ** m["n_conv_layers"]) == 0, "data.sample_size",
            f"{size} must be divisible by 2**model.n_conv_layers = {2 ** m['n_conv_layers']}")


def layers(cfg: dict) -> list[Layer]:
    m, s = cfg["model"], cfg["data"]["sample_size"]
    out, c_in, k = [], N_CHANNELS, m["kernel_size"]
    for i in range(m["n_conv_layers"]):
        c = m["conv_size"] * 2 ** i
        out.append(Layer("conv", (s, s, s, c), k ** 3 * c_in * c + c, f"Conv3D {c_in}->{c} k{k} same"))
        out.append(Layer("act", (s, s, s, c), 0, f"LeakyReLU {m['leaky_relu_alpha']}"))
        s //= 2
        out.append(Layer("pool", (s, s, s, c), 0, "MaxPool3D 2"))
        c_in = c
    flat = s ** 3 * c_in
    out.append(Layer("flatten", (flat,), 0, "Flatten (channels last)"))
    for width in (m["fc1_size"], m["fc2_size"]):
        out.append(Layer("dense", (width,), flat * width + width, f"Dense {flat}->{width}"))
        out.append(Layer("act", (width,), 0, f"LeakyReLU {m['leaky_relu_alpha']}"))
        out.append(Layer("dropout", (width,), 0, f"Dropout {m['dropout']}"))
        flat = width
    out.append(Layer("dense", (N_TARGETS,), flat * N_TARGETS + N_TARGETS, f"Dense {flat}->{N_TARGETS}"))
    out.append(Layer("tanh", (N_TARGETS,), 0, "tanh"))
    out.append(Layer("scale", (N_TARGETS,), 0, f"x {OUTPUT_SCALE}"))
    return out


def parameter_count(cfg: dict) -> int:
    return sum(layer.params for layer in layers(cfg))

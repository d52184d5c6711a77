"""CosmoFlow in PyTorch: the same network as the Keras reference, weight for weight.

Input is channels last like the Keras model; the convolutions run channels first and the
flatten is done in channels-last order, so a Keras model's weights map onto this one
exactly (see `load_keras_weights`) and both compute the same function. 'same' padding is
explicit where it is asymmetric: for a kernel k TensorFlow pads (k-1)//2 before and the
rest after, so kernel 2 (the mini config's) pads (0 before, 1 after); the reference's
kernel 3 pads 1 on both sides, which the convolution does itself (no padded copy).

Max pooling is `MaxPool3d`, an nn.MaxPool3d whose backward can be the kit's own
(`model.max_pool`, resolved before staging by common/determinism.choose_implementations):
PyTorch before 2.13 has no deterministic CUDA kernel for max_pool3d's backward, so under
`--deterministic` on CUDA `auto` runs `first_max_pool3d`, which computes the same forward
and the same gradient (see there), with ops that are deterministic on CUDA.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from hpckit.common import determinism
from hpckit.cosmoflow.model_spec import N_CHANNELS, N_TARGETS, OUTPUT_SCALE


class _FirstMaxPool3d(torch.autograd.Function):
    """max_pool3d with kernel = stride = k (no padding, floor mode): the forward is
    torch's own op (bit-equal by construction); the backward gives each window's output
    gradient to the element torch's max_pool3d kernels pick: the first maximum of the
    window in depth, height, width order, or its last NaN (the same gradient as torch's, ties
    and NaN included: tests/test_determinism_ops.py on CPU; CUDA, contiguous and
    channels_last_3d, checked on an H100 with torch 2.11). The windows do not overlap, so each input element gets at most one gradient and the result
    is written, never accumulated: k**3 strided slices of the input compared with the
    output (eq, logical and/or, where, a strided copy; none of them on the raising list of
    torch.use_deterministic_algorithms). Saves the input and the output (torch's saves the
    input and int64 indices)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, k: int) -> torch.Tensor:
        y = torch.nn.functional.max_pool3d(x, k)
        ctx.save_for_backward(x, y)
        ctx.k = k
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy: torch.Tensor):
        x, y = ctx.saved_tensors
        k = ctx.k
        d, h, w = y.shape[-3:]
        gx = torch.zeros_like(x, dtype=gy.dtype)
        gy_nan = torch.isnan(y)
        taken = torch.zeros_like(y, dtype=torch.bool)
        slots = list(itertools.product(range(k), repeat=3))    # (depth, height, width) scan order
        first = {}
        for a, b, c in slots:              # the first element equal to the maximum
            hit = (x[..., a::k, b::k, c::k][..., :d, :h, :w] == y) & ~taken
            taken |= hit
            first[a, b, c] = hit
        taken = ~gy_nan                    # windows whose maximum is NaN: their last NaN
        for a, b, c in reversed(slots):
            hit = torch.isnan(x[..., a::k, b::k, c::k][..., :d, :h, :w]) & ~taken
            taken |= hit
            first[a, b, c] |= hit
        for (a, b, c), hit in first.items():
            gx[..., a::k, b::k, c::k][..., :d, :h, :w] = torch.where(hit, gy, 0)
        return gx, None


def first_max_pool3d(x: torch.Tensor, k: int) -> torch.Tensor:
    """max_pool3d(x, k) with a deterministic backward on every device (_FirstMaxPool3d)."""
    return _FirstMaxPool3d.apply(x, k)


class MaxPool3d(nn.MaxPool3d):
    """nn.MaxPool3d(k) (kernel = stride = k) with the implementation `model.max_pool`
    chooses: 'native' torch's, 'deterministic' first_max_pool3d whenever a gradient is
    taken, 'auto' first_max_pool3d only on CUDA under torch.use_deterministic_algorithms
    where the running torch has no deterministic kernel (determinism.max_pool3d_impl)."""

    def __init__(self, kernel_size: int, impl: str = "auto"):
        super().__init__(kernel_size)
        determinism.max_pool3d_impl(impl, "cpu")     # a bad value fails here, in one line
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad and \
                determinism.max_pool3d_impl(self.impl, x.device.type) == "deterministic":
            return first_max_pool3d(x, self.kernel_size)
        return super().forward(x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, impl={self.impl}"


def same_padding(k: int) -> nn.Module:
    before = (k - 1) // 2
    after = k - 1 - before
    return nn.ConstantPad3d((before, after) * 3, 0.0)


class CosmoFlow(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        m, s = cfg["model"], cfg["data"]["sample_size"]
        blocks, c_in = [], N_CHANNELS
        for i in range(m["n_conv_layers"]):
            c = m["conv_size"] * 2 ** i
            k = m["kernel_size"]
            conv = [nn.Conv3d(c_in, c, k, padding=(k - 1) // 2)] if k % 2 else [same_padding(k), nn.Conv3d(c_in, c, k)]
            blocks += [*conv, nn.LeakyReLU(m["leaky_relu_alpha"]), MaxPool3d(2, m.get("max_pool", "auto"))]
            c_in, s = c, s // 2
        self.features = nn.Sequential(*blocks)
        flat = s ** 3 * c_in
        self.head = nn.Sequential(
            nn.Linear(flat, m["fc1_size"]), nn.LeakyReLU(m["leaky_relu_alpha"]), nn.Dropout(m["dropout"]),
            nn.Linear(m["fc1_size"], m["fc2_size"]), nn.LeakyReLU(m["leaky_relu_alpha"]), nn.Dropout(m["dropout"]),
            nn.Linear(m["fc2_size"], N_TARGETS), nn.Tanh())
        self.l2 = m["l2"]
        self._init_like_keras()

    def _init_like_keras(self) -> None:
        # Keras defaults: glorot_uniform kernels, zero biases.
        for mod in self.modules():
            if isinstance(mod, (nn.Conv3d, nn.Linear)):
                nn.init.xavier_uniform_(mod.weight)
                nn.init.zeros_(mod.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # x: (N, S, S, S, C)
        h = self.features(x.permute(0, 4, 1, 2, 3))
        h = h.permute(0, 2, 3, 4, 1).flatten(1)               # Keras Flatten order
        return self.head(h) * OUTPUT_SCALE

    def l2_penalty(self) -> torch.Tensor:
        """Keras L2(l2) on the two hidden dense kernels (not the output layer, as upstream):
        l2 * sum(w^2), added to the loss."""
        if self.l2 == 0:
            return torch.zeros(())
        hidden = [lin for lin in self.head if isinstance(lin, nn.Linear)][:-1]
        return self.l2 * sum((lin.weight ** 2).sum() for lin in hidden)


def load_keras_weights(model: CosmoFlow, keras_model) -> None:
    """Copy a Keras CosmoFlow's weights into `model` (kernel layouts transposed)."""
    ours = [m for m in model.modules() if isinstance(m, (nn.Conv3d, nn.Linear))]
    theirs = [layer for layer in keras_model.layers if layer.get_weights()]
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    with torch.no_grad():
        for mod, layer in zip(ours, theirs):
            kernel, bias = layer.get_weights()
            if isinstance(mod, nn.Conv3d):      # (kd, kh, kw, in, out) -> (out, in, kd, kh, kw)
                mod.weight.copy_(torch.from_numpy(kernel.transpose(4, 3, 0, 1, 2).copy()))
            else:                               # (in, out) -> (out, in)
                mod.weight.copy_(torch.from_numpy(kernel.T.copy()))
            mod.bias.copy_(torch.from_numpy(bias))

"""The container targets: the one table both recipe formats are written from.

Each target names a pinned base image, the runtime environment, the system packages and
the Python stack; `recipe_steps` turns a target into the install steps that
`generate.py` writes, unchanged, into the Dockerfile's RUN and the Apptainer %post.

The Python pins are not repeated here: they are read from requirements/cpu.txt and
requirements/constraints-cpu.txt (what `make` installs into .venv), so a pin changed
there makes the committed recipes stale (`hpckit containers generate --check`).
Per target only the build of a framework differs: torch `+cpu` from PyTorch's CPU index
on the CPU targets, x86-64 and aarch64 alike (PyPI's aarch64 torch 2.13.0 wheel is a CUDA 13
build: in an arm64 root file system under qemu, `import torch` fails on libcudart.so.13, see
docs/targets.md), `+cu128` on the GPU targets (CUDA 12.8 still builds for sm_70 and sm_80);
TensorFlow as `tensorflow-cpu` on x86-64 CPUs and as `tensorflow` elsewhere (CPU-only on
aarch64, CUDA on the GPU images).

Whether PyPI has a wheel of a pin for a target's platform is asked with the manylinux tags
the base's glibc runs (Debian bookworm: 2.36), not with manylinux_2_17 alone: TensorFlow
2.21.0's aarch64 wheel is manylinux_2_27 (tests/test_containers.py, with network).
"""

from __future__ import annotations

from dataclasses import dataclass

ROOT = "/opt/hpckit"
VENV = f"{ROOT}/venv"
SRC = f"{ROOT}/src"
WHEELS = f"{ROOT}/wheels"
PIP = f"{VENV}/bin/pip"

# Pinned bases. Debian's dated tags are immutable snapshots of a point release
# (bookworm-20251229 is Debian 12.12); arm64v8/ is the same tag's aarch64 image.
DEBIAN = "docker.io/library/debian:bookworm-20251229-slim"
DEBIAN_ARM64 = "docker.io/arm64v8/debian:bookworm-20251229-slim"
CUDA = "docker.io/nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"

# pyproject.toml's build backend, installed first so the kit builds without isolation
# (and without an index)
BUILD_PINS = ("setuptools==84.2.1",)
# the kit's runtime dependencies, by their names in requirements/cpu.txt
COMMON = ("numpy", "PyYAML", "mlperf-logging", "crc32c", "h5py", "lmdb")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CU128_INDEX = "https://download.pytorch.org/whl/cu128"


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    base: str                      # image reference, pinned by exact tag
    platform: str                  # linux/amd64 | linux/arm64
    torch_build: str               # local version label of torch: '+cpu', '', '+cu128'
    tensorflow: str | None         # distribution name, or None for a PyTorch-only image
    apt: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    pip_indexes: tuple[str, ...] = ()
    wheels_from_context: bool = False  # pip installs only from the build context's wheels/
    cuda_arch: int | None = None

    @property
    def kind(self) -> str:
        return "gpu" if self.cuda_arch else "cpu"


_ENV = (("PATH", f"{VENV}/bin:$PATH"), ("PYTHONUNBUFFERED", "1"), ("LC_ALL", "C.UTF-8"))
_APT = ("python3", "python3-venv", "ca-certificates",
        "libtcmalloc-minimal4")   # the training's allocator (common/memory.py)

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target(
        name="local",
        description="the CPU image built and run here (tests): the CPU stack of "
                    "requirements/cpu.txt, PyTorch and TensorFlow; pip installs only from "
                    "the build context's wheels/ (see `hpckit containers requirements`)",
        base=DEBIAN, platform="linux/amd64", torch_build="+cpu", tensorflow="tensorflow-cpu",
        apt=_APT, env=_ENV + (("HPCKIT_TARGET", "local"),),
        wheels_from_context=True),
    Target(
        name="a64fx",
        description="Fujitsu A64FX (aarch64, SVE; modelled on Fugaku): CPU stack",
        base=DEBIAN_ARM64, platform="linux/arm64", torch_build="+cpu", tensorflow="tensorflow",
        apt=_APT, pip_indexes=(TORCH_CPU_INDEX,),
        env=_ENV + (("HPCKIT_TARGET", "a64fx"), ("OMP_PROC_BIND", "close"),
                    ("OMP_PLACES", "cores"))),
    Target(
        name="knl",
        description="Intel Xeon Phi 7250 Knights Landing (x86-64, AVX-512; modelled on "
                    "Cori KNL): CPU stack",
        base=DEBIAN, platform="linux/amd64", torch_build="+cpu", tensorflow="tensorflow-cpu",
        apt=_APT, pip_indexes=(TORCH_CPU_INDEX,),
        env=_ENV + (("HPCKIT_TARGET", "knl"), ("KMP_BLOCKTIME", "1"),
                    ("KMP_AFFINITY", "granularity=fine,compact,1,0"))),
    Target(
        name="v100",
        description="NVIDIA V100 (sm_70; modelled on Cori-GPU / ABCI): CUDA 12.8, cuDNN 9",
        base=CUDA, platform="linux/amd64", torch_build="+cu128", tensorflow="tensorflow",
        apt=_APT, pip_indexes=(TORCH_CU128_INDEX,), cuda_arch=70,
        env=_ENV + (("HPCKIT_TARGET", "v100"), ("TORCH_CUDA_ARCH_LIST", "7.0"),
                    ("NVIDIA_VISIBLE_DEVICES", "all"),
                    ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))),
    Target(
        name="a100",
        description="NVIDIA A100 (sm_80; modelled on Perlmutter / ThetaGPU): CUDA 12.8, "
                    "cuDNN 9",
        base=CUDA, platform="linux/amd64", torch_build="+cu128", tensorflow="tensorflow",
        apt=_APT, pip_indexes=(TORCH_CU128_INDEX,), cuda_arch=80,
        env=_ENV + (("HPCKIT_TARGET", "a100"), ("TORCH_CUDA_ARCH_LIST", "8.0"),
                    ("NVIDIA_VISIBLE_DEVICES", "all"),
                    ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))),
)}


def python_pins(target: Target, pins: dict[str, str]) -> list[str]:
    """The target's pip requirements, exact versions, from `pins` (name -> version)."""
    def pin(name: str, dist: str | None = None, label: str = "") -> str:
        key = name.lower()
        if key not in pins:
            from hpckit.common.errors import KitError
            raise KitError(f"requirements/cpu.txt pins no {name} (container target {target.name})")
        version = pins[key].split("+")[0] + label
        return f"{dist or name}=={version}"

    out = list(BUILD_PINS)
    out.append(pin("torch", label=target.torch_build))
    if target.tensorflow:
        out.append(pin("tensorflow-cpu", dist=target.tensorflow))
        out.append(pin("keras"))
    out += [pin(name) for name in COMMON]
    return out


def recipe_steps(target: Target, pins: dict[str, str]) -> list[str]:
    """The install steps, one shell command each (run by /bin/sh with `set -eu`).

    Every command is self-contained: Apptainer's %environment does not apply in %post,
    so nothing here relies on the runtime environment (PATH, DEBIAN_FRONTEND).
    """
    requirements = " ".join(python_pins(target, pins))
    if target.wheels_from_context:
        source = f"--no-index --find-links {WHEELS}"
    else:
        source = " ".join(f"--extra-index-url {url}" for url in target.pip_indexes)
    steps = [
        "set -eu",
        "apt-get update",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        + " ".join(target.apt),
        "rm -rf /var/lib/apt/lists/*",
        f"python3 -m venv {VENV}",
        " ".join(filter(None, [f"{PIP} install --no-cache-dir --disable-pip-version-check",
                               source, requirements])),
        f"{PIP} install --no-cache-dir --disable-pip-version-check --no-index --no-deps "
        f"--no-build-isolation {SRC}",
    ]
    if target.wheels_from_context:
        steps.append(f"rm -rf {WHEELS}")
    steps.append(f"{VENV}/bin/hpckit --help > /dev/null")
    return steps


def recipe_files(target: Target) -> list[tuple[str, str]]:
    """(build-context path, image path) pairs copied in before the install steps."""
    files = [("pyproject.toml", f"{SRC}/pyproject.toml"), ("apps", f"{SRC}/apps")]
    if target.wheels_from_context:
        files.append(("wheels", WHEELS))
    return files


def recipe_labels(target: Target, version: str) -> list[tuple[str, str]]:
    labels = [
        ("org.opencontainers.image.title", f"hpckit-{target.name}"),
        ("org.opencontainers.image.version", version),
        ("org.opencontainers.image.base.name", target.base),
        ("hpckit.target", target.name),
        ("hpckit.kind", target.kind),
        ("hpckit.platform", target.platform),
    ]
    if target.cuda_arch:
        labels.append(("hpckit.cuda_arch", str(target.cuda_arch)))
    return labels


RUNSCRIPT = "hpckit"

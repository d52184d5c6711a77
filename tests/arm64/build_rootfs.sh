#!/bin/sh
# An arm64 Debian bookworm root file system with the kit's aarch64 Python stack, run under
# qemu-user with 512-bit SVE (tests/test_arm64.py, `make arm64`). Run as root from the
# repository root: sh tests/arm64/build_rootfs.sh [DIR]   (default build/arm64, git-ignored)
#
# Needs Debian's qemu-user-static, binfmt-support and debootstrap (apt-get install
# qemu-user-static binfmt-support debootstrap) and PyPI and deb.debian.org. What it does:
#  1. registers qemu-aarch64 with binfmt_misc (mounting binfmt_misc where absent), so the
#     kernel runs arm64 binaries through qemu, in the chroot too (the F flag);
#  2. debootstrap --foreign (minbase + python3.11, libtcmalloc-minimal4, libgomp1), then the
#     packages' files unpacked natively with dpkg-deb -x instead of the second stage under
#     emulation (the second stage runs every maintainer script through qemu: 12 minutes on
#     the 2-core development VM; ARM64_SECOND_STAGE=1 runs it anyway);
#  3. the aarch64 wheels of requirements/cpu.txt's pins (tensorflow, keras, numpy, h5py,
#     PyYAML, mlperf-logging, crc32c) downloaded once into DIR/wheels and installed with
#     pip's --platform/--target into DIR/rootfs/opt/site; torch from PyTorch's CPU index at
#     the kit's pin (PyPI's aarch64 torch 2.13.0 is a CUDA build that does not import
#     without the CUDA libraries); where that index cannot be reached, PyPI's aarch64 torch
#     ARM64_TORCH_FALLBACK (default 2.9.1: a CPU build, its wheel bundles the Arm Compute
#     Library and OpenBLAS and asks for CUDA packages only on x86_64), a deviation written
#     to DIR/rootfs/opt/site/.torch and recorded by every run's provenance (its torch
#     version); ARM64_TORCH_FALLBACK=none: no torch, and the PyTorch parts of the test skip.
# Everything it writes is under DIR; a second run reuses what is there.
set -eu
DIR=${1:-build/arm64}
ROOT=$DIR/rootfs
PY=${PYTHON:-.venv/bin/python}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "build_rootfs.sh: run as root (binfmt_misc, chroot)" >&2; exit 2; }
command -v qemu-aarch64-static >/dev/null || { echo "build_rootfs.sh: no qemu-aarch64-static (apt-get install qemu-user-static binfmt-support)" >&2; exit 2; }
mkdir -p "$DIR"

# 1. binfmt_misc
[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 2>/dev/null || update-binfmts --import qemu-aarch64
fi
grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 || { echo "build_rootfs.sh: qemu-aarch64 registered without the F flag: the chroot cannot find qemu" >&2; exit 2; }

# 2. the root file system
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    debootstrap --arch arm64 --foreign --variant=minbase --include=python3.11,libtcmalloc-minimal4,libgomp1 \
        bookworm "$ROOT" "$MIRROR"
    if [ "${ARM64_SECOND_STAGE:-0}" = 1 ]; then
        chroot "$ROOT" /debootstrap/debootstrap --second-stage
    else
        for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
        chroot "$ROOT" /sbin/ldconfig
    fi
fi

# 3. the Python stack
PINS=$("$PY" - <<'EOF'
import sys
sys.path.insert(0, "apps")
from hpckit.containers import generate, targets
print(" ".join(p for p in targets.python_pins(targets.TARGETS["a64fx"], generate.read_pins())
               if not p.startswith(("torch==", "setuptools=="))))
EOF
)
TAGS="--platform manylinux2014_aarch64"
for n in 17 24 27 28 31 34 35 36; do TAGS="$TAGS --platform manylinux_2_${n}_aarch64"; done
mkdir -p "$DIR/wheels"
if [ ! -e "$ROOT/opt/site/.stack" ] || [ "$(cat "$ROOT/opt/site/.stack")" != "$PINS" ]; then
    # shellcheck disable=SC2086
    "$PY" -m pip download --disable-pip-version-check --only-binary=:all: $TAGS --python-version 3.11 \
        -d "$DIR/wheels" $PINS
    rm -rf "$ROOT/opt/site"
    # shellcheck disable=SC2086
    "$PY" -m pip install --disable-pip-version-check --quiet --no-index --find-links "$DIR/wheels" \
        --only-binary=:all: $TAGS --python-version 3.11 --target "$ROOT/opt/site" $PINS
    echo "$PINS" > "$ROOT/opt/site/.stack"
fi
TORCH=$("$PY" -c 'import sys; sys.path.insert(0, "apps"); from hpckit.containers import generate; print(generate.read_pins()["torch"].split("+")[0])')
if [ ! -d "$ROOT/opt/site/torch" ]; then
    # shellcheck disable=SC2086
    if "$PY" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: $TAGS --python-version 3.11 \
            --index-url https://download.pytorch.org/whl/cpu -d "$DIR/wheels" "torch==$TORCH+cpu" 2>"$DIR/torch.err"; then
        # shellcheck disable=SC2086
        "$PY" -m pip download --disable-pip-version-check --only-binary=:all: $TAGS --python-version 3.11 \
            -c requirements/constraints-cpu.txt -d "$DIR/wheels" sympy networkx jinja2 filelock fsspec typing-extensions
        # shellcheck disable=SC2086
        "$PY" -m pip install --disable-pip-version-check --quiet --no-index --find-links "$DIR/wheels" --no-deps \
            --only-binary=:all: $TAGS --python-version 3.11 --target "$ROOT/opt/site" "torch==$TORCH+cpu" \
            -c requirements/constraints-cpu.txt sympy mpmath networkx jinja2 MarkupSafe filelock fsspec typing-extensions
        echo "torch==$TORCH+cpu from download.pytorch.org/whl/cpu (the kit's pin)" > "$ROOT/opt/site/.torch"
    elif FALLBACK=${ARM64_TORCH_FALLBACK:-2.9.1} && [ "$FALLBACK" != none ] && \
            "$PY" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: $TAGS --python-version 3.11 \
            -d "$DIR/wheels" "torch==$FALLBACK" 2>>"$DIR/torch.err"; then
        # shellcheck disable=SC2086
        "$PY" -m pip download --disable-pip-version-check --only-binary=:all: $TAGS --python-version 3.11 \
            -c requirements/constraints-cpu.txt -d "$DIR/wheels" sympy networkx jinja2 filelock fsspec typing-extensions
        # shellcheck disable=SC2086
        "$PY" -m pip install --disable-pip-version-check --quiet --no-index --find-links "$DIR/wheels" --no-deps \
            --only-binary=:all: $TAGS --python-version 3.11 --target "$ROOT/opt/site" "torch==$FALLBACK"
        # shellcheck disable=SC2086
        "$PY" -m pip install --disable-pip-version-check --quiet --no-index --find-links "$DIR/wheels" --no-deps \
            --only-binary=:all: $TAGS --python-version 3.11 --target "$ROOT/opt/site" --upgrade \
            -c requirements/constraints-cpu.txt sympy mpmath networkx jinja2 MarkupSafe filelock fsspec typing-extensions
        echo "torch==$FALLBACK from PyPI, not the kit's pin $TORCH (download.pytorch.org/whl/cpu unreachable: $(grep -v WARNING "$DIR/torch.err" | head -n 1 | cut -c1-200))" > "$ROOT/opt/site/.torch"
        echo "build_rootfs.sh: deviation: $(cat "$ROOT/opt/site/.torch")" >&2
    else
        echo "build_rootfs.sh: no aarch64 CPU torch ($(tail -n 1 "$DIR/torch.err")): the PyTorch parts will skip" >&2
    fi
fi
echo "$ROOT"

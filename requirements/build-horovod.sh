#!/usr/bin/env bash
# Build Horovod 0.28.1 for PyTorch with MPI into a venv (the optional `--dist horovod`).
#
#   requirements/build-horovod.sh VENV     # e.g. .venv; needs mpicc (libopenmpi-dev), cmake, g++
#
# Horovod 0.28.1 is the last release, unmaintained, and deprecated in Spack
# (CVE-2024-10190 is in horovodrun's network services): the kit launches Horovod only
# through srun or mpirun, never through horovodrun. It builds against torch 2.13 only in
# C++17 (horovod/torch/CMakeLists.txt asks for C++14) and without Gloo (MPI is the
# controller); TensorFlow support is left out (it does not build against TF 2.21).
set -euo pipefail
venv=$(realpath "${1:?usage: build-horovod.sh VENV}")
version=0.28.1
sha256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
if "$venv/bin/python" -c "import horovod.torch, horovod; assert horovod.__version__ == '$version'" 2>/dev/null; then
    echo "horovod $version already in $venv"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "horovod==$version" -d "$work"
echo "$sha256  $work/horovod-$version.tar.gz" | sha256sum --check --quiet
tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
src="$work/horovod-$version"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/horovod/torch/CMakeLists.txt"
grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt"
# build against the venv's torch (no isolated build env: it would fetch another torch)
"$venv/bin/pip" install --quiet --disable-pip-version-check -c "$(dirname "$0")/constraints-cpu.txt" \
    cloudpickle psutil packaging cffi
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS="-j$(nproc)" \
    "$venv/bin/pip" install --disable-pip-version-check --no-build-isolation --no-deps \
    -c "$(dirname "$0")/constraints-cpu.txt" "$src"
"$venv/bin/python" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '', 'mpi built:', hvd.mpi_built())"

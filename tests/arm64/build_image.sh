#!/bin/sh
# The a64fx image (containers/a64fx/Dockerfile) built for linux/arm64 with Podman, its base
# made by debootstrap --arch arm64 (second stage under qemu) and imported under the name
# the recipe pins, as no registry is used. Run as root from the repository root:
#   sh tests/arm64/build_image.sh [DIR]        (default build/arm64-image, git-ignored)
# Needs qemu-user-static + binfmt-support (qemu-aarch64 registered, F flag), debootstrap,
# podman, deb.debian.org, PyPI and download.pytorch.org (torch +cpu for aarch64).
set -eu
DIR=${1:-build/arm64-image}
BASE=$(.venv/bin/python -c 'import sys; sys.path.insert(0, "apps"); from hpckit.containers import targets; print(targets.TARGETS["a64fx"].base)')
[ "$(id -u)" = 0 ] || { echo "build_image.sh: run as root" >&2; exit 2; }
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-aarch64; }
mkdir -p "$DIR"
if [ ! -e "$DIR/base.done" ]; then
    rm -rf "$DIR/base"
    debootstrap --arch arm64 --foreign --variant=minbase bookworm "$DIR/base" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    chroot "$DIR/base" /debootstrap/debootstrap --second-stage
    tar -C "$DIR/base" -c . | podman import --arch arm64 - "$BASE"
    touch "$DIR/base.done"
fi
start=$(date +%s)
podman build --pull=never --platform linux/arm64 --network host -t localhost/hpckit:a64fx -f containers/a64fx/Dockerfile .
echo "a64fx image built in $(( $(date +%s) - start )) s (under emulation: not a speed figure)"
podman run --rm --platform linux/arm64 -e QEMU_CPU=a64fx,sve-default-vector-length=64 localhost/hpckit:a64fx \
    hpckit describe cosmoflow --config mini

#!/bin/sh
# The a64fx image (containers/a64fx/Dockerfile) built for linux/arm64 with Podman, its base
# made by debootstrap --arch arm64 (second stage under qemu) and imported under the name
# the recipe pins, as no registry is used; then, inside the image with 512-bit SVE
# (QEMU_CPU=a64fx): describe, datagen, 2 steps of CosmoFlow (TensorFlow and PyTorch) and of
# DeepCAM, and `hpckit check` of each bounded log. Run as root from the repository root:
#   sh tests/arm64/build_image.sh [DIR]        (default build/arm64-image, git-ignored)
# Needs qemu-user-static + binfmt-support (qemu-aarch64 registered, F flag), debootstrap,
# podman, deb.debian.org, PyPI and download.pytorch.org (torch +cpu for aarch64).
# Where download.pytorch.org cannot be reached, the recipe is built with one pin changed,
# a named deviation (as tests/arm64/build_rootfs.sh): torch==$ARM64_TORCH_FALLBACK (default
# 2.9.1, PyPI's aarch64 CPU build) instead of the kit's torch==X+cpu from PyTorch's index;
# the derived recipe is written to DIR/Dockerfile and the image carries the label
# hpckit.deviation saying so. Every time printed here is emulated: not a speed figure.
set -eu
DIR=${1:-build/arm64-image}
BASE=$(.venv/bin/python -c 'import sys; sys.path.insert(0, "apps"); from hpckit.containers import targets; print(targets.TARGETS["a64fx"].base)')
[ "$(id -u)" = 0 ] || { echo "build_image.sh: run as root" >&2; exit 2; }
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-aarch64; }
mkdir -p "$DIR"
if [ ! -e "$DIR/base.done" ]; then
    start=$(date +%s)
    rm -rf "$DIR/base"
    debootstrap --arch arm64 --foreign --variant=minbase bookworm "$DIR/base" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    chroot "$DIR/base" /debootstrap/debootstrap --second-stage
    tar -C "$DIR/base" -c . | podman import --arch arm64 - "$BASE"
    touch "$DIR/base.done"
    echo "build_image.sh: base imported as $BASE in $(( $(date +%s) - start )) s (emulated second stage: not a speed figure)"
fi

RECIPE=containers/a64fx/Dockerfile
INDEX=https://download.pytorch.org/whl/cpu
if ! curl -sSf -m 30 -o /dev/null "$INDEX/torch/" 2>"$DIR/index.err"; then
    PIN=$(grep -o 'torch==[0-9.]*+cpu' "$RECIPE")
    FALLBACK=${ARM64_TORCH_FALLBACK:-2.9.1}
    WHY="torch==$FALLBACK from PyPI, not the kit's pin $PIN ($INDEX unreachable: $(head -n 1 "$DIR/index.err" | cut -c1-120))"
    echo "build_image.sh: deviation: $WHY" >&2
    sed -e "s#--extra-index-url $INDEX ##" -e "s#$PIN#torch==$FALLBACK#" "$RECIPE" > "$DIR/Dockerfile"
    grep -q "torch==$FALLBACK " "$DIR/Dockerfile" && ! grep -q "$INDEX" "$DIR/Dockerfile" \
        || { echo "build_image.sh: $RECIPE: the torch pin or index was not where expected" >&2; exit 2; }
    printf 'LABEL hpckit.deviation="%s"\n' "$(echo "$WHY" | tr -d '"')" >> "$DIR/Dockerfile"
    RECIPE=$DIR/Dockerfile
fi
# A network whose TLS is intercepted by a proxy (as here, and at many centres) has its CA in
# the host's bundle, not in the Debian base's: the build's RUN sees the host bundle and a
# pip.conf naming it, both mounted for the build only (nothing of them is in the image).
# HPCKIT_BUILD_CA=none builds without; HPCKIT_BUILD_CA=FILE names another bundle.
CA=${HPCKIT_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
MOUNTS=""
if [ "$CA" != none ] && [ -f "$CA" ]; then
    printf '[global]\ncert = /etc/hpckit-build-ca.crt\n' > "$DIR/pip.conf"
    MOUNTS="--volume $(realpath "$CA"):/etc/hpckit-build-ca.crt:ro --volume $(realpath "$DIR/pip.conf"):/etc/pip.conf:ro"
fi
start=$(date +%s)
# shellcheck disable=SC2086
podman build --pull=never --platform linux/arm64 --network host $MOUNTS -t localhost/hpckit:a64fx -f "$RECIPE" .
echo "build_image.sh: a64fx image built in $(( $(date +%s) - start )) s (under emulation: not a speed figure)"

# inside the image, with A64FX's 512-bit SVE; the work directory is the container's own.
# PODMAN_RUN_OPTS: explicit limits by default (a container that inherits the host's cannot
# start where they exceed what the user namespace may set: runc's `error setting rlimit`)
run() {
    t0=$(date +%s)
    # shellcheck disable=SC2086
    podman run --rm --platform linux/arm64 ${PODMAN_RUN_OPTS:---ulimit nofile=1024:1024 --ulimit nproc=4096:4096} -e QEMU_CPU=a64fx,sve-default-vector-length=64 \
        -e TF_CPP_MIN_LOG_LEVEL=3 localhost/hpckit:a64fx sh -eu -c "$1"
    echo "build_image.sh: [emulated arm64, not a speed figure] $2: $(( $(date +%s) - t0 )) s"
}
bounded() {   # benchmark framework: datagen, 2 steps, the log checked (aborted, so NOT COMPLIANT)
    echo "
    hpckit describe $1 --config mini ${2:+--framework $2} | head -n 1
    hpckit datagen $1 --config mini --out /tmp/d --train 8 --valid 4 --seed 7 > /dev/null
    rc=0; hpckit train $1 --data /tmp/d --config mini ${2:+--framework $2} --output-dir /tmp/o --seed 1 \
        --set train.max_steps=2 --set data.n_train=8 --set data.n_valid=4 > /tmp/train.out 2>&1 || rc=\$?
    [ \$rc = 3 ] || { tail -n 20 /tmp/train.out; echo \"train exited \$rc, not 3 (step-limited)\"; exit 1; }
    grep -q '\"key\": \"run_stop\".*step-limited: train.max_steps 2 reached' /tmp/o/mlperf.log
    hpckit check /tmp/o/mlperf.log --ruleset hpc-3.0.0 | head -n 1 | grep -q '^NOT COMPLIANT'
    python -c 'import json; s = json.load(open(\"/tmp/o/summary.json\")); print(\"ran with torch\", s[\"software\"].get(\"torch\"), \"tensorflow\", s[\"software\"].get(\"tensorflow\"))'
    "
}
run "python -c 'import platform; print(platform.machine())'; hpckit describe cosmoflow --config mini | head -n 1" "describe"
run "$(bounded cosmoflow tensorflow)" "CosmoFlow TensorFlow, 2 steps"
run "$(bounded cosmoflow pytorch)" "CosmoFlow PyTorch, 2 steps"
run "$(bounded deepcam "")" "DeepCAM, 2 steps"
echo "build_image.sh: the a64fx image built and ran CosmoFlow (both frameworks) and DeepCAM, each log checked"

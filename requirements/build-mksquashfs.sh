#!/usr/bin/env bash
# Build the statically linked mksquashfs that podman-hpc's `migrate` needs, into a venv's
# bin/ as mksquashfs.static (the name podman-hpc looks for on PATH).
#
#   requirements/build-mksquashfs.sh VENV     # e.g. .venv; needs gcc, make, zlib1g-dev, liblz4-dev
#
# podman-hpc squashes an image by running mksquashfs inside that image (bind-mounted from
# the host), so it must be static; podman-hpc 1.2.2 passes -comp lz4 and -xattrs-exclude,
# which needs squashfs-tools >= 4.6. Debian bookworm ships 4.5.1: the source is Debian
# trixie's squashfs-tools 4.6.1 (apt-get source from the Debian mirror apt already uses,
# with a private list of sources; the system's apt configuration is not changed), checked
# against the sha256 below, built with gzip and lz4 only.
set -euo pipefail
[ $# = 1 ] && [ -d "$1" ] || { echo "usage: build-mksquashfs.sh VENV (an existing folder)" >&2; exit 2; }
venv=$(realpath "$1")
version=4.6.1
sha256=94201754b36121a9f022a190c75f718441df15402df32c2b520ca331a107511c
out="$venv/bin/mksquashfs.static"
if [ -x "$out" ] && "$out" -version 2>/dev/null | grep -q "version $version "; then
    echo "mksquashfs.static $version already in $venv"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mirror=$(apt-cache policy | awk '$3 ~ /\/main$/ && $3 !~ /security|updates/ {print $2; exit}')
[ -n "$mirror" ] || { echo "build-mksquashfs.sh: no Debian mirror among apt's sources" >&2; exit 2; }
mkdir -p "$work/lists/partial"
echo "deb-src $mirror trixie main" > "$work/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
             -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root)
apt-get "${apt_private[@]}" update -qq
(cd "$work" && apt-get "${apt_private[@]}" source --download-only -qq "squashfs-tools=1:$version-1")
echo "$sha256  $work/squashfs-tools_$version.orig.tar.gz" | sha256sum --check --quiet
mkdir "$work/src"
tar -xzf "$work/squashfs-tools_$version.orig.tar.gz" -C "$work/src" --strip-components=1
make -C "$work/src/squashfs-tools" -j"$(nproc)" mksquashfs LDFLAGS=-static \
    GZIP_SUPPORT=1 LZ4_SUPPORT=1 XZ_SUPPORT=0 LZO_SUPPORT=0 ZSTD_SUPPORT=0 > "$work/make.log" 2>&1 \
    || { tail -20 "$work/make.log" >&2; exit 1; }
install -m 755 "$work/src/squashfs-tools/mksquashfs" "$out"
"$out" -version | head -1

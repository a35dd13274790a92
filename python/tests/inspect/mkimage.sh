#!/bin/sh
# mkimage.sh CACHE_DIR: builds the Debian image the Inspect tests run in
# (minbase with the tools Inspect's self_check and bash() need) as a
# `docker save` tarball for `tai42 image import`, and prints its path.
#
# mmdebstrap makes the root filesystem from this machine's apt sources;
# internal/imagestore/imagestoretest/cmd/mkrootfsimage turns it into an
# image. The result is cached in CACHE_DIR under a key of the suite, the
# package list, this script, the image command and the apt sources: a second
# run with the same inputs prints the cached file at once.
#
# Needs mmdebstrap (apt-get install -y mmdebstrap) and Go. Environment:
# TAI42_DEBIAN_SUITE (default bookworm), GO (default: go on PATH, else
# /usr/local/go/bin/go).
set -eu

cache=${1:?usage: mkimage.sh CACHE_DIR}
suite=${TAI42_DEBIAN_SUITE:-bookworm}
packages=adduser,bash,coreutils,passwd,procps,python3-minimal
repo=$(cd "$(dirname "$0")/../../.." && pwd)
go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

# The machine's own apt sources, so the build reaches the mirror apt does.
sources=
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  if [ -s "$f" ]; then sources=$f; break; fi
done

key=$( {
  printf '%s\n' "$suite" "$packages"
  cat "$0" "$repo/internal/imagestore/imagestoretest/rootfs.go" "$repo/internal/imagestore/imagestoretest/cmd/mkrootfsimage/main.go"
  if [ -n "$sources" ]; then cat "$sources"; fi
} | sha256sum | cut -c1-16)
out=$cache/debian-tools-$key.tar
if [ -s "$out" ]; then
  echo "$out"
  exit 0
fi

command -v mmdebstrap >/dev/null || { echo "mkimage.sh: mmdebstrap is missing: apt-get install -y mmdebstrap" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Documentation, manuals and translations are left out: a smaller image
# imports faster, and no test reads them.
mmdebstrap --quiet --variant=minbase --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  "$suite" "$tmp/rootfs.tar" ${sources:+"$sources"} >&2
(cd "$repo" && "$go" run ./internal/imagestore/imagestoretest/cmd/mkrootfsimage \
  -rootfs "$tmp/rootfs.tar" -o "$tmp/image.tar" -name debian-tools) >/dev/null
mv "$tmp/image.tar" "$out"
echo "$out"

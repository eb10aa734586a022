#!/usr/bin/env bash
# Make the local Debian test base image for Dockerfile.hicache, for the SGLang release of a wheel:
# Debian bookworm from mmdebstrap, imported with `docker import` (no image registry is reachable
# here), then sglang installed WITHOUT dependencies from a wheel downloaded on the host into a
# virtual environment at /opt/sglang/venv (Debian's Python refuses pip installs into itself,
# PEP 668), in a layer of its own.
#
#   scripts/make-base-image.sh WHEEL [NAME] [DEBIAN_IMAGE]
#     WHEEL         an sglang cp311 wheel, e.g. sglang-X.Y.Z-cp311-cp311-manylinux_2_34_x86_64.whl
#                   (bookworm's Python is 3.11)
#     NAME          image name, default escha-sglang-base:X.Y.Z-bookworm (X.Y.Z: the wheel's release)
#     DEBIAN_IMAGE  the Debian layer (bookworm, python3, the empty venv): taken as it is when the
#                   daemon has it, else made and tagged so; the bases of two releases made with one
#                   DEBIAN_IMAGE share that layer and differ only by their wheel's. Default: made
#                   for this base alone (its tag removed at the end)
#
# The image sets ESCHA_SGLANG_PYTHON=/opt/sglang/venv/bin/python, which tells escha-deploy where
# SGLang's interpreter is, and puts that venv first on PATH, so `python3` is SGLang's Python as
# in the official image (the launch spec runs `python3 -m sglang.launch_server`). Not a runnable server: SGLang's
# dependencies (torch, ...) are left out on purpose; the image is the base the series is
# applied to and verified against, in CI. Needs root, mmdebstrap and a running dockerd.
set -euo pipefail
wheel="${1:?usage: $0 WHEEL [NAME] [DEBIAN_IMAGE]}"
[ -f "$wheel" ] || { echo "no such wheel: $wheel" >&2; exit 2; }
whl="$(basename "$wheel")"
# the wheel file name's version field (PEP 427: NAME-VERSION-...)
version="$(printf '%s\n' "$whl" | cut -d- -f2)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "$whl: no X.Y.Z release in the wheel's name" >&2; exit 2; }
name="${2:-escha-sglang-base:$version-bookworm}"
debian="${3:-}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

tmp="$(mktemp -d)"
own_debian=""
container="escha-base-$$-$RANDOM"
cleanup() {
    docker rm -f "$container" >/dev/null 2>&1 || true
    [ -z "$own_debian" ] || docker rmi "$own_debian" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "$debian" ] || ! docker image inspect "$debian" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
    mmdebstrap --quiet --variant=apt \
        --include=python3,python3-venv,ca-certificates \
        --customize-hook='chroot "$1" python3 -m venv /opt/sglang/venv' \
        --customize-hook='rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
        bookworm "$tmp/base.tar" "$mirror"
    if [ -z "$debian" ]; then debian="escha-debian-python:bookworm-$$-$RANDOM"; own_debian="$debian"; fi
    docker import \
        --change 'ENV ESCHA_SGLANG_PYTHON=/opt/sglang/venv/bin/python' \
        --change 'ENV PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --message "escha test base: Debian bookworm, python3 and an empty venv at /opt/sglang/venv" \
        "$tmp/base.tar" "$debian" >/dev/null
    rm -f "$tmp/base.tar"
fi

# the wheel's layer: installed from a read-only mount (nothing of the wheel file stays in the
# image), no network, then committed over the Debian layer with its settings kept
mkdir "$tmp/wheel"
cp "$wheel" "$tmp/wheel/"
docker run --name "$container" --network none -v "$tmp/wheel:/tmp/wheel:ro" "$debian" /bin/sh -c \
    "/opt/sglang/venv/bin/pip install --quiet --no-deps --no-index --disable-pip-version-check '/tmp/wheel/$whl'"
docker commit --change 'CMD ["/bin/bash"]' \
    --message "escha test base: Debian bookworm + sglang from $whl (no dependencies)" \
    "$container" "$name" >/dev/null
echo "$name"

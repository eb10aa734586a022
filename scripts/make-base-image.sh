#!/usr/bin/env bash
# Make the local Debian test base image for Dockerfile.hicache: Debian bookworm from
# mmdebstrap, imported with `docker import` (no image registry is reachable here), with
# sglang installed WITHOUT dependencies from a wheel downloaded on the host into a virtual
# environment at /opt/sglang/venv (Debian's Python refuses pip installs into itself, PEP 668).
#
#   scripts/make-base-image.sh WHEEL [NAME]
#     WHEEL  sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl (bookworm's Python is 3.11)
#     NAME   image name, default escha-sglang-base:0.5.19-bookworm
#
# The image sets ESCHA_SGLANG_PYTHON=/opt/sglang/venv/bin/python, which tells escha-deploy where
# SGLang's interpreter is, and puts that venv first on PATH, so `python3` is SGLang's Python as
# in the official image (the launch spec runs `python3 -m sglang.launch_server`). Not a runnable server: SGLang's
# dependencies (torch, ...) are left out on purpose; the image is the base the series is
# applied to and verified against, in CI. Needs root, mmdebstrap and a running dockerd.
set -euo pipefail
wheel="${1:?usage: $0 WHEEL [NAME]}"
name="${2:-escha-sglang-base:0.5.19-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ -f "$wheel" ] || { echo "no such wheel: $wheel" >&2; exit 2; }
command -v mmdebstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$wheel" "$tmp/"
whl="$(basename "$wheel")"

mmdebstrap --quiet --variant=apt \
    --include=python3,python3-venv,ca-certificates \
    --customize-hook="mkdir -p \"\$1/tmp/wheel\" && cp '$tmp/$whl' \"\$1/tmp/wheel/\"" \
    --customize-hook='chroot "$1" python3 -m venv /opt/sglang/venv' \
    --customize-hook="chroot \"\$1\" /opt/sglang/venv/bin/pip install --quiet --no-deps --no-index --disable-pip-version-check '/tmp/wheel/$whl'" \
    --customize-hook='rm -rf "$1/tmp/wheel" "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
    bookworm "$tmp/base.tar" "$mirror"

docker import \
    --change 'ENV ESCHA_SGLANG_PYTHON=/opt/sglang/venv/bin/python' \
    --change 'ENV PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "escha test base: Debian bookworm + sglang from $whl (no dependencies)" \
    "$tmp/base.tar" "$name" >/dev/null
echo "$name"

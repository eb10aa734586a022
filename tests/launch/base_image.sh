#!/usr/bin/env bash
# Make the local Debian base image NAME (default escha-test-base:bookworm) when it is absent:
# mmdebstrap + docker import (no registry is reachable here). A minimal
# stand-in for issue 3's base-image script until that lands; prefer that one.
set -euo pipefail
name="${1:-escha-test-base:bookworm}"
docker image inspect "$name" >/dev/null 2>&1 && exit 0
command -v mmdebstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq mmdebstrap >/dev/null; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mmdebstrap --quiet --variant=apt --include=python3,ca-certificates bookworm "$tmp/base.tar" http://deb.debian.org/debian
docker import "$tmp/base.tar" "$name" >/dev/null

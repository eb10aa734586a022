#!/usr/bin/env bash
# Start a Docker daemon for the launch tests when none answers (idempotent), and wait for its
# socket: .ci/dockerd.sh when the checkout has it, else a plain start with the same environment rule.
set -euo pipefail
if [ -x "$(dirname "$0")/../../.ci/dockerd.sh" ]; then exec "$(dirname "$0")/../../.ci/dockerd.sh"; fi
if docker info >/dev/null 2>&1; then exit 0; fi
command -v dockerd >/dev/null || { apt-get update -qq && apt-get install -y -qq docker.io docker-compose >/dev/null; }
# not this test session's own folders (XDG_RUNTIME_DIR is removed at its exit; runc keeps files there)
env -u XDG_RUNTIME_DIR -u XDG_CACHE_HOME -u TMPDIR nohup dockerd >/tmp/dockerd.log 2>&1 &
for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && exit 0; sleep 0.5; done
echo "dockerd did not answer within 30 s; see /tmp/dockerd.log" >&2
exit 1

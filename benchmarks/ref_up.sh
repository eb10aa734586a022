#!/usr/bin/env bash
# Reference for `up` to ready: `docker run -d` of the same image with the same port, then poll
# GET /health and POST /generate every 0.1 s until both answer 200 (the harness removes the
# container between runs, outside the timing). The stand-in image runs its server as
# `escha-deploy serve`, the entrypoint `up` gives it. Usage: ref_up.sh IMAGE PORT NAME
set -euo pipefail
image=$1 port=$2 name=$3
docker run -d --name "$name" -p "127.0.0.1:$port:$port" --entrypoint escha-deploy "$image" serve >/dev/null
url="http://127.0.0.1:$port"
body='{"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}'
for _ in $(seq 1 600); do
  h=$(curl -s -o /dev/null -w '%{http_code}' "$url/health" || true)
  if [ "$h" = 200 ]; then
    g=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" \
        "$url/generate" || true)
    [ "$g" = 200 ] && exit 0
  fi
  sleep 0.1
done
echo "ref_up.sh: not ready within 60 s" >&2
exit 1

#!/usr/bin/env bash
# Start Debian's dockerd (package docker.io) in the background, as root, and wait for its socket;
# or, at a run's end, stop it if this script started it and no other run still uses it.
# Idempotent and safe to call twice, and from several runs at once (two clones of the suite side
# by side share one daemon):
#
#   .ci/dockerd.sh [start]   # default: start (or reuse) the daemon; register the calling run
#   .ci/dockerd.sh stop      # unregister the calling run; stop the daemon only when this script
#                            # started it and no live run is registered
#
# A run is the calling process ($PPID: .ci/test's shell, or the pytest process of the launch
# tests' fixture), registered as /run/escha-dockerd.d/<pid> while it is alive; a run that died
# without `stop` is pruned by the next call. A daemon this script did not start (one that already
# answered) is never stopped. State: /run/escha-dockerd.pid (the daemon we started), the run
# folder, one lock (flock) around each call; log in /tmp/escha-dockerd.log.
set -euo pipefail
mode="${1:-start}"
state="${ESCHA_DOCKERD_STATE:-/run}"  # tests/test_ci_dockerd.py points it at a folder of its own
pidfile="$state/escha-dockerd.pid"
runs="$state/escha-dockerd.d"
log=/tmp/escha-dockerd.log
caller="${ESCHA_DOCKERD_CALLER:-$PPID}"

mkdir -p "$runs"
exec 9>"$state/escha-dockerd.lock"
flock 9  # one call at a time: a start and another run's stop never interleave

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
prune() {  # drop runs whose process is gone
  local f
  for f in "$runs"/*; do
    [ -e "$f" ] || continue
    kill -0 "$(basename "$f")" 2>/dev/null || rm -f "$f"
  done
}

case "$mode" in
start)
    prune
    : > "$runs/$caller"
    if answers; then exit 0; fi
    if ! command -v dockerd >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
    fi
    # a daemon we started earlier that is still coming up: just wait for it
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        :
    else
        rm -f /var/run/docker.pid
        # setsid: the daemon outlives the calling shell; --data-root stays Debian's default
        # 9>&-: the daemon must not inherit the lock, or every later call waits for it forever
        # env -u: not the calling run's own folders. A test session points XDG_RUNTIME_DIR at a
        # folder of its own that it removes at exit (tests/session_state.py); runc keeps its exec
        # files under XDG_RUNTIME_DIR, so a daemon started from one session broke every
        # `docker exec` and container start of the runs after it ("OCI runtime exec failed: open
        # /dev/shm/escha-test-...-run-.../runc-process...: no such file or directory")
        env -u XDG_RUNTIME_DIR -u XDG_CACHE_HOME -u TMPDIR \
            setsid dockerd --host unix:///var/run/docker.sock >"$log" 2>&1 < /dev/null 9>&- &
        echo $! > "$pidfile"
    fi
    for _ in $(seq 1 120); do
        if answers; then exit 0; fi
        if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            echo "dockerd exited; last lines of $log:" >&2; tail -n 20 "$log" >&2; exit 1
        fi
        sleep 0.5
    done
    echo "dockerd did not answer within 60 s; see $log" >&2
    exit 1
    ;;
stop)
    rm -f "$runs/$caller"
    prune
    if compgen -G "$runs/*" >/dev/null; then
        echo "dockerd: still used by run(s) $(ls "$runs" | tr '\n' ' ')- not stopping it" >&2
        exit 0
    fi
    [ -s "$pidfile" ] || exit 0  # not started by this script: not ours to stop
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$pidfile"
    ;;
*)
    echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac

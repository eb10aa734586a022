#!/usr/bin/env bash
# Start Debian's dockerd (package docker.io) in the background, as root, and wait for its socket;
# or stop the one this script started. Idempotent and safe to call twice: `start` returns at once
# when a daemon already answers, `stop` only ends the daemon whose pid this script recorded.
#
#   .ci/dockerd.sh [start]   # default
#   .ci/dockerd.sh stop      # cleanup (CI's EXIT trap)
#
# State: /run/escha-dockerd.pid (the daemon we started), log in /tmp/escha-dockerd.log.
set -euo pipefail
mode="${1:-start}"
pidfile=/run/escha-dockerd.pid
log=/tmp/escha-dockerd.log

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

case "$mode" in
start)
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
        setsid dockerd --host unix:///var/run/docker.sock >"$log" 2>&1 < /dev/null &
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
    [ -s "$pidfile" ] || exit 0
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

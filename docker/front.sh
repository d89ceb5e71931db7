#!/bin/sh
# Entry point of the compose `front` service: run "$@" (haproxy -W -db -f <repository>/haproxy.cfg)
# and end it once the network namespace it shares with the triton service is gone.
#
# The front joins the triton container's network namespace (network_mode: "service:triton").
# When the triton container restarts (its supervisor stops a server whose models stopped
# answering, or tritonserver exits), Docker and Podman give it a new namespace and leave this
# container in the old one, which keeps only its loopback: nothing reaches HAProxy any more and
# HAProxy reaches no tritonserver. Compose restarts dependants only for its own commands
# (`depends_on: {restart: true}`), never for a restart the engine makes, so this script checks
# every FRONT_NETNS_CHECK_S seconds (default 2) that an interface other than `lo` is still there;
# when none is, it stops HAProxy gracefully and exits 1, and the service's restart policy starts
# the container again, in the triton container's new namespace.
#
# SIGUSR1 or SIGTERM (compose's stop_signal is SIGUSR1, as the official image's STOPSIGNAL) stop
# HAProxy gracefully: it stops listening and finishes the requests it holds.
set -u
[ $# -gt 0 ] || { echo "usage: $0 haproxy ARGS..." >&2; exit 2; }
interval="${FRONT_NETNS_CHECK_S:-2}"

# True while this network namespace has an interface other than the loopback.
connected() { tail -n +3 /proc/net/dev | grep -qv '^ *lo:'; }

watch=1
if ! connected; then  # not in a namespace of its own making (network_mode none?): nothing to watch
    echo "front: no network interface but lo at start: not watching for a restarted triton" >&2
    watch=0
fi
"$@" &
child=$!
stopping=""
trap 'stopping=1; kill -USR1 "$child" 2>/dev/null' USR1 TERM INT
while [ -z "$stopping" ] && kill -0 "$child" 2>/dev/null; do
    if [ "$watch" = 1 ] && ! connected; then
        echo "front: the network namespace shared with triton is gone (the triton container" \
             "restarted): stopping HAProxy so the restart policy joins the new one" >&2
        kill -USR1 "$child" 2>/dev/null
        wait "$child"
        exit 1
    fi
    sleep "$interval" &
    wait $! 2>/dev/null  # a signal ends the wait at once
done
# HAProxy's own exit status once it has finished (a signal interrupts wait: wait again)
while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || exit "$code"
done

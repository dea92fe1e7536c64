#!/usr/bin/env bash
# down.sh — stop every service up.sh started (by the pid files in run/; never
# by process name), in reverse start order. Data is kept unless --purge, which
# removes the whole work dir ($HVG_OS_WORKDIR, default /var/tmp/hvguard-e2e).
#
#   down.sh [--purge]
set -euo pipefail
SCRIPT=down.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
purge=0
case "${1:-}" in
--purge) purge=1 ;;
"") ;;
*) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac
[[ -d "$W" ]] || { log "nothing to do: $W does not exist"; exit 0; }
# OpenStack services in parallel (each waits up to 30 s, then SIGKILL), then
# RabbitMQ, MariaDB and epmd.
pids=()
for s in "${SERVICES[@]}"; do
	case "$s" in mariadb | rabbitmq) continue ;; esac
	stop_service "$s" 30 &
	pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
stop_service rabbitmq 30
stop_service mariadb 60
stop_service epmd 10
if ((purge)); then
	rm -rf "$W"
	log "removed $W"
fi
log "down in $(elapsed) s"

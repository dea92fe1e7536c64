#!/usr/bin/env bash
# ctl.sh — start/stop ONE harness service (for tests: "nova-compute on node1
# died", "Nova API stopped mid-reconcile"). Used by the Go helper osharness.
#
#   ctl.sh stop  NAME      SIGTERM (SIGKILL after 30 s) by its pid file
#   ctl.sh kill  NAME      SIGKILL at once
#   ctl.sh start NAME      start and wait (bounded, $HVG_OS_WAIT, default 180 s)
#   ctl.sh status          one line per service: NAME running PID | stopped
#
# NAME: mariadb rabbitmq keystone placement glance neutron-standin nova-conductor
#       nova-scheduler nova-api cinder-scheduler cinder-volume cinder-api
#       nova-compute-node1 nova-compute-node2 masakari-api masakari-engine
# (masakari-*: its database and segment come from HVG_OS_MASAKARI=1 up.sh)
# A started nova-compute counts as ready once its service record was refreshed
# after the start (it may stay forced down, so "state up" is not required).
set -euo pipefail
SCRIPT=ctl.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
WAIT="${HVG_OS_WAIT:-180}"
usage() { echo "usage: $0 start|stop|kill NAME | status" >&2; exit 2; }
known() { local s; for s in "${SERVICES[@]}"; do [[ "$s" == "$1" ]] && return 0; done; return 1; }

case "${1:-}" in
status)
	for s in "${SERVICES[@]}"; do
		if p="$(pid_of "$s")"; then echo "$s running $p"; else echo "$s stopped"; fi
	done
	;;
stop | kill)
	if [[ $# != 2 ]] || ! known "$2"; then usage; fi
	if [[ "$1" == kill ]]; then stop_service "$2" 0; else stop_service "$2" 30; fi
	;;
start)
	if [[ $# != 2 ]] || ! known "$2"; then usage; fi
	if [[ "$2" == masakari-* && ! -e "$DATA/.synced-masakari" ]]; then
		die "Masakari is not set up in $W: run HVG_OS_MASAKARI=1 up.sh"
	fi
	since="$(date -u +%Y-%m-%dT%H:%M:%S)"
	start_service "$2"
	case "$2" in
	nova-compute-*)
		FAIL_LOGS=("$LOGD/$2.log")
		wait_for "$WAIT" "$2 to report to nova" osctl compute-reported "${2#nova-compute-}" "$since"
		;;
	*) wait_service "$2" "$WAIT" ;;
	esac
	log "$2 ready"
	;;
*) usage ;;
esac

#!/usr/bin/env bash
# restart.sh — disturb the system libvirtd the way tests need, then (for the
# kill variants) start it again with start.sh.
#
# Usage: restart.sh [term|kill|stop|cont]
#   term  (default) SIGTERM, wait for exit, start.sh
#   kill  SIGKILL (crash), wait for exit, start.sh
#   stop  SIGSTOP: the daemon hangs (keepalive must notice); NOT restarted
#   cont  SIGCONT: resume a daemon hung with "stop"
#
# The daemon is found through /run/libvirtd.pid only. Note that the
# daemon-side test driver (test+unix:///default) is reset to its defaults by
# a restart, and that other users of this host's libvirtd see the outage.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly MODE="${1:-term}"
T0="$(date +%s%N)"
readonly T0
elapsed() { local now; now="$(date +%s%N)"; printf '%d.%d' $(((now - T0) / 1000000000)) $((((now - T0) / 100000000) % 10)); }
log() { printf '[restart.sh +%ss] %s\n' "$(elapsed)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

[[ "$(id -u)" == 0 ]] || die "must run as root"

pid=""
if [[ -r /run/libvirtd.pid ]]; then
	pid="$(tr -dc '0-9' </run/libvirtd.pid)"
	if [[ -z "$pid" || ! -r "/proc/$pid/comm" || "$(cat "/proc/$pid/comm")" != libvirtd ]]; then
		pid=""
	fi
fi

case "$MODE" in
term | kill)
	if [[ -n "$pid" ]]; then
		sig="${MODE^^}"
		log "SIG$sig libvirtd (pid $pid)"
		kill "-$sig" "$pid"
		kill -CONT "$pid" 2>/dev/null || true
		for ((i = 0; i < 150; i++)); do
			[[ -d "/proc/$pid" ]] || break
			sleep 0.1
		done
		[[ ! -d "/proc/$pid" ]] || die "libvirtd (pid $pid) did not exit after SIG$sig"
		log "libvirtd exited"
	else
		log "libvirtd not running"
	fi
	"$HERE/start.sh"
	;;
stop)
	[[ -n "$pid" ]] || die "libvirtd not running"
	kill -STOP "$pid"
	log "libvirtd (pid $pid) stopped (SIGSTOP); resume with: $0 cont"
	;;
cont)
	[[ -n "$pid" ]] || die "libvirtd not running"
	kill -CONT "$pid"
	log "libvirtd (pid $pid) continued (SIGCONT)"
	;;
*)
	die "unknown mode '$MODE' (want term|kill|stop|cont)"
	;;
esac

#!/usr/bin/env bash
# stop.sh — stop the system libvirtd started by start.sh (SIGTERM, then
# SIGKILL after a bounded wait). Running QEMU guests are NOT touched: a new
# libvirtd reattaches to them. With --all, virtlogd is stopped too (only do
# that when no guest is running: it holds their console logs).
#
# Usage: stop.sh [--all]
# Idempotent: a daemon that is not running is not an error.
set -euo pipefail

T0="$(date +%s%N)"
readonly T0
elapsed() { local now; now="$(date +%s%N)"; printf '%d.%d' $(((now - T0) / 1000000000)) $((((now - T0) / 100000000) % 10)); }
log() { printf '[stop.sh +%ss] %s\n' "$(elapsed)" "$*"; }

# pid_alive FILE: prints the pid in FILE if it names a live process whose
# comm matches the pid file's basename.
pid_alive() {
	local file="$1" name pid
	name="$(basename "$file" .pid)"
	[[ -r "$file" ]] || return 1
	pid="$(tr -dc '0-9' <"$file")"
	[[ -n "$pid" && -r "/proc/$pid/comm" ]] || return 1
	[[ "$(cat "/proc/$pid/comm")" == "$name" ]] || return 1
	echo "$pid"
}

# stop_daemon PIDFILE: TERM (plus CONT, in case it was SIGSTOPped), wait up
# to 15 s, then KILL.
stop_daemon() {
	local file="$1" name pid i
	name="$(basename "$file" .pid)"
	if ! pid="$(pid_alive "$file")"; then
		log "$name not running"
		return 0
	fi
	log "stopping $name (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	kill -CONT "$pid" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		[[ -d "/proc/$pid" ]] || { log "$name stopped"; return 0; }
		sleep 0.1
	done
	log "$name did not exit after SIGTERM: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		[[ -d "/proc/$pid" ]] || { log "$name killed"; return 0; }
		sleep 0.1
	done
	log "ERROR: $name (pid $pid) still alive" >&2
	return 1
}

[[ "$(id -u)" == 0 ]] || { echo "stop.sh: must run as root" >&2; exit 1; }

stop_daemon /run/libvirtd.pid
if [[ "${1:-}" == --all ]]; then
	stop_daemon /run/virtlogd.pid
fi

#!/usr/bin/env bash
# start.sh — make a real system libvirtd (plus virtlogd) answer on this host,
# without systemd. Idempotent; meant for a fresh Debian 12 run as root (CI).
#
#   1. installs libvirt + QEMU with apt if any piece is missing
#      (one `apt-get update`, then `apt-get install --no-install-recommends`);
#   2. sends SIGCONT to a daemon left stopped (SIGSTOP) by a test;
#   3. starts `virtlogd -d` and `libvirtd -d` if they are not running
#      (with max_client_requests = 20 in libvirtd.conf: see below);
#   4. waits (bounded) until `virsh -c qemu:///system version` and
#      `virsh -c test+unix:///default list` answer.
#
# Environment:
#   HVG_LIBVIRTD_WAIT   seconds to wait for the daemon to answer (default 120;
#                       the first qemu:///system call after install probes
#                       QEMU's capabilities, which takes 15-60 s on 2 busy cores)
#
# Only the system daemon is touched: it is found through /run/libvirtd.pid,
# never by process name (tests run private session libvirtds of their own).
set -euo pipefail

readonly WAIT_SECS="${HVG_LIBVIRTD_WAIT:-120}"
readonly APT_LOG="${TMPDIR:-/tmp}/hvguard-libvirtd-apt.log"
readonly PKGS=(libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86)
readonly BINS=(/usr/sbin/libvirtd /usr/sbin/virtlogd /usr/bin/virsh /usr/bin/qemu-system-x86_64)
T0="$(date +%s%N)"
readonly T0

# elapsed prints seconds since the script started, with one decimal.
elapsed() { local now; now="$(date +%s%N)"; printf '%d.%d' $(((now - T0) / 1000000000)) $((((now - T0) / 100000000) % 10)); }
log() { printf '[start.sh +%ss] %s\n' "$(elapsed)" "$*"; }
die() { printf '[start.sh +%ss] ERROR: %s\n' "$(elapsed)" "$*" >&2; exit 1; }

# pid_alive FILE: prints the pid in FILE and succeeds if that process exists
# and is the daemon named in FILE (guards against stale pid files).
pid_alive() {
	local file="$1" name pid
	name="$(basename "$file" .pid)"
	[[ -r "$file" ]] || return 1
	pid="$(tr -dc '0-9' <"$file")"
	[[ -n "$pid" && -r "/proc/$pid/comm" ]] || return 1
	[[ "$(cat "/proc/$pid/comm")" == "$name" ]] || return 1
	echo "$pid"
}

[[ "$(id -u)" == 0 ]] || die "must run as root (starts the system libvirtd)"

missing=0
for b in "${BINS[@]}"; do
	[[ -x "$b" ]] || { log "missing $b"; missing=1; }
done
if ((missing)); then
	log "installing: ${PKGS[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# Other jobs on a shared host may hold the dpkg lock: wait for it.
	# Output goes to a log file (it is long); its tail is shown on failure.
	if ! apt-get -o DPkg::Lock::Timeout=600 update -q >"$APT_LOG" 2>&1; then
		tail -n 30 "$APT_LOG" >&2
		die "apt-get update failed (full log: $APT_LOG)"
	fi
	if ! apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${PKGS[@]}" >>"$APT_LOG" 2>&1; then
		tail -n 30 "$APT_LOG" >&2
		die "apt-get install failed (full log: $APT_LOG)"
	fi
	for b in "${BINS[@]}"; do
		[[ -x "$b" ]] || die "$b still missing after install"
	done
	log "installed"
else
	log "libvirt and QEMU already installed"
fi

# Runtime directories that systemd/tmpfiles would normally create.
mkdir -p /run/libvirt /var/log/libvirt/qemu /var/lib/libvirt/qemu

# Without udev, /dev/kvm stays root:root 0600. libvirt then finds KVM
# "no longer accessible" for the libvirt-qemu user on every lookup of the
# cached QEMU capabilities and re-probes QEMU each time: measured 44 s per
# virDomainDefineXML, 4 s per `virsh version`. Apply udev's rule by hand
# (group kvm, 0660). Guests here use TCG either way.
if [[ -c /dev/kvm ]] && getent group kvm >/dev/null; then
	if [[ "$(stat -c '%G %a' /dev/kvm)" != "kvm 660" ]]; then
		log "fixing /dev/kvm ownership (root:kvm 0660, as udev would)"
		chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
	fi
fi

# nofd CMD...: runs CMD with every fd above 2 closed. Callers hold
# `flock /tmp/hvg-e2e.lock` around the e2e runs (test/e2e/classify/run.sh):
# a daemon that inherited that fd keeps the lock held for as long as it runs
# (seen: libvirtd and virtlogd started by one storm run blocked every later
# user of the cloud).
nofd() {
	(
		for fd in /proc/$BASHPID/fd/*; do
			fd="${fd##*/}"
			((fd > 2)) && eval "exec $fd>&-"
		done
		exec "$@"
	)
}

if pid="$(pid_alive /run/virtlogd.pid)"; then
	log "virtlogd already running (pid $pid)"
else
	log "starting virtlogd"
	nofd /usr/sbin/virtlogd -d || die "virtlogd -d failed"
fi

if pid="$(pid_alive /run/libvirtd.pid)"; then
	if [[ "$(awk '{print $3}' "/proc/$pid/stat")" == T ]]; then
		log "libvirtd (pid $pid) is stopped: sending SIGCONT"
		kill -CONT "$pid"
	else
		log "libvirtd already running (pid $pid)"
	fi
else
	# 15 concurrent Nova hard reboots (the e2e storm) exceed libvirtd's
	# default of 5 concurrent requests per client; libvirtd then delays the
	# client's keepalive answers and drops nova-compute's connection ("Client
	# hit max requests limit 5", then "keepalive timeout": the rebooted
	# server goes to ERROR; seen once at load ~37). libvirtd.conf warns that
	# "setting this too low may cause keepalive timeouts": raise it to 20
	# (= max_workers) before the daemon starts (a running daemon keeps its
	# configuration; CI starts it fresh).
	conf=/etc/libvirt/libvirtd.conf
	if [[ -w "$conf" ]] && ! grep -q '^max_client_requests *= *20$' "$conf"; then
		sed -i '/^max_client_requests *=/d' "$conf"
		echo 'max_client_requests = 20  # hvguard test/libvirtd/start.sh' >>"$conf"
		log "set max_client_requests = 20 in $conf"
	fi
	log "starting libvirtd"
	nofd /usr/sbin/libvirtd -d || die "libvirtd -d failed (see /var/log/libvirt or run 'libvirtd -v' by hand)"
fi

# Overall deadline shared by all waits below.
readonly DEADLINE=$(($(date +%s) + WAIT_SECS))

# wait_for DESC CMD...: retry CMD until it succeeds or the deadline passes.
# Each try is bounded by the time left: `virsh version` on qemu:///system
# takes ~4 s even when warm (it checks QEMU), much longer while the daemon
# probes QEMU capabilities for the first time.
wait_for() {
	local desc="$1" deadline="$DEADLINE" out left
	shift
	while :; do
		left=$((deadline - $(date +%s)))
		((left > 1)) || left=1
		if out="$(timeout -k 2 "$left" "$@" 2>&1)"; then
			log "$desc answers"
			return 0
		fi
		if (($(date +%s) >= deadline)); then
			die "$desc did not answer within ${WAIT_SECS}s; last output: $out"
		fi
		sleep 0.2
	done
}

wait_for "test+unix:///default" virsh -c test+unix:///default list
wait_for "qemu:///system" virsh -c qemu:///system version
log "ready (libvirtd pid $(pid_alive /run/libvirtd.pid || echo '?'))"

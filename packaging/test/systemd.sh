#!/bin/bash
# The packaged unit under a real systemd: boots the cached Debian 12 root
# with systemd as PID 1 of private PID/mount/network namespaces (unshare +
# pivot_root; needs root and a mountable cgroup2, no VM, no network), with
# libvirtd running in it, then checks what the unit promises:
#   - dpkg -i under a running systemd: enabled, not started;
#   - the sandbox (ProtectSystem=strict, CapabilityBoundingSet=, seccomp, …)
#     lets the agent reach libvirtd's socket /run/libvirt/libvirt-sock, write
#     /var/lib/hvguard and listen on 127.0.0.1:9475; Type=notify READY/STATUS;
#   - WatchdogSec: a frozen agent is aborted (goroutine dump) and restarted;
#   - upgrade restarts a running agent; stop is clean and within TimeoutStopSec;
#   - remove stops it, purge removes the state.
# libvirtd serves its built-in test driver (URI test+unix:///default): real
# socket, real RPC, no QEMU. NATS is deliberately unreachable (degraded mode).
# Usage: packaging/test/systemd.sh NAME... (make package-test)
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly DIST=${DIST:-dist}
readonly ROOT=$PWD/$DIST/test/sdroot
# shellcheck source=packaging/test/lib.sh
source packaging/test/lib.sh

# The unit's WatchdogSec (checked against the unit below); the watchdog test
# waits up to this plus a margin for systemd to act.
readonly WATCHDOG_SEC=30
# How long to wait for units to settle.
readonly SETTLE_SEC=60

version=$(cat "$DIST/VERSION") # written by build.sh
arch=$(dpkg --print-architecture)
init_pid=

boot() {
	local boot=$DIST/test/boot.sh
	cat >"$boot" <<-'SH'
		#!/bin/bash
		# Runs as PID 1's parent-to-be inside `unshare --pid --mount --fork`.
		set -euo pipefail
		root=$1
		ip link set lo up # own network namespace: only loopback, no clash with the host's ports
		mount --make-rprivate /
		mount --bind "$root" "$root" # systemd's namespacing needs / to be a mount point
		mount -t proc proc "$root/proc"
		mount -t sysfs sysfs "$root/sys"
		mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup"
		mount --rbind /dev "$root/dev"
		mount -t tmpfs tmpfs "$root/run"
		mount -t tmpfs tmpfs "$root/tmp"
		cd "$root"
		mkdir -p .oldroot
		pivot_root . .oldroot
		exec env -i container=hvguard-test /bin/sh -c \
			'umount -l /.oldroot && rmdir /.oldroot && exec /lib/systemd/systemd --system --log-target=journal'
	SH
	chmod +x "$boot"
	unshare --pid --mount --uts --ipc --net --fork "$boot" "$ROOT" >"$DIST/test/boot.log" 2>&1 &
	local unshare_pid=$!
	for _ in $(seq 1 50); do
		init_pid=$(ps -o pid= --ppid "$unshare_pid" | tr -d ' ' || true)
		[[ -n "$init_pid" ]] && break
		sleep 0.1
	done
	[[ -n "$init_pid" ]] || { cat "$DIST/test/boot.log"; fail "systemd did not start"; }
	# Wait for boot to finish (degraded is fine: some units need hardware).
	for _ in $(seq 1 "$SETTLE_SEC"); do
		state=$(in_root systemctl is-system-running 2>/dev/null || true)
		[[ "$state" == running || "$state" == degraded ]] && return 0
		sleep 1
	done
	fail "boot did not finish (state: ${state:-unknown})"
}
shutdown_root() {
	if [[ -n "$init_pid" ]]; then
		kill -KILL "$init_pid" 2>/dev/null || true # PID 1 of the namespace: takes the rest with it
		init_pid=
		sleep 1
	fi
}
trap shutdown_root EXIT

in_root() { nsenter --target "$init_pid" --mount --pid --net --root --wd env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C "$@"; }
# journal UNIT: the unit's messages (captured, not piped into grep -q: with
# pipefail an early-exiting grep fails the pipeline through SIGPIPE).
journal() { in_root journalctl -u "$1" --no-pager -o cat; }
prop() { in_root systemctl show "$1" -p "$2" --value; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
	local secs=$1 what=$2
	shift 2
	for _ in $(seq 1 "$secs"); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
	done
	fail "timed out after ${secs}s waiting for: $what"
}
http_get() { # http_get PATH: body of http://127.0.0.1:9475/PATH inside the root (bash /dev/tcp)
	# shellcheck disable=SC2016 # $1 is expanded by the inner bash
	in_root bash -c 'exec 3<>/dev/tcp/127.0.0.1/9475 && printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3 && cat <&3' _ "$1"
}

# Preflight: private namespaces and a cgroup2 mount (systemd needs one).
probe=$(mktemp -d)
if ! unshare --mount --pid --net --fork sh -c "mount -t cgroup2 cgroup2 '$probe'" 2>/dev/null; then
	rmdir "$probe"
	fail "cannot create namespaces or mount cgroup2 here (needs root with CAP_SYS_ADMIN, e.g. a VM runner, not an unprivileged container); make package-test PKG_SKIP_SYSTEMD_TEST=1 skips this test"
fi
rmdir "$probe"

for name in "$@"; do
	unit=$name.service
	deb=$DIST/${name}_${version}_${arch}.deb
	[[ -f "$deb" ]] || fail "$deb missing: run make package"
	updeb=$(upgrade_deb "$name" "$version")
	grep -qx "WatchdogSec=${WATCHDOG_SEC}s" packaging/systemd/"$unit" || fail "WATCHDOG_SEC differs from the unit"

	step "$name: booting the root with systemd as PID 1"
	shutdown_root
	fresh_root "$ROOT"
	boot
	echo "booted: $(in_root systemctl is-system-running || true), $(in_root systemctl is-active libvirtd.socket) libvirtd.socket"

	step "$name: dpkg -i under a running systemd: enabled, not started"
	cp "$deb" "$ROOT/root/v1.deb" # not /tmp: a tmpfs inside
	cp "$updeb" "$ROOT/root/v2.deb"
	in_root dpkg -i /root/v1.deb >/dev/null
	[[ "$(in_root systemctl is-enabled "$unit")" == enabled ]] || fail "not enabled"
	[[ "$(in_root systemctl is-active "$unit" || true)" == inactive ]] || fail "started on first install"

	step "$name: systemd-analyze verify and security (inside the root)"
	in_root systemd-analyze verify --man=no "/lib/systemd/system/$unit" # no man-db in the root
	in_root systemd-analyze security --no-pager "$unit" | tail -n1

	step "$name: start through libvirtd's socket, NATS unreachable (degraded)"
	cat >"$ROOT/etc/hvguard/agent.yaml" <<-'YAML'
		libvirt:
		  uri: test+unix:///default    # libvirtd's test driver via /run/libvirt/libvirt-sock
		nats:
		  urls: [nats://127.0.0.1:1]   # nothing listens: degraded mode
		  ready_timeout: 2s
	YAML
	in_root hvguard-agent --check-config
	in_root systemctl start "$unit" # Type=notify: returns once READY=1 is sent
	in_root systemctl is-active "$unit" >/dev/null || fail "not active after start"
	# READY=1 carries "degraded: libvirt connected, …"; the event loop's
	# first heartbeat (≤ 1 s later) replaces it with the "libvirt up, …"
	# summary. Wait for that rather than race it.
	for _ in $(seq 50); do
		status=$(prop "$unit" StatusText)
		[[ "$status" == *"libvirt up"* ]] && break
		sleep 0.1
	done
	echo "STATUS=$status"
	[[ "$status" == *"libvirt up"* ]] || fail "agent not connected to libvirt under the sandbox"
	http_get /healthz | tail -n1
	grep -q '^hvguard_libvirt_connected 1' <<<"$(http_get /metrics)" || fail "metrics: libvirt not connected"
	in_root test -f /var/lib/hvguard/domains.json || fail "agent did not write its state"
	[[ "$(in_root stat -c %a /var/lib/hvguard)" == 700 ]] || fail "/var/lib/hvguard not 0700"

	step "$name: watchdog: freeze the agent, expect abort + restart within ~${WATCHDOG_SEC}s"
	pid=$(prop "$unit" MainPID)
	in_root sh -c "kill -STOP $pid"
	wait_for $((WATCHDOG_SEC + 20)) "watchdog restart" \
		bash -c "[[ \$(nsenter -t $init_pid -m -p -n -r -w systemctl show $unit -p NRestarts --value) == 1 ]]"
	wait_for "$SETTLE_SEC" "active again" in_root systemctl is-active "$unit"
	log=$(journal "$unit")
	grep -q "Watchdog timeout (limit ${WATCHDOG_SEC}s)" <<<"$log" || fail "no watchdog timeout in the journal"
	grep -q '^SIGABRT: abort' <<<"$log" || fail "no goroutine dump in the journal"
	echo "watchdog fired, stacks dumped, restarted (pid $pid -> $(prop "$unit" MainPID))"

	step "$name: upgrade while running restarts it on the new binary"
	pid=$(prop "$unit" MainPID)
	in_root dpkg -i /root/v2.deb >/dev/null
	wait_for "$SETTLE_SEC" "active after upgrade" in_root systemctl is-active "$unit"
	[[ "$(prop "$unit" MainPID)" != "$pid" ]] || fail "upgrade did not restart the agent"
	grep -qF "\"version\":\"$version+up1\"" <<<"$(journal "$unit")" || fail "the restarted agent is not the new version"

	step "$name: stop is graceful and within TimeoutStopSec"
	start=$SECONDS
	in_root systemctl stop "$unit"
	echo "stopped in $((SECONDS - start))s, result $(prop "$unit" Result), status $(prop "$unit" ExecMainStatus)"
	[[ "$(prop "$unit" Result)" == success ]] || fail "stop did not succeed"

	step "$name: remove stops and keeps state; purge removes it"
	in_root systemctl start "$unit"
	in_root dpkg --remove "$name" >/dev/null
	[[ "$(in_root systemctl is-active "$unit" || true)" != active ]] || fail "remove left the agent running"
	in_root test -f /var/lib/hvguard/domains.json || fail "remove deleted the state"
	in_root dpkg --purge "$name" >/dev/null
	if in_root test -e /var/lib/hvguard; then fail "purge left /var/lib/hvguard"; fi

	shutdown_root
	rm -rf "$ROOT"
done
echo "systemd: OK"

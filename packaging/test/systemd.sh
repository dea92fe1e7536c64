#!/bin/bash
# The packaged unit under a real systemd: boots the cached Debian 12 root
# with systemd as PID 1 of private PID/mount/network namespaces (unshare +
# pivot_root; needs root and a mountable cgroup2, no VM, no network), with
# libvirtd running in it, then checks what the unit promises:
#   - dpkg -i under a running systemd: enabled, not started;
#   - the sandbox (ProtectSystem=strict, CapabilityBoundingSet=, seccomp, …)
#     lets the agent reach libvirtd's socket /run/libvirt/libvirt-sock, write
#     /var/lib/hvguard and listen on 127.0.0.1:9475; Type=notify READY/STATUS;
#     the controller reports READY degraded while NATS is down, then, once a
#     NATS server runs, takes the leader lock (STATUS, `status`, /metrics);
#   - WatchdogSec: a frozen daemon is aborted (goroutine dump) and restarted;
#   - upgrade restarts a running daemon; stop is clean and within TimeoutStopSec
#     (the controller resigns its lock);
#   - journal priorities: the "<N>" prefix is stored as PRIORITY (every JSON
#     line at err/warning/info has that level); the agent, fencing on and
#     NATS unreachable, fences and `journalctl -p err` finds FENCING;
#   - remove stops it, purge removes the state.
# libvirtd serves its built-in test driver (URI test+unix:///default): real
# socket, real RPC, no QEMU. For the agent NATS is deliberately unreachable
# (degraded mode); for the controller a NATS server with JetStream
# (test/natsd: the embedded server of the Go tests) is started in the root.
# Usage: packaging/test/systemd.sh NAME... (make package-test)
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly DIST=${DIST:-dist}
readonly ROOT=$PWD/$DIST/test/sdroot
# shellcheck source=packaging/test/lib.sh
source packaging/test/lib.sh
# shellcheck source=packaging/packages.sh
source packaging/packages.sh

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
http_get() { # http_get PATH: body of http://127.0.0.1:$PKG_PORT/PATH inside the root (bash /dev/tcp)
	# shellcheck disable=SC2016 # $1, $2 are expanded by the inner bash
	in_root bash -c 'exec 3<>/dev/tcp/127.0.0.1/$2 && printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3 && cat <&3' _ "$1" "$PKG_PORT"
}
# wait_status UNIT SECONDS PATTERN: wait until the unit's STATUS= matches
# the glob PATTERN; prints it.
wait_status() {
	local status
	for _ in $(seq $(($2 * 10))); do
		status=$(prop "$1" StatusText)
		# shellcheck disable=SC2053 # $3 is a glob on purpose
		[[ "$status" == $3 ]] && break
		sleep 0.1
	done
	echo "STATUS=$status"
	# shellcheck disable=SC2053
	[[ "$status" == $3 ]]
}

# journal_has UNIT PRIORITY STRING: the unit's journal at PRIORITY or more
# urgent (journalctl -p) holds STRING.
journal_has() { grep -qF -- "$3" <<<"$(in_root journalctl -u "$1" -p "$2" --no-pager -o cat)"; }

# check_priorities UNIT: the daemon's JSON lines landed at the priority of
# their level (its "<N>" prefix, SyslogLevelPrefix=yes): each at err,
# warning, info exactly has level ERROR, WARN, INFO; info and warning are
# not empty (every start logs both). Non-JSON lines (systemd's own, a
# goroutine dump) are not the daemon's log.
check_priorities() {
	local unit=$1 pl prio level out bad
	for pl in err:ERROR warning:WARN info:INFO; do
		prio=${pl%%:*} level=${pl#*:}
		out=$(in_root journalctl -u "$unit" -p "$prio..$prio" --no-pager -o cat)
		out=$(grep '^{' <<<"$out" || true)
		if [[ -z "$out" && "$prio" != err ]]; then fail "no $level line at priority $prio: the prefix is not parsed"; fi
		bad=$(grep -v "\"level\":\"$level\"" <<<"$out" || true)
		[[ -z "$bad" ]] || fail "at priority $prio, lines of another level: $bad"
		echo "priority $prio: $(grep -c . <<<"$out" || true) $level lines"
	done
}

# fence_hvguard-agent UNIT: fencing on, NATS unreachable: the agent never
# renews its lease, fences (pause, at ERROR) 8 s after start (no lease, no
# guard known), and `journalctl -p err` finds it. Then stopped and set back
# to the configuration without fencing.
fence_hvguard-agent() {
	local unit=$1 conf=$ROOT/etc/hvguard/agent.yaml
	cp "$conf" "$conf.nofence"
	head -c 32 /dev/urandom | base64 >"$ROOT/etc/hvguard/peer-secret"
	chmod 600 "$ROOT/etc/hvguard/peer-secret"
	cat >>"$conf" <<-'YAML'
		fence:
		  enabled: true
		  peer_secret_file: /etc/hvguard/peer-secret
	YAML
	start_unit "$unit"
	wait_for 40 "FENCING in journalctl -p err -u $unit" journal_has "$unit" err 'FENCING: pausing domains'
	if journal_has "$unit" err '"msg":"ready in degraded mode"'; then fail "a WARN line at priority err"; fi
	in_root journalctl -u "$unit" -p err --no-pager -o cat | grep -F FENCING
	in_root systemctl stop "$unit"
	mv "$conf.nofence" "$conf"
}
fence_hvguard-controller() { :; }

# start_unit UNIT: check the configuration just written, start the unit
# (Type=notify: systemctl returns once READY=1 is sent), check it is active.
start_unit() {
	in_root "${1%.service}" --check-config
	in_root systemctl start "$1"
	in_root systemctl is-active "$1" >/dev/null || fail "not active after start"
}

# start_hvguard-agent: start the agent against libvirtd's socket, NATS
# unreachable (degraded), and check what it reports.
start_hvguard-agent() {
	local unit=$1
	cat >"$ROOT/etc/hvguard/agent.yaml" <<-'YAML'
		libvirt:
		  uri: test+unix:///default    # libvirtd's test driver via /run/libvirt/libvirt-sock
		nats:
		  urls: [nats://127.0.0.1:1]   # nothing listens: degraded mode
		  ready_timeout: 2s
	YAML
	start_unit "$unit"
	# READY=1 carries "degraded: libvirt connected, …"; the event loop's
	# first heartbeat (≤ 1 s later) replaces it with the "libvirt up, …"
	# summary. Wait for that rather than race it.
	wait_status "$unit" 5 '*libvirt up*' || fail "agent not connected to libvirt under the sandbox"
	http_get /healthz | tail -n1
	grep -q '^hvguard_libvirt_connected 1' <<<"$(http_get /metrics)" || fail "metrics: libvirt not connected"
	in_root test -f /var/lib/hvguard/domains.json || fail "agent did not write its state"
	[[ "$(in_root stat -c %a /var/lib/hvguard)" == 700 ]] || fail "/var/lib/hvguard not 0700"
	# `hvguard-agent status` asks the sandboxed agent over its socket in
	# RuntimeDirectory (root only): degraded (NATS unreachable) = exit 1.
	local st rc=0
	st=$(in_root hvguard-agent status) || rc=$?
	head -n 4 <<<"$st"
	((rc == 1)) || fail "status: exit $rc, want 1 (degraded: NATS unreachable)"
	grep -q '^source: *the running agent' <<<"$st" || fail "status did not reach the agent over its socket"
	[[ "$(in_root stat -c %a /run/hvguard/agent.sock)" == 600 ]] || fail "/run/hvguard/agent.sock not 0600"
}

# start_hvguard-controller: start the controller with NATS down (READY in
# degraded mode), then a NATS server: it opens the bucket and, after the
# lock's takeover wait (2.04 s at the test's ttl), leads; check STATUS=,
# `status`, /metrics.
start_hvguard-controller() {
	local unit=$1
	cat >"$ROOT/etc/hvguard/controller.yaml" <<-'YAML'
		id: ctl-sd
		nats:
		  urls: [nats://127.0.0.1:4222]   # test/natsd, started below
		  ready_timeout: 2s
		leader:                           # x0.2: takeovers in 2 s, not 10 (the unit is tested, not the timing)
		  ttl: 2s
		  renew_interval: 500ms
		  write_timeout: 500ms
		  act_margin: 500ms
	YAML
	start_unit "$unit"
	wait_status "$unit" 5 'degraded*' || fail "controller not ready (degraded) without NATS"
	in_root systemd-run --quiet --unit=hvg-natsd /usr/local/bin/natsd -listen 127.0.0.1:4222 -store /var/lib/natsd
	local start=$SECONDS
	wait_status "$unit" 30 'LEADER term 1, 0 hosts*' || fail "controller did not lead once NATS was up"
	echo "leading $((SECONDS - start))s after NATS started"
	local out
	out=$(in_root hvguard-controller status)
	echo "$out"
	grep -q '^controller ctl-sd (.*): leader,' <<<"$out" || fail "status: not the leader"
	[[ "$(http_get /healthz | tail -n1)" == ok ]] || fail "/healthz not ok"
	grep -q '^hvguard_controller_leader 1' <<<"$(http_get /metrics)" || fail "metrics: not leader"
	if in_root test -e /var/lib/hvguard; then fail "controller created /var/lib/hvguard"; fi
}

# Preflight: private namespaces and a cgroup2 mount (systemd needs one).
probe=$(mktemp -d)
if ! unshare --mount --pid --net --fork sh -c "mount -t cgroup2 cgroup2 '$probe'" 2>/dev/null; then
	rmdir "$probe"
	fail "cannot create namespaces or mount cgroup2 here (needs root with CAP_SYS_ADMIN, e.g. a VM runner, not an unprivileged container); make package-test PKG_SKIP_SYSTEMD_TEST=1 skips this test"
fi
rmdir "$probe"

# The NATS server the controller's check starts in the root (static: the
# root has no Go).
natsd=$DIST/test/natsd
CGO_ENABLED=0 "${GO:-go}" build -trimpath -o "$natsd" ./test/natsd

for name in "$@"; do
	pkg_facts "$name"
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
	cp "$natsd" "$ROOT/usr/local/bin/natsd"
	in_root dpkg -i /root/v1.deb >/dev/null
	[[ "$(in_root systemctl is-enabled "$unit")" == enabled ]] || fail "not enabled"
	[[ "$(in_root systemctl is-active "$unit" || true)" == inactive ]] || fail "started on first install"

	step "$name: systemd-analyze verify and security (inside the root)"
	in_root systemd-analyze verify --man=no "/lib/systemd/system/$unit" # no man-db in the root
	in_root systemd-analyze security --no-pager "$unit" | tail -n1

	step "$name: start under the sandbox"
	"start_$name" "$unit"

	step "$name: watchdog: freeze it, expect abort + restart within ~${WATCHDOG_SEC}s"
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
	[[ "$(prop "$unit" MainPID)" != "$pid" ]] || fail "upgrade did not restart $name"
	grep -qF "\"version\":\"$version+up1\"" <<<"$(journal "$unit")" || fail "the restarted $name is not the new version"

	step "$name: stop is graceful and within TimeoutStopSec"
	released=0
	if [[ "$name" == hvguard-controller ]]; then
		# The upgraded process leads (its predecessor resigned: ~2 s).
		wait_status "$unit" 20 'LEADER term *' || fail "the upgraded controller does not lead"
		released=$(grep -c '"msg":"leader lock released"' <<<"$(journal "$unit")" || true)
	fi
	start=$SECONDS
	in_root systemctl stop "$unit"
	echo "stopped in $((SECONDS - start))s, result $(prop "$unit" Result), status $(prop "$unit" ExecMainStatus)"
	[[ "$(prop "$unit" Result)" == success ]] || fail "stop did not succeed"
	if [[ "$name" == hvguard-controller ]]; then
		after=$(grep -c '"msg":"leader lock released"' <<<"$(journal "$unit")" || true)
		((after > released)) || fail "the controller did not resign its lock on stop"
	fi

	step "$name: journal priorities (SyslogLevelPrefix): journalctl -p err finds the errors"
	"fence_$name" "$unit"
	check_priorities "$unit"

	step "$name: remove stops and keeps state; purge removes it"
	in_root systemctl start "$unit"
	in_root dpkg --remove "$name" >/dev/null
	[[ "$(in_root systemctl is-active "$unit" || true)" != active ]] || fail "remove left $name running"
	if [[ -n "$PKG_STATE_DIR" ]]; then
		in_root test -f "$PKG_STATE_DIR/domains.json" || fail "remove deleted the state"
	fi
	in_root dpkg --purge "$name" >/dev/null
	if in_root test -e /var/lib/hvguard; then fail "purge left /var/lib/hvguard"; fi

	shutdown_root
	rm -rf "$ROOT"
done
echo "systemd: OK"

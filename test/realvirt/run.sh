#!/usr/bin/env bash
# run.sh — the "real daemon" test tier of hvguard (called by `make
# test-realvirt` and CI). Idempotent; run as root on Debian 12.
#
#   0. libvirt-dev, pkg-config, gcc for the cgo build (apt-get if missing)
#   1. test/libvirtd/start.sh   install (if missing) and start libvirtd
#   2. test/guest/build.sh      build (or reuse) the tiny QEMU/TCG guest
#   3. go test -tags realvirt ./test/realvirt/   (bounded by a timeout)
#
# The system libvirtd is LEFT RUNNING afterwards (other tiers and later runs
# reuse it); set HVG_REALVIRT_STOP_DAEMON=1 to stop it at the end (the
# guests of this tier are always cleaned up by the tests themselves).
#
# Environment:
#   HVG_REALVIRT_TIMEOUT      go test -timeout (default 6m)
#   HVG_REALVIRT_SHORT=1      pass -short (skips the ~25 s SIGSTOP hang test)
#   HVG_REALVIRT_RUN=REGEX    pass -run REGEX
#   HVG_REALVIRT_STOP_DAEMON  see above
#   GO                        go command (default: go)
#
# Exit status: that of go test (or of the failing setup step). The full
# verbose log is written to $TMPDIR/hvguard-realvirt.log and a summary of
# the test results is printed at the end.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
ROOT="$(cd "$HERE/../.." && pwd)"
readonly ROOT
readonly LOG="${TMPDIR:-/tmp}/hvguard-realvirt.log"
readonly GO="${GO:-go}"
T0="$(date +%s)"
readonly T0
log() { printf '[run.sh +%ds] %s\n' "$(($(date +%s) - T0))" "$*"; }

# shellcheck disable=SC2317 # invoked by the EXIT trap
stop_daemon() {
	if [[ "${HVG_REALVIRT_STOP_DAEMON:-0}" == 1 ]]; then
		log "stopping libvirtd (HVG_REALVIRT_STOP_DAEMON=1)"
		"$ROOT/test/libvirtd/stop.sh" || true
	fi
}
trap stop_daemon EXIT

# The tests link libvirtx, a cgo package: it needs libvirt's headers.
if ! pkg-config --exists libvirt 2>/dev/null || ! command -v gcc >/dev/null; then
	log "installing the cgo build dependencies (libvirt-dev pkg-config gcc)"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
		libvirt-dev pkg-config gcc >/dev/null ||
		{ apt-get -o DPkg::Lock::Timeout=600 update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
				libvirt-dev pkg-config gcc >/dev/null; }
fi
command -v "$GO" >/dev/null || { log "ERROR: $GO not found (Go 1.26 is required)"; exit 1; }

log "step 1/3: libvirtd"
"$ROOT/test/libvirtd/start.sh"
log "step 2/3: test guest"
"$ROOT/test/guest/build.sh"

args=(test -tags realvirt -count=1 -v -timeout "${HVG_REALVIRT_TIMEOUT:-6m}")
[[ "${HVG_REALVIRT_SHORT:-0}" == 1 ]] && args+=(-short)
[[ -n "${HVG_REALVIRT_RUN:-}" ]] && args+=(-run "$HVG_REALVIRT_RUN")
args+=(./test/realvirt/)
log "step 3/3: $GO ${args[*]} (full log: $LOG)"
rc=0
(cd "$ROOT" && "$GO" "${args[@]}") >"$LOG" 2>&1 || rc=$?

echo "---- realvirt summary ----"
grep -E '^\s*--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)\b|^panic:' "$LOG" || true
if ((rc != 0)); then
	echo "---- failures (from $LOG) ----"
	grep -B2 -A20 -E '^\s*--- FAIL' "$LOG" | head -n 200 || tail -n 60 "$LOG"
fi
log "done: go test exit status $rc"
exit "$rc"

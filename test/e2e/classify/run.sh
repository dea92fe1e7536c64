#!/usr/bin/env bash
# run.sh — the issue 6 reboot-storm e2e (TestRebootStorm) from a fresh
# Debian 12 machine, as root:
#
#   1. test/e2e/openstack/up.sh            the shared control plane (idempotent)
#   2. test/e2e/openstack/libvirt-compute.sh up   node3, libvirt driver, system
#                                          libvirtd, guest image, flavor lv256
#   3. apt-get install stress-ng           if missing
#   4. go test -tags e2e -run 'TestRebootStorm|TestMasakariInstanceRecovery'
#      ./test/e2e/classify/ (the controller's Masakari mode if the cloud
#      runs Masakari — required with HVG_E2E_MASAKARI=1, as make e2e does —
#      then the storm with the controller's instance recovery and its crash
#      phase; HVG_STORM_RECOVERY=0: the issue 6 storm alone)
#   5. stops node3's nova-compute and the control plane again, but only what
#      this script started (HVG_OS_KEEP=1 keeps both up)
#
# The storm's size comes from the environment (HVG_STORM_GUESTS, _ROUNDS,
# _LOAD, _CUT, _CRASHES; see storm_test.go, recovery_test.go; make e2e:
# 20 guests, 1 round; make bench: 30 guests, 3 rounds; each + the cut round). Prints each phase's
# wall time (the crash phase's in the test's log).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
OS="$REPO/test/e2e/openstack"
GO="${GO:-go}"
[[ "$(id -u)" == 0 ]] || { echo "run.sh: must run as root (libvirtd, nova-compute, packages)" >&2; exit 1; }

# (captured first: with pipefail, grep -q closing the pipe early would make
# a running cloud look stopped, and teardown would stop a cloud others use)
was_up=0 lv_was_up=0
st="$(bash "$OS/ctl.sh" status 2>/dev/null || true)"
grep -q '^nova-api running' <<<"$st" && was_up=1
st="$(bash "$OS/libvirt-compute.sh" status 2>/dev/null || true)"
grep -q ' running ' <<<"$st" && lv_was_up=1
echo "run.sh: cloud was up: $was_up, node3 was up: $lv_was_up (teardown stops only what this run starts)"
t0=$(date +%s) rc=0
# shellcheck disable=SC2317 # run by the EXIT trap
teardown() {
	local t2 t3
	t2=$(date +%s)
	if [[ "${HVG_OS_KEEP:-0}" == 1 ]]; then
		echo "run.sh: HVG_OS_KEEP=1: leaving node3 and the cloud up"
	else
		[[ $lv_was_up == 0 ]] && { bash "$OS/libvirt-compute.sh" down || rc=1; }
		[[ $was_up == 0 ]] && { bash "$OS/down.sh" || rc=1; }
	fi
	t3=$(date +%s)
	echo "e2e-classify: up $((${t1:-$t2} - t0)) s, storm $((t2 - ${t1:-$t2})) s, down $((t3 - t2)) s, total $((t3 - t0)) s, rc=$rc"
	exit "$rc"
}
trap teardown EXIT

bash "$OS/up.sh"
bash "$OS/libvirt-compute.sh" up
if ! command -v stress-ng >/dev/null; then
	echo "run.sh: installing stress-ng"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends stress-ng >/dev/null ||
		{ apt-get -o DPkg::Lock::Timeout=600 update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends stress-ng >/dev/null; }
fi
t1=$(date +%s)
cd "$REPO"
# TestMasakariInstanceRecovery skips unless the cloud runs Masakari
# (up.sh with HVG_OS_MASAKARI=1; HVG_E2E_MASAKARI=1 makes it required).
# HVG_STORM_LOGDIR keeps the agents' and controllers' logs there.
HVG_E2E_REQUIRE=1 "$GO" test -tags e2e -count=1 -v -timeout 90m -run 'TestRebootStorm|TestMasakariInstanceRecovery' ./test/e2e/classify/ || rc=$?
exit "$rc"

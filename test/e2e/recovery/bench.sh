#!/usr/bin/env bash
# bench.sh — issue 13's benchmark (docs/BENCHMARKS.md, make bench-recovery):
# the same three servers on node1 (2 BFV multiattach=False + 1 ephemeral)
# recovered by hvguard (partition/power-off → ACTIVE on node2, default
# settings: the agent's fencing at its defaults, HVG_RECOVERY_TIMING=default)
# and by Masakari 14.0.2 at its engine defaults (COMPUTE_HOST notification
# at t=0), on the same harness. Prints the BENCH-RESULT lines.
#
# As root; brings the harness up with Masakari if needed and restarts
# masakari-engine with the upstream wait_period_after_service_update (180 s)
# — make e2e runs it shorter. Leaves the cloud up if it was up before
# (HVG_OS_KEEP=1 keeps it either way). Takes ~7 min with the cloud up.
# Wrap it like every use of the shared cloud: flock /tmp/hvg-e2e.lock make bench-recovery
set -euo pipefail
cd "$(dirname "$0")/../../.."
OS=test/e2e/openstack
GO="${GO:-go}"
was_up=0
# read whole first: grep -q exiting early would SIGPIPE ctl.sh (pipefail)
st="$(bash $OS/ctl.sh status 2>/dev/null || true)"
grep -q '^nova-api running' <<<"$st" && was_up=1
# HVG_OS_MASAKARI_WAIT unset: up.sh writes the upstream default (180 s)
env -u HVG_OS_MASAKARI_WAIT HVG_OS_MASAKARI=1 bash $OS/up.sh
bash $OS/ctl.sh stop masakari-engine
bash $OS/ctl.sh start masakari-engine
rc=0
HVG_E2E_REQUIRE=1 HVG_RECOVERY_BENCH=1 HVG_RECOVERY_TIMING=default GO="$GO" \
	"$GO" test -tags e2e -count=1 -v -timeout 30m -run 'TestHostRecoveryBench|TestMasakariBench' ./test/e2e/recovery/ |
	tee /tmp/hvg-bench-recovery.log | grep -E 'BENCH-RESULT|^(---|===|ok|FAIL)|phases|^\s+\+' || rc=$?
grep -q '^ok' /tmp/hvg-bench-recovery.log || rc=1
if [[ $was_up == 0 && "${HVG_OS_KEEP:-0}" != 1 ]]; then bash $OS/down.sh; fi
exit $rc

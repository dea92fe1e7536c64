#!/usr/bin/env bash
# Root-only fencing tests over real kernel networking and at default timing:
#   - test/netns: the hvguard-agent binary in its own network namespace,
#     NATS in the root namespace over a veth pair (198.18.0.0/30), the link
#     cut with `ip link set ... down` (fence) and brought back (heal);
#     and the stop / upgrade / failed-start sequence (SIGTERM withdraws the
#     lease, a restart takes it back, exit 78, a corrupt outbox, a hung
#     libvirtd, a stop while the link is down fences): nothing declared
#     while domains run;
#   - test/netns controller HA: a 3-node NATS cluster (R3 lease bucket), two
#     hvguard-controller processes in their own namespaces (198.18.10.0/30,
#     198.18.11.0/30); the leader's link cut while a host falls silent (the
#     other takes over and declares it once; the old leader's held writes
#     change nothing after the heal), then one NATS server shut down (the
#     leader keeps its lock);
#   - test/netns softdog: the kernel softdog (soft_noboot=1 only) armed, fed
#     and disarmed through the agent's watchdog code; skips where it cannot
#     be loaded (containers);
#   - test/integration TestFencePartitionDefaultTiming: the partition at the
#     default constants (~35 s).
# Usage (as root, from the repository root): bash test/netns/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $(id -u) == 0 ]] || { echo "test/netns/run.sh: needs root (network namespaces, veth)"; exit 1; }
command -v ip >/dev/null || { echo "test/netns/run.sh: needs iproute2 (ip)"; exit 1; }
GO=${GO:-go}
bin=$(mktemp -d)/hvguard-agent
ctl=$(dirname "$bin")/hvguard-controller
trap 'rm -rf "$(dirname "$bin")"' EXIT
$GO build -o "$bin" ./cmd/hvguard-agent
$GO build -o "$ctl" ./cmd/hvguard-controller
HVGUARD_NETNS=1 HVGUARD_SOFTDOG=1 HVGUARD_AGENT_BIN=$bin HVGUARD_CONTROLLER_BIN=$ctl $GO test -count=1 -v ./test/netns/
HVGUARD_FENCE_DEFAULT_TIMING=1 $GO test -count=1 -v -run 'TestFencePartitionDefaultTiming' ./test/integration/

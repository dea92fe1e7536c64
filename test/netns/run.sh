#!/usr/bin/env bash
# Root-only fencing tests over real kernel networking and at default timing:
#   - test/netns: the hvguard-agent binary in its own network namespace,
#     NATS in the root namespace over a veth pair (198.18.0.0/30), the link
#     cut with `ip link set ... down` (fence) and brought back (heal);
#     and the stop / upgrade / failed-start sequence (SIGTERM withdraws the
#     lease, a restart takes it back, exit 78, a corrupt outbox, a hung
#     libvirtd, a stop while the link is down fences): nothing declared
#     while domains run;
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
trap 'rm -rf "$(dirname "$bin")"' EXIT
$GO build -o "$bin" ./cmd/hvguard-agent
HVGUARD_NETNS=1 HVGUARD_SOFTDOG=1 HVGUARD_AGENT_BIN=$bin $GO test -count=1 -v ./test/netns/
HVGUARD_FENCE_DEFAULT_TIMING=1 $GO test -count=1 -v -run 'TestFencePartitionDefaultTiming' ./test/integration/

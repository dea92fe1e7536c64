#!/usr/bin/env bash
# bench.sh — run every benchmark recorded in docs/BENCHMARKS.md (`make bench`).
#
# Each target is measured together with its baseline in the same run:
#   1. debouncer throughput/allocs   lifecycle BenchmarkObserve + test/bench BenchmarkDebounce
#                                    (hvguard vs Nova delay-only vs a bare map lookup)
#   2. reboot storm false stops      lifecycle BenchmarkRebootStorm* (hvguard vs Nova rule)
#   3. real-stop latency overhead    test/bench BenchmarkStopLatency (baseline: suspend latency)
#   4. end to end events/s, p99      test/bench BenchmarkEndToEnd (baseline: test driver alone),
#                                    agent/delivery BenchmarkPublish (publisher alone),
#                                    libvirtx BenchmarkEventHandoff* (hand-off alone)
#      agent RSS                     test/bench BenchmarkAgentRSS (separate agent process)
#   5. issue 12: fleet scale         test/bench BenchmarkFleetScale (3 nats-server processes, 10 000
#                                    simulated agents, 1 000 events/s, the real hvguard-controller;
#                                    baseline: the same load without it)
#      leader failover               test/bench BenchmarkLeaderFailover (real controller processes:
#                                    kill -9 and SIGTERM of the leader, 10 runs each)
#   receipts: a receipts stream per host fencing/natslease BenchmarkReceiptStreams (1000 hosts;
#                                    baseline: one shared stream naming every host's subject)
#
# Raw `go test -bench` output goes to $HVG_BENCH_OUT (default
# .cache/bench/<UTC time>/), one file per target, with machine.txt (uname,
# nproc, CPU, Go, load average before and after). Then benchstat prints every
# table and a summary compares the medians with the targets.
#
# Environment:
#   HVG_BENCH_COUNT      -count of the micro benchmarks (default 6)
#   HVG_BENCH_COUNT_E2E  -count of the end-to-end benchmarks (default 3)
#   HVG_BENCH_OUT        output directory
#   HVG_BENCH_ONLY       comma-separated targets to run (default all): debounce,
#                        storm, stoplatency, e2e, rss, fleet, failover, receipts
#   HVG_FLEET_HOSTS, HVG_FLEET_EVENTS, HVG_FLEET_SECONDS, HVG_FLEET_SILENT,
#   HVG_FLEET_CONNS, HVG_FAILOVER_RUNS, HVG_FAILOVER_HOSTS
#                        the issue-12 benchmarks' sizes (defaults 10000 hosts,
#                        1000 events/s, 150 s per phase, 5 silent hosts, 16
#                        connections; 10 runs, 50 hosts): docs/BENCHMARKS.md
#
# The end-to-end benchmarks run a private libvirtd as user nobody (RSS over
# a real daemon socket); without root or libvirtd that one sub-benchmark is
# skipped. Everything else needs only Go, cgo and libvirt-dev (make deps).
set -euo pipefail

cd "$(dirname "$0")/.."
readonly ROOT="$PWD"
readonly COUNT="${HVG_BENCH_COUNT:-6}"
readonly COUNT_E2E="${HVG_BENCH_COUNT_E2E:-3}"
readonly ONLY="${HVG_BENCH_ONLY:-debounce,storm,stoplatency,e2e,rss,fleet,failover,receipts}"
OUT="${HVG_BENCH_OUT:-$ROOT/.cache/bench/$(date -u +%Y%m%dT%H%M%SZ)}"
readonly OUT
readonly GOBIN_DIR="$ROOT/.cache/bin"
readonly T0="$(date +%s)"
export CGO_ENABLED=1

log() { printf '[bench.sh +%ds] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$OUT" "$GOBIN_DIR"

# ---- machine ---------------------------------------------------------------
{
	echo "date:     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "uname:    $(uname -a)"
	echo "nproc:    $(nproc)"
	echo "cpu:      $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "memory:   $(awk '/^MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "go:       $(go version)"
	echo "commit:   $(git describe --always --dirty 2>/dev/null || echo unknown)"
	echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, at start)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# ---- tools -------------------------------------------------------------------
BENCHSTAT="$GOBIN_DIR/benchstat"
if [[ ! -x "$BENCHSTAT" ]]; then
	log "installing benchstat into $GOBIN_DIR (not a module dependency)"
	GOBIN="$GOBIN_DIR" go install golang.org/x/perf/cmd/benchstat@latest ||
		log "WARNING: go install benchstat failed: no benchstat tables (the summary does not need them)"
fi

log "building hvguard-agent, benchagent, hvguard-controller and nats-server into $OUT/bin"
go build -o "$OUT/bin/hvguard-agent" ./cmd/hvguard-agent || die "build hvguard-agent"
go build -tags bench -o "$OUT/bin/benchagent" ./test/bench/cmd/benchagent || die "build benchagent"
go build -o "$OUT/bin/hvguard-controller" ./cmd/hvguard-controller || die "build hvguard-controller"
# The module's own nats-server (a dependency of the embedded test servers).
go build -o "$OUT/bin/nats-server" github.com/nats-io/nats-server/v2 || die "build nats-server"
export HVG_BENCH_BIN_DIR="$OUT/bin"
go vet -tags bench ./test/bench/... || die "go vet -tags bench ./test/bench/..."

# on TARGET: whether TARGET is in HVG_BENCH_ONLY.
on() { [[ ",$ONLY," == *",$1,"* ]]; }

# bench FILE ARGS...: go test -run '^$' ARGS, output appended to $OUT/FILE;
# skipped unless FILE's target (its name without .txt) is in HVG_BENCH_ONLY.
bench() {
	local file="$1"
	shift
	on "${file%.txt}" || return 0
	log "go test -run '^\$' $*  >> $file"
	if ! go test -run '^$' "$@" >>"$OUT/$file" 2>&1; then
		tail -n 40 "$OUT/$file" >&2
		log "FAILED: go test $* (full output: $OUT/$file); continuing"
		FAILED=1
	fi
}
FAILED=0

# ---- 1. debouncer ------------------------------------------------------------
bench debounce.txt -bench '^BenchmarkObserve$' -benchmem -count "$COUNT" ./lifecycle/
bench debounce.txt -tags bench -bench '^BenchmarkDebounce$' -benchmem -count "$COUNT" ./test/bench/

# ---- 2. reboot storm (deterministic simulation: fixed seeds) -----------------
bench storm.txt -bench '^BenchmarkRebootStorm' -benchtime 1x -count 3 ./lifecycle/

# ---- issue 11: a controller's cost per beacon (rec_sig against sig+prev_sig) --
bench beacon.txt -bench '^BenchmarkVerifyBeacon$' -count "$COUNT" ./fencing/
# the runner's cost per beacon: verified (the baseline: every beacon before the
# budget) against shed (beyond its host's verification budget, reviewer X75)
bench beacon.txt -bench '^BenchmarkRunnerBeacon$' -benchmem -count "$COUNT" ./controller/

# ---- issue 11: a withdrawal receipts stream per host (baseline: one shared) --
bench receipts.txt -bench '^BenchmarkReceiptStreams$' -benchtime 2000x -count 3 -timeout 20m ./fencing/natslease/

# ---- 3. real-stop latency ----------------------------------------------------
bench stoplatency.txt -tags bench -bench '^BenchmarkStopLatency$' -benchtime 1x -count "$COUNT_E2E" -timeout 20m ./test/bench/

# ---- 4. end to end, baselines, RSS ---------------------------------------------
bench e2e.txt -tags bench -bench '^BenchmarkEndToEnd$' -benchtime 1x -count "$COUNT_E2E" -timeout 20m ./test/bench/
bench e2e.txt -bench '^BenchmarkPublish$' -count "$COUNT_E2E" ./agent/delivery/
bench e2e.txt -bench '^BenchmarkEventHandoff' -benchtime 2s -count "$COUNT_E2E" ./libvirtx/
bench rss.txt -tags bench -bench '^BenchmarkAgentRSS$' -benchtime 1x -count "$COUNT_E2E" -timeout 20m ./test/bench/

# ---- 5. issue 12: fleet scale and leader failover (one run each) -------------
bench fleet.txt -tags bench -bench '^BenchmarkFleetScale$' -benchtime 1x -count 1 -timeout 40m ./test/bench/
bench failover.txt -tags bench -bench '^BenchmarkLeaderFailover$' -benchtime 1x -count 1 -timeout 40m ./test/bench/

echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, at end)" >>"$OUT/machine.txt"

# ---- report --------------------------------------------------------------------
for f in debounce storm beacon stoplatency e2e rss fleet failover receipts; do
	[[ -s "$OUT/$f.txt" && -x "$BENCHSTAT" ]] || continue
	echo
	echo "======== $f ($OUT/$f.txt) ========"
	"$BENCHSTAT" "$OUT/$f.txt" || true
done

# med FILE BENCH UNIT: the median of UNIT over the result lines of benchmark
# BENCH (exact name without the -GOMAXPROCS suffix) in FILE.
med() {
	awk -v want="$2" -v unit="$3" '
		/^Benchmark/ {
			name = $1; sub(/-[0-9]+$/, "", name)
			if (name != want) next
			for (i = 3; i < NF; i += 2) if ($(i+1) == unit) print $i
		}' "$OUT/$1" | sort -g | awk '
		{ v[NR] = $1 }
		END {
			if (NR == 0) { print "n/a"; exit }
			m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2
			if (m >= 1000 || m <= -1000) printf "%.0f\n", m; else print m
		}'
}

# check LABEL VALUE OP LIMIT: one summary line with ok/MISSED.
check() {
	local verdict
	if [[ "$2" == n/a || -z "$2" ]]; then
		verdict="n/a (skipped or failed)"
	elif awk -v v="$2" -v l="$4" -v op="$3" 'BEGIN { exit !((op == ">=") ? v >= l : v <= l) }'; then
		verdict="ok"
	else
		verdict="MISSED"
	fi
	printf '  %-58s %14s  (target %s %s)  %s\n' "$1" "$2" "$3" "$4" "$verdict"
}

B=BenchmarkDebounce
E=BenchmarkEndToEnd
R=BenchmarkAgentRSS
P=binary=hvguard-agent/libvirt=private-libvirtd
F=BenchmarkFleetScale
L=BenchmarkLeaderFailover
{
	echo
	echo "======== summary (medians; raw output in $OUT) ========"
	sed 's/^/  /' "$OUT/machine.txt"
	if on debounce; then
		echo "1. debouncer (events/s on one core; allocs per event)"
		check "hvguard debouncer events/s" "$(med debounce.txt $B/impl=hvguard events/s)" ">=" 1000000
		printf '  %-58s %14s\n' "hvguard debouncer allocs/event (fraction)" "$(med debounce.txt $B/impl=hvguard allocs/event)"
		printf '  %-58s %14s\n' "baseline: Nova delay-only events/s" "$(med debounce.txt $B/impl=nova-delay-only events/s)"
		printf '  %-58s %14s\n' "baseline: bare map lookup events/s" "$(med debounce.txt $B/impl=map-lookup events/s)"
		printf '  %-58s %14s\n' "lifecycle BenchmarkObserve events/s" "$(med debounce.txt BenchmarkObserve events/s)"
	fi
	if on storm; then
		echo "2. reboot storm (1000 domains, 1 simulated hour)"
		check "hvguard false stops" "$(med storm.txt BenchmarkRebootStorm hvguard_false_stops)" "<=" 0
		printf '  %-58s %14s\n' "baseline: Nova delay-only false stops" "$(med storm.txt BenchmarkRebootStorm nova_false_stops)"
		check "hvguard false stops (5% long-off reboots)" "$(med storm.txt BenchmarkRebootStormLongOff hvguard_false_stops)" "<=" 0
		printf '  %-58s %14s\n' "baseline: Nova false stops (5% long-off reboots)" "$(med storm.txt BenchmarkRebootStormLongOff nova_false_stops)"
	fi
	if on stoplatency; then
		echo "3. real-stop report latency (window 1 s, 200 domains per run)"
		check "stop overhead p99 ms (receive - destroy - window)" "$(med stoplatency.txt BenchmarkStopLatency stop_overhead_p99_ms)" "<=" 100
		printf '  %-58s %14s\n' "stop overhead p50 ms" "$(med stoplatency.txt BenchmarkStopLatency stop_overhead_p50_ms)"
		printf '  %-58s %14s\n' "stop overhead max ms" "$(med stoplatency.txt BenchmarkStopLatency stop_overhead_max_ms)"
		printf '  %-58s %14s\n' "baseline: suspend latency p99 ms (not debounced)" "$(med stoplatency.txt BenchmarkStopLatency suspend_latency_p99_ms)"
		check "wrong or missing stops" "$(med stoplatency.txt BenchmarkStopLatency wrong_stops)" "<=" 0
	fi
	if on e2e; then
		echo "4. end to end: test driver -> agent -> JetStream -> consumer (1000 domains)"
		check "saturated events/s" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=max events/s)" ">=" 20000
		printf '  %-58s %14s\n' "saturated latency p99 ms" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=max latency_p99_ms)"
		printf '  %-58s %14s\n' "saturated lost events (hand-off overflow -> resync)" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=max lost_events)"
		check "at 20 000 events/s offered: delivered (keeps up = ≥ 99 %)" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=20000 events/s)" ">=" 19800
		printf '  %-58s %14s\n' "at 20 000 events/s offered: latency p99 ms" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=20000 latency_p99_ms)"
		printf '  %-58s %14s\n' "at 20 000 events/s offered: lost events" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=20000 lost_events)"
		printf '  %-58s %14s\n' "at 10 000 events/s offered: events/s" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=10000 events/s)"
		printf '  %-58s %14s\n' "at 10 000 events/s offered: latency p99 ms" "$(med e2e.txt $E/pipeline=agent-jetstream/offered=10000 latency_p99_ms)"
		printf '  %-58s %14s\n' "baseline: test driver alone events/s" "$(med e2e.txt $E/pipeline=testdriver-only events/s)"
		printf '  %-58s %14s\n' "baseline: publisher alone events/s" "$(med e2e.txt BenchmarkPublish events/s)"
	fi
	if on rss; then
		check "agent RSS, 1000 domains, after burst (MB)" "$(med rss.txt $R/$P burst_rss_MB)" "<=" 40
		check "agent peak RSS (VmHWM), whole run (MB)" "$(med rss.txt $R/$P burst_hwm_MB)" "<=" 40
		printf '  %-58s %14s\n' "agent RSS idle after resync (MB)" "$(med rss.txt $R/$P idle_rss_MB)"
		printf '  %-58s %14s\n' "  of which private (RssAnon) after burst (MB)" "$(med rss.txt $R/$P burst_anon_MB)"
		printf '  %-58s %14s\n' "events/s through a real libvirtd (agent process)" "$(med rss.txt $R/$P burst_events/s)"
		printf '  %-58s %14s\n' "agent process CPU µs per event at that rate" "$(med rss.txt $R/$P agent_cpu_µs/event)"
	fi
	if on fleet; then
		echo "5. issue 12: fleet scale (3-node NATS, R3; hosts renewing every 2 s, events/s; real controller)"
		printf '  %-58s %14s\n' "hosts" "$(med fleet.txt $F hosts)"
		check "silent host declared, max s after its last renewal" "$(med fleet.txt $F declare_max_s)" "<=" "$(med fleet.txt $F declare_bound_s)"
		printf '  %-58s %14s\n' "  min / median s" "$(med fleet.txt $F declare_min_s) / $(med fleet.txt $F declare_median_s)"
		check "consumer lag max s (pending + unacked at the event rate)" "$(med fleet.txt $F lag_max_s)" "<=" 1
		printf '  %-58s %14s\n' "controller CPU (cores)" "$(med fleet.txt $F ctl_cpu_cores)"
		printf '  %-58s %14s\n' "controller RSS / peak (MB)" "$(med fleet.txt $F ctl_rss_MB) / $(med fleet.txt $F ctl_hwm_MB)"
		printf '  %-58s %14s\n' "renewal p50 / p99 ms, with controller" "$(med fleet.txt $F ctl_renew_p50_ms) / $(med fleet.txt $F ctl_renew_p99_ms)"
		printf '  %-58s %14s\n' "baseline (no controller): renewal p50 / p99 ms" "$(med fleet.txt $F base_renew_p50_ms) / $(med fleet.txt $F base_renew_p99_ms)"
		printf '  %-58s %14s\n' "renewal failures, with / without controller" "$(med fleet.txt $F ctl_renew_failures) / $(med fleet.txt $F base_renew_failures)"
		printf '  %-58s %14s\n' "NATS CPU (3 servers, cores), with / without controller" "$(med fleet.txt $F ctl_nats_cpu_cores) / $(med fleet.txt $F base_nats_cpu_cores)"
		printf '  %-58s %14s\n' "NATS RSS (3 servers, MB), with / without controller" "$(med fleet.txt $F ctl_nats_rss_MB) / $(med fleet.txt $F base_nats_rss_MB)"
	fi
	if on receipts; then
		echo "issue 11: withdrawal receipts, one stream per host (1000 hosts, one receipt each, embedded nats-server)"
		printf '  %-58s %14s\n' "own streams: heap B/host, steady (after 15 s idle)" "$(med receipts.txt BenchmarkReceiptStreams/own heap-B/host)"
		printf '  %-58s %14s\n' "baseline: shared stream heap B/host" "$(med receipts.txt BenchmarkReceiptStreams/shared heap-B/host)"
		printf '  %-58s %14s\n' "own streams: create µs/host" "$(med receipts.txt BenchmarkReceiptStreams/own create-µs/host)"
		printf '  %-58s %14s\n' "own streams: a declaration's read, ns" "$(med receipts.txt BenchmarkReceiptStreams/own ns/op)"
		printf '  %-58s %14s\n' "baseline: shared stream read, ns" "$(med receipts.txt BenchmarkReceiptStreams/shared ns/op)"
	fi
	if on failover; then
		echo "6. issue 12: leader failover (real controllers, default lock timing; runs: $(med failover.txt $L runs))"
		printf '  %-58s %14s\n' "kill -9 -> standby leading, median / max s" "$(med failover.txt $L kill_leading_median_s) / $(med failover.txt $L kill_leading_max_s)"
		printf '  %-58s %14s\n' "kill -9 -> its first declaration, median / max s" "$(med failover.txt $L kill_declared_median_s) / $(med failover.txt $L kill_declared_max_s)"
		printf '  %-58s %14s\n' "SIGTERM -> standby leading, median / max s" "$(med failover.txt $L term_leading_median_s) / $(med failover.txt $L term_leading_max_s)"
		printf '  %-58s %14s\n' "TakeoverAfter(TTL) / TakeoverAfter(act_margin) s" "$(med failover.txt $L base_takeover_after_ttl_s) / $(med failover.txt $L base_takeover_after_margin_s)"
	fi
	echo "  total time: $(($(date +%s) - T0)) s"
} | tee "$OUT/summary.txt"
if ((FAILED)); then
	die "some benchmarks failed (see above); their figures are n/a"
fi

#!/usr/bin/env bash
# gotest-shards.sh PKG K [PARALLEL]: runs PKG's tests as K processes of one
# test binary at once (make test-go, for ./controller/).
#
# Why: the controller package's NATS attack tests mostly wait (timers of
# lease_ttl + grace, "not declared within 12 s"), and most cannot run in
# parallel inside one process: their mutation switches are package
# globals. Separate processes have separate globals. The top-level tests
# are dealt by weight (WEIGHTS, a file of "TestName seconds": the
# heaviest first, each to the lightest shard so far; without it all weigh
# the same) to shards 1..K-1 by name (-test.run); shard 0 runs its own and
# everything else (-test.skip of the others' names), so fuzz seeds,
# examples and any test the listing missed still run: the union is the
# whole package by construction. Each shard runs
# its own parallel tests PARALLEL at once (default 3). Each shard's output
# is printed whole, as go test prints it, after a header line naming the
# shard; the exit status is non-zero if any shard failed.
set -euo pipefail
pkg=${1:?usage: gotest-shards.sh PKG K [PARALLEL]}
k=${2:?usage: gotest-shards.sh PKG K [PARALLEL]}
par=${3:-3}
GO=${GO:-go}
weights=/dev/null
[ -z "${WEIGHTS:-}" ] || weights=$(realpath "$WEIGHTS")
dir=$(mktemp -d /tmp/hvguard-shards.XXXXXX)
trap 'rm -rf "$dir"' EXIT
bin="$dir/pkg.test"
$GO test -c -o "$bin" "$pkg"
pkgdir=$($GO list -f '{{.Dir}}' "$pkg")
cd "$pkgdir"
"$bin" -test.list '^Test' | grep '^Test' > "$dir/list"
# Deal the heaviest first, each to the lightest shard so far (weights:
# WEIGHTS, lines "TestName seconds"; a test not listed weighs 1).
awk -v wf="$weights" 'FILENAME == wf { if ($1 !~ /^#/ && NF == 2) w[$1] = $2; next } { print (($1 in w) ? w[$1] : 1), $1 }' \
	"$weights" "$dir/list" | sort -k1,1nr -k2,2 |
	awk -v k="$k" '{ m = 0; for (i = 1; i < k; i++) if (load[i] < load[m]) m = i; load[m] += $1; print m, $2 }' > "$dir/dealt"
for ((i = 0; i < k; i++)); do
	awk -v i="$i" '$1 == i { print $2 }' "$dir/dealt" | paste -sd'|' > "$dir/s$i"
done
dealt() { [ -n "$(tr -d '\n' < "$dir/s$1")" ]; } # shard $1 has tests
others=""
for ((i = 1; i < k; i++)); do
	dealt $i && others="${others:+$others|}$(cat "$dir/s$i")"
done
start=$(date +%s)
pids=()
for ((i = 0; i < k; i++)); do
	if ((i == 0)); then
		sel=(-test.skip "^(${others:-^$})\$")
	else
		dealt $i || continue
		sel=(-test.run "^($(cat "$dir/s$i"))\$")
	fi
	( r=0
	  "$bin" -test.count=1 -test.timeout=20m -test.parallel="$par" "${sel[@]}" > "$dir/o$i" 2>&1 || r=$?
	  echo "$r $(($(date +%s) - start))" > "$dir/rc$i" ) &
	pids+=($!)
done
wait "${pids[@]}" || true
rc=0
for ((i = 0; i < k; i++)); do
	((i == 0)) || dealt $i || continue # nothing dealt to it: not run
	if [ ! -f "$dir/rc$i" ]; then
		echo "FAIL $pkg shard $i/$k: no exit status (killed?)"
		rc=1
		continue
	fi
	read -r r secs < "$dir/rc$i"
	n=$(awk -F'|' '{print NF}' "$dir/s$i")
	echo "=== shard $i/$k of $pkg"
	cat "$dir/o$i"
	if [ "$r" = 0 ]; then
		echo "ok   $pkg shard $i/$k ($n tests dealt to it) ${secs} s"
	else
		echo "FAIL $pkg shard $i/$k ($n tests dealt to it) ${secs} s, exit $r"
		rc=1
	fi
done
echo "$pkg: $k shards in $(($(date +%s) - start)) s"
exit $rc

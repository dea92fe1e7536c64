package controller_test

import (
	"strings"
	"testing"
)

// TestX81ShedFloodPastLaterValuesNATS ((c), reviewer X81): reviewer X75's
// paced flood (TestX75FloodPastLaterValuesNATS) with ten times the burst.
// The verification budget bounds what a flood costs per beacon (3.6 µs
// decoded and shed against 46 µs verified), not how many beacons queue
// ahead of compute-3's on NATS's goroutine (nats.go's pending limit:
// 512Ki messages / 64 MiB): compute-3's beacons came 141–282 ms late,
// more than maxLaterValues values landed between its create and the
// beacon that would vouch for it, and the dead compute-3 was never
// declared (half the runs at 55a107e). Closed by compactLater (vouch.go):
// the garbage between a create and its beacon no longer counts toward the
// bound, however late the beacon.
func TestX81ShedFloodPastLaterValuesNATS(t *testing.T) {
	x75CopyLoopNATS(t, x75Loop{garbage: x75Garbage, flood: 40000})
}

// x81Junk: 4085 bytes (under maxBeaconSize) that never decode as a beacon
// (no schema) and cost encoding/json ~55 µs (2040 nested arrays: more than
// a signature's verification, 46 µs) — never charged to any budget
// (charged only once decoded, reviewer X80's fix), never shed, no
// "beacons shed" warning: only invalid-beacon counts.
var x81Junk = []byte(`{"x":` + strings.Repeat("[", 2040) + strings.Repeat("]", 2040) + `}`)

// TestX81JunkFloodPastLaterValuesNATS ((c), reviewer X81): X75's burst
// (3000 a round) of x81Junk on compute-1's own beacon subject: the budget
// does not apply, compute-3's beacons came 222–559 ms late, never vouched
// (4 of 4 runs at 55a107e). Closed by compactLater, as above.
func TestX81JunkFloodPastLaterValuesNATS(t *testing.T) {
	x75CopyLoopNATS(t, x75Loop{garbage: x75Garbage, flood: 3000, junk: true})
}

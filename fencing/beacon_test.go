package fencing

import (
	"strings"
	"testing"
)

// TestDecodeBeaconState: a beacon names a renewal (no state) or the
// withdrawal (state withdrawn); any other state is refused, so a beacon
// cannot claim what only a record may say (expired, released).
func TestDecodeBeaconState(t *testing.T) {
	base := `{"schema":1,"host":"h0.example.org","revision":7`
	for _, c := range []struct {
		tail string
		ok   bool
		want LeaseState
	}{
		{`}`, true, ""},
		{`,"state":"withdrawn"}`, true, LeaseWithdrawn},
		{`,"state":"expired"}`, false, ""},
		{`,"state":"active"}`, false, ""},
		{`,"state":"released"}`, false, ""},
	} {
		b, err := DecodeBeacon([]byte(base + c.tail))
		if (err == nil) != c.ok || c.ok && b.State != c.want {
			t.Errorf("%s: %+v, %v; want ok %t state %q", base+c.tail, b, err, c.ok, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), "decode beacon") {
			t.Errorf("%s: error %v does not say what it decoded", c.tail, err)
		}
	}
}

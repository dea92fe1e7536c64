package natslease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestX85UnreadableMarkerUnanchorsCreate (reviewer X85): a compromised
// node's delete of h0's key is a plain publish (its permissions allow KV
// writes) with KV-Operation: DEL and one more header line that
// strictHeaders refuses but nats.go and the server accept (here
// nats-expected-last-subject-sequence in lower case). Store.marker reads the marker with strictHeaders: hdrErr,
// "not a marker" — so h0's create is a plain create (prev_rev 0), which
// nats.go's Create writes by a CAS on the marker anyway (it reads the
// header leniently): never verifiable, back to the vouching and its open
// items (X83/X84's creates) — the delete loop run with such markers makes
// every write of an upgraded agent a legacy create.
//
// Fixed: a header block strictHeaders refuses is read as nats.go's Create
// reads it (KV-Operation DEL or PURGE: a marker, anchored on). With
// StrictMarkerMutation the create is a plain one again.
func TestX85UnreadableMarkerUnanchorsCreate(t *testing.T) {
	for _, tc := range []struct {
		odd string
		mut bool
	}{{"", false}, {"nats-expected-last-subject-sequence", false}, {"nats-expected-last-subject-sequence", true}} {
		odd := tc.odd
		name := "plain-delete"
		if odd != "" {
			name = "odd-header-delete"
		}
		if tc.mut {
			name += "/StrictMarkerMutation"
		}
		t.Run(name, func(t *testing.T) {
			if tc.mut {
				natslease.StrictMarkerMutation = true
				t.Cleanup(func() { natslease.StrictMarkerMutation = false })
			}
			st, js, _, ctx := signedStore(t)
			kv := st.KV
			const to = 2 * time.Second
			res := st.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("first create: %+v", res)
			}
			// The compromised node's delete: a publish of a marker.
			m := nats.NewMsg("$KV." + fencing.Bucket + ".h0")
			m.Header.Set("KV-Operation", "DEL")
			if odd != "" {
				// the key's last revision, so the server accepts it whether
				// it enforces the name in this case or not
				m.Header[odd] = []string{fmt.Sprint(res.Revision)}
			}
			ack, err := js.PublishMsg(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			marker := ack.Sequence
			if _, err := kv.Get(ctx, "h0"); err == nil {
				t.Fatalf("nats.go does not take revision %d for a delete", marker)
			}
			res = st.Renew(ctx, fencing.RenewRequest{Seq: 2, Record: activeRecord("h0", 2)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("create over the marker: %+v", res)
			}
			rec, crev, err := st.Read(ctx, "h0")
			if err != nil {
				t.Fatal(err)
			}
			w, err := st.WrittenOn(ctx, "h0", crev, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			ok, why := w.Fresh(*rec)
			t.Logf("marker %d, create at %d: prev_rev %d, %+v, fresh %t %s", marker, crev, rec.PrevRev, w, ok, why)
			if (rec.PrevRev != marker || !ok) != tc.mut {
				t.Errorf("h0's create over the compromised node's marker %d: prev_rev %d, fresh %t — not anchored: a legacy create, only a beacon can vouch for it", marker, rec.PrevRev, ok)
			}
		})
	}
}

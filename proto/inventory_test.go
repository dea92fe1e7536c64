package proto

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func invDomains(n int) []InventoryDomain {
	out := make([]InventoryDomain, n)
	for i := range out {
		// Long names: libvirt allows any; Nova's are instance-%08x.
		out[i] = InventoryDomain{UUID: fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012x", i), Name: "instance-" + strings.Repeat("x", 60), State: "running"}
	}
	return out
}

// A full report of any size splits into parts of at most InventoryChunk
// domains, each a valid message under MaxMessageSize that round-trips.
func TestInventoryMessages(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range []int{0, 1, InventoryChunk, InventoryChunk + 1, 1000} {
		msgs := InventoryMessages("node1", "resync", invDomains(n))
		want := max(1, (n+InventoryChunk-1)/InventoryChunk)
		if len(msgs) != want {
			t.Fatalf("%d domains: %d parts, want %d", n, len(msgs), want)
		}
		var got []InventoryDomain
		for i, m := range msgs {
			m.Seq, m.Incarnation, m.OccurredAt, m.ObservedAt = uint64(10+i), 7, at, at
			b, err := m.Encode()
			if err != nil {
				t.Fatalf("%d domains, part %d: %v", n, i+1, err)
			}
			d, err := DecodeLifecycle(b)
			if err != nil || !reflect.DeepEqual(d, m) {
				t.Fatalf("%d domains, part %d: round trip %v", n, i+1, err)
			}
			if d.InventoryPart != i+1 || d.InventoryParts != want {
				t.Fatalf("part %d/%d", d.InventoryPart, d.InventoryParts)
			}
			got = append(got, d.Domains...)
		}
		if len(got) != n {
			t.Fatalf("%d domains: the parts carry %d", n, len(got))
		}
	}
}

func TestInventoryValidate(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	base := func() LifecycleEvent {
		return LifecycleEvent{Schema: 1, Host: "node1", Seq: 5, Transition: TransitionInventory, InventoryPart: 1, InventoryParts: 1,
			Domains: invDomains(2), OccurredAt: at, ObservedAt: at}
	}
	if e := base(); e.Validate() != nil {
		t.Fatal(e.Validate())
	}
	for name, tc := range map[string]struct {
		mut  func(*LifecycleEvent)
		want string
	}{
		"domain uuid set":  {func(e *LifecycleEvent) { e.DomainUUID = "6f1c2a9e-0000-4000-8000-000000000003" }, "must be empty on an inventory"},
		"no parts":         {func(e *LifecycleEvent) { e.InventoryParts = 0 }, "inventory_parts: 0"},
		"part above parts": {func(e *LifecycleEvent) { e.InventoryPart = 2 }, "inventory_part: 2"},
		"part above seq":   {func(e *LifecycleEvent) { e.InventoryParts, e.InventoryPart, e.Seq = 9, 8, 3 }, "above the message's seq"},
		"too many domains": {func(e *LifecycleEvent) { e.Domains = invDomains(InventoryChunk + 1) }, "at most 256"},
		"bad domain uuid":  {func(e *LifecycleEvent) { e.Domains[1].UUID = "X" }, "domains[1].uuid"},
		"empty state":      {func(e *LifecycleEvent) { e.Domains[0].State = "" }, "domains[0].state"},
		"gap fields":       {func(e *LifecycleEvent) { e.GapCount = 1 }, "gap_count"},
		"domains on a stop": {func(e *LifecycleEvent) {
			e.Transition = TransitionStopped
			e.DomainUUID = "6f1c2a9e-0000-4000-8000-000000000003"
		}, "only allowed on \"inventory\""},
	} {
		e := base()
		tc.mut(&e)
		if err := e.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

package agent

import (
	"slices"
	"testing"

	"hvguard/lifecycle"
	"hvguard/proto"
)

// TestFoldReported: the reports appended after domains.json was saved are
// applied in order to what it holds (what consumers were told last).
func TestFoldReported(t *testing.T) {
	known := []lifecycle.DomainSnapshot{
		{UUID: "a", Name: "A", State: lifecycle.StateRunning},
		{UUID: "b", Name: "B", State: lifecycle.StateRunning},
		{UUID: "c", Name: "C", State: lifecycle.StateShutoff},
	}
	ev := func(uuid string, tr proto.Transition, state string) proto.LifecycleEvent {
		return proto.LifecycleEvent{DomainUUID: uuid, DomainName: uuid, Transition: tr, State: state}
	}
	got := foldReported(known, []proto.LifecycleEvent{
		ev("a", proto.TransitionStopped, "shutoff"),
		ev("b", proto.TransitionSuspended, "paused"),
		ev("c", proto.TransitionUndefined, "gone"),
		ev("d", proto.TransitionDefined, "shutoff"),
		ev("d", proto.TransitionStarted, "running"),
		ev("e", proto.TransitionDefined, "unknown"), // unplaced: not learnt
		{Transition: proto.TransitionGap},
	})
	want := []lifecycle.DomainSnapshot{
		{UUID: "a", Name: "a", State: lifecycle.StateShutoff},
		{UUID: "b", Name: "b", State: lifecycle.StatePaused},
		{UUID: "d", Name: "d", State: lifecycle.StateRunning},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("folded\n %+v\nwant\n %+v", got, want)
	}
}

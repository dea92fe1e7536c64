package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
)

// TestReadConfirmationsNATS: on a real control bucket, the runner's poll
// reads the controllers' rollback marker, and takes an operator's
// confirmation only while the marker it names stands: one naming an
// earlier marker, or another host, confirms nothing; with no marker there
// is nothing to confirm (the command says so).
func TestReadConfirmationsNATS(t *testing.T) {
	_, _, js := controllertest.JetStream(t)
	ctx := context.Background()
	kv, err := controller.EnsureControlBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	confirm := func(host string) {
		t.Helper()
		if _, err := controller.WriteRollbackConfirmation(ctx, kv, controller.RollbackConfirmation{Host: host, By: "test", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	mark := func() {
		t.Helper()
		if _, err := controller.WriteRollbackMarker(ctx, kv, controller.RollbackMarker{By: "test", At: time.Now(), Reason: "rolled back"}); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gated := []string{"h1.example.org", "h2.example.org", "h3.example.org"}
	var p controller.ConfirmPoll
	if r := p.Poll(ctx, kv, log, gated, time.Now()); !r.Known || r.Marker {
		t.Fatalf("no marker: poll %+v, want known, no marker", r)
	}
	if _, err := controller.WriteRollbackConfirmation(ctx, kv, controller.RollbackConfirmation{Host: "h1.example.org"}); !errors.Is(err, controller.ErrNoRollbackMarker) {
		t.Fatalf("a confirmation with no marker: %v, want ErrNoRollbackMarker", err)
	}
	mark() // an earlier rollback
	confirm("h1.example.org")
	mark() // this one
	if r := p.Poll(ctx, kv, log, gated, time.Now()); !r.Known || !r.Marker || len(r.Confirmed) != 0 {
		t.Fatalf("poll: %+v, want the marker read, nothing confirmed (h1's names the earlier marker)", r)
	}
	k, _ := controller.ConfirmKey("h2.example.org")
	if _, err := kv.Put(ctx, k, []byte(`{"host":"h3.example.org","by":"test"}`)); err != nil { // names another host
		t.Fatal(err)
	}
	confirm("h3.example.org")
	if r := p.Poll(ctx, kv, log, gated, time.Now()); len(r.Confirmed) != 1 || r.Confirmed[0] != "h3.example.org" {
		t.Fatalf("confirmed %v, want h3.example.org alone", r.Confirmed)
	}
	confirm("h1.example.org") // again, naming this marker
	if r := p.Poll(ctx, kv, log, gated, time.Now()); len(r.Confirmed) != 2 || r.Confirmed[0] != "h1.example.org" {
		t.Fatalf("h1's confirmation naming the standing marker not taken: %v", r.Confirmed)
	}
	if r := p.Poll(ctx, kv, log, gated, time.Now().Add(controller.ConfirmMaxAge+time.Minute)); len(r.Confirmed) != 0 {
		t.Fatalf("confirmations older than ConfirmMaxAge taken: %v", r.Confirmed)
	}
	if _, err := controller.ConfirmKey("bad host"); err == nil {
		t.Fatal("ConfirmKey took an invalid host name")
	}
}

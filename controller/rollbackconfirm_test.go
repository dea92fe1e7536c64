package controller_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"hvguard/controller"
	"hvguard/controller/controllertest"
)

// TestReadConfirmationsNATS: on a real control bucket, the runner's poll
// takes an operator's confirmation only if written after its first read
// of the bucket's last revision (the fresh tracker's start): one left
// from an earlier rollback, or one naming another host, confirms nothing.
func TestReadConfirmationsNATS(t *testing.T) {
	_, _, js := controllertest.JetStream(t)
	ctx := context.Background()
	kv, err := controller.EnsureControlBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	put := func(host, names string) {
		t.Helper()
		c := controller.RollbackConfirmation{Host: names, By: "test"}
		if names == host {
			if _, err := controller.WriteRollbackConfirmation(ctx, kv, c); err != nil {
				t.Fatal(err)
			}
			return
		}
		k, _ := controller.ConfirmKey(host)
		if _, err := kv.Put(ctx, k, []byte(`{"host":"`+names+`","by":"test"}`)); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	put("h1.example.org", "h1.example.org") // an earlier rollback's
	p := controller.NewConfirmPoll()
	gated := []string{"h1.example.org", "h2.example.org", "h3.example.org"}
	if got := p.Read(ctx, kv, log, gated); len(got) != 0 {
		t.Fatalf("the first poll (the baseline) confirmed %v", got)
	}
	if got := p.Read(ctx, kv, log, gated); len(got) != 0 {
		t.Fatalf("a confirmation from before the fresh start taken: %v", got)
	}
	put("h2.example.org", "h3.example.org") // names another host
	put("h3.example.org", "h3.example.org")
	got := p.Read(ctx, kv, log, gated)
	if len(got) != 1 || got[0] != "h3.example.org" {
		t.Fatalf("confirmed %v, want h3.example.org alone (h1's predates the start, h2's names h3)", got)
	}
	put("h1.example.org", "h1.example.org") // written again, after the start
	if got := p.Read(ctx, kv, log, gated); len(got) < 1 || got[0] != "h1.example.org" {
		t.Fatalf("h1's confirmation written after the start not taken: %v", got)
	}
	if _, err := controller.ConfirmKey("bad host"); err == nil {
		t.Fatal("ConfirmKey took an invalid host name")
	}
}

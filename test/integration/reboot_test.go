package integration

import (
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/lifecycle"
	"hvguard/proto"
)

// injectHV adds injected events to the agent's libvirt connection: the test
// driver sends no REBOOT events (libvirt-events.md), a guest reset on real
// QEMU sends 2–4 (test/realvirt covers those). Everything else is the real
// test driver.
type injectHV struct {
	agent.Hypervisor
	out chan lifecycle.Event
}

func newInjectHV(hv agent.Hypervisor, inject <-chan lifecycle.Event) *injectHV {
	h := &injectHV{Hypervisor: hv, out: make(chan lifecycle.Event, 256)}
	go func() {
		defer close(h.out)
		in := hv.Events()
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				h.out <- ev
			case ev := <-inject:
				h.out <- ev
			}
		}
	}()
	return h
}

func (h *injectHV) Events() <-chan lifecycle.Event { return h.out }

// TestGuestResetReportedOnce (issue 15): a guest reset's REBOOT events
// (three, as `virsh reset` sends) reach consumers as ONE rebooted
// (reboot-event) carrying reboot_events 3, not three; and a burst still
// held when the agent stops gracefully is published before it exits.
func TestGuestResetReportedOnce(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	reset, resetName := newDomain(t, wl, "reset")
	late, lateName := newDomain(t, wl, "reset-at-stop")
	host := "it-reset1.example.org"
	cfg := agentConfig(t, host, ns.ClientURL(), stateDir(t))
	cfg.Lifecycle.Window = agent.Duration(10 * time.Second) // bursts end RebootBurstGap after their last REBOOT
	inject := make(chan lifecycle.Event)
	stop := startAgent(t, cfg, agent.Options{WrapHypervisor: func(hv agent.Hypervisor) agent.Hypervisor {
		return newInjectHV(hv, inject)
	}})
	reboot := func(uuid, name string, n int) {
		for range n {
			inject <- lifecycle.Event{UUID: uuid, Name: name, Kind: lifecycle.KindReboot, Event: "REBOOT", At: time.Now()}
		}
	}
	nc := natsConn(t, ns.ClientURL())
	reboot(reset, resetName, 3)
	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { return count(byDomain(evs, reset), "rebooted") >= 1 })

	reboot(late, lateName, 2)
	time.Sleep(300 * time.Millisecond) // observed by the loop, well inside the 2 s burst gap
	must(t, stop())
	evs = deliverytest.Collect(t, nc, host, len(evs)+1, 5*time.Second).Events
	checkContiguous(t, evs)
	for uuid, want := range map[string]uint64{reset: 3, late: 2} {
		var got []proto.LifecycleEvent
		for _, e := range evs {
			if e.DomainUUID == uuid && e.Transition == proto.TransitionRebooted {
				got = append(got, e)
			}
		}
		if len(got) != 1 || got[0].Reason != "reboot-event" || got[0].RebootEvents != want || got[0].LibvirtEvent != "REBOOT" {
			t.Errorf("domain %s: rebooted reports %+v, want one reboot-event with reboot_events %d", uuid, got, want)
		}
	}
}

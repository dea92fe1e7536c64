package agent

import (
	"time"

	"hvguard/lifecycle"
)

// DelayEvents wraps hv so that each event is delivered after delay(ev)
// (0 = at once). It stands in, for the demo and tests, for the event-dispatch
// lag measured on loaded compute nodes (Nova's dispatch lagged up to 33 s,
// shared/reference/openstack.md) — the condition under which a delay-only
// debouncer reports a reboot as a stop. Events that share a delay keep their
// order. It is never used by the production agent.
func DelayEvents(hv Hypervisor, delay func(lifecycle.Event) time.Duration) Hypervisor {
	out := make(chan lifecycle.Event, 4096)
	go func() {
		for ev := range hv.Events() {
			if d := delay(ev); d > 0 {
				time.AfterFunc(d, func() { out <- ev })
				continue
			}
			out <- ev
		}
	}()
	return delayed{Hypervisor: hv, out: out}
}

type delayed struct {
	Hypervisor
	out chan lifecycle.Event
}

func (d delayed) Events() <-chan lifecycle.Event { return d.out }

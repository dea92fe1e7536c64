package controllertest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"hvguard/controller"
	"hvguard/controller/recovery"
)

// RecoveryCloud is an in-memory Nova/Cinder for host recovery's runner and
// daemon tests (their subject is the bucket, the leadership and the
// wiring; the core's tests cover the cloud's answers, the e2e tests the
// real cloud): host h0 with two boot-from-volume servers and an ephemeral
// one; evacuations land on h9 at once.
type RecoveryCloud struct {
	mu      sync.Mutex
	servers map[string]*recovery.Server
	volumes map[string]*recovery.VolumeInfo
	migs    []recovery.Migration
	forced  map[string]bool
	calls   []string
	next    int64
	// OnEvacuate, if set, runs after each evacuation (who: the caller).
	OnEvacuate func(who, id string)
}

// NewRecoveryCloud returns the cloud.
func NewRecoveryCloud() *RecoveryCloud {
	c := &RecoveryCloud{servers: map[string]*recovery.Server{}, volumes: map[string]*recovery.VolumeInfo{}, forced: map[string]bool{}, next: 10}
	for i, id := range []string{"s-bfv-1", "s-bfv-2", "s-eph"} {
		s := &recovery.Server{ID: id, Status: "ACTIVE", Host: "h0"}
		if i < 2 {
			v := fmt.Sprintf("vol-%d", i+1)
			s.VolumeBacked, s.Volumes = true, []string{v}
			c.volumes[v] = &recovery.VolumeInfo{ID: v, Attachments: []recovery.AttachmentInfo{{ID: "att-" + v, Server: id, Host: "h0"}}}
		}
		c.servers[id] = s
	}
	return c
}

// Count returns the calls made starting with prefix.
func (c *RecoveryCloud) Count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.calls {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// Calls returns every mutating call, "<call> by <who>".
func (c *RecoveryCloud) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// Forced reports whether host's service is forced down.
func (c *RecoveryCloud) Forced(host string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.forced[host]
}

// As returns the cloud as the controller who sees it (calls are tagged).
func (c *RecoveryCloud) As(who string) controller.RecoveryCloud { return &taggedCloud{c, who} }

type taggedCloud struct {
	c   *RecoveryCloud
	who string
}

func (t *taggedCloud) log(s string) {
	t.c.calls = append(t.c.calls, s+" by "+t.who)
}

func (t *taggedCloud) ForceDown(_ context.Context, host string, down bool) error {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.log(fmt.Sprintf("force-down=%v %s", down, host))
	t.c.forced[host] = down
	return nil
}

func (t *taggedCloud) HostServers(_ context.Context, host string) ([]recovery.Server, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	var out []recovery.Server
	for _, s := range t.c.servers {
		if s.Host == host {
			out = append(out, *s)
		}
	}
	return out, nil
}

func (t *taggedCloud) Server(_ context.Context, id string) (recovery.Server, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return *t.c.servers[id], nil
}

func (t *taggedCloud) Volume(_ context.Context, id string) (recovery.VolumeInfo, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	v := *t.c.volumes[id]
	v.Attachments = append([]recovery.AttachmentInfo(nil), v.Attachments...)
	return v, nil
}

func (t *taggedCloud) RemoveAttachment(_ context.Context, vol, att, host string) error {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.log("remove-attachment " + att)
	v := t.c.volumes[vol]
	for i, a := range v.Attachments {
		if a.ID == att {
			if a.Host != host {
				return fmt.Errorf("attachment %s is on %s, not %s", att, a.Host, host)
			}
			v.Attachments = append(v.Attachments[:i], v.Attachments[i+1:]...)
		}
	}
	return nil
}

func (t *taggedCloud) Evacuate(_ context.Context, id string) error {
	t.c.mu.Lock()
	t.log("evacuate " + id)
	s := t.c.servers[id]
	if !t.c.forced[s.Host] {
		t.c.mu.Unlock()
		return &controller.RecoveryError{Kind: recovery.ErrRefused, Err: fmt.Errorf("400 compute service of %s still in use", s.Host)}
	}
	t.c.next++
	t.c.migs = append(t.c.migs, recovery.Migration{ID: t.c.next, Instance: id, Source: s.Host, Dest: "h9", Status: "done", Type: "evacuation", Created: time.Now()})
	s.Host = "h9"
	hook := t.c.OnEvacuate
	t.c.mu.Unlock()
	if hook != nil {
		hook(t.who, id)
	}
	return nil
}

func (t *taggedCloud) Migrations(_ context.Context, host string, since time.Time) ([]recovery.Migration, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	var out []recovery.Migration
	for _, m := range t.c.migs {
		if m.Source == host && !m.Created.Before(since) {
			out = append(out, m)
		}
	}
	return out, nil
}

func (t *taggedCloud) HostNotification(context.Context, string, time.Time) (string, error) {
	return "", fmt.Errorf("not used")
}

func (t *taggedCloud) Notification(context.Context, string) (string, error) {
	return "", fmt.Errorf("not used")
}

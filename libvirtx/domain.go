package libvirtx

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"libvirt.org/go/libvirt"

	"hvguard/lifecycle"
)

// acquire takes a lease on the installed session, or fails fast with
// ErrNotConnected.
func (c *Conn) acquire() (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sess
	if s == nil || c.closed {
		return nil, ErrNotConnected
	}
	if s.dead.Load() != nil {
		return nil, fmt.Errorf("%w (%s)", ErrNotConnected, *s.dead.Load())
	}
	s.leases++
	return s, nil
}

// release drops a lease; the last lease on a retired session closes it.
func (c *Conn) release(s *session) {
	c.mu.Lock()
	s.leases--
	closeNow := s.retired && s.leases == 0 && !s.virtClosed
	if closeNow {
		s.virtClosed = true
	}
	c.mu.Unlock()
	if closeNow {
		if _, err := s.virt.Close(); err != nil {
			c.log.Debug("close retired connection", "reason", err.Error())
		}
	}
}

// boundedCall runs fn on s in its own goroutine, bounded by ctx and
// CallTimeout, and releases the lease on s when fn returns (even after the
// caller has given up on it). An error that libvirt classifies as
// connection loss marks s dead (the supervisor reconnects) and is returned
// wrapping ErrNotConnected too.
func boundedCall[T any](c *Conn, ctx context.Context, s *session, fn func(*libvirt.Connect) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		c.release(s)
		return zero, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer c.release(s)
		v, err := fn(s.virt)
		if err != nil && isConnLoss(err) {
			// Also when the caller has given up on this call.
			c.lost(s, "call failed: "+err.Error())
		}
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil && isConnLoss(r.err) {
			return zero, fmt.Errorf("%w: %w", ErrNotConnected, r.err)
		}
		return r.v, r.err
	case <-ctx.Done():
		c.abandoned.Add(1)
		return zero, fmt.Errorf("no answer from libvirt (call abandoned): %w", ctx.Err())
	}
}

// call is boundedCall on the installed session, with the error wrapped as
// "libvirtx: <op> <uuid>: ..." and libvirt's codes mapped to this package's
// sentinel errors.
func call[T any](c *Conn, ctx context.Context, op, uuid string, fn func(*libvirt.Connect) (T, error)) (T, error) {
	s, err := c.acquire()
	if err != nil {
		var zero T
		return zero, wrapErr(op, uuid, err)
	}
	v, err := boundedCall(c, ctx, s, fn)
	if err != nil {
		if ctx.Err() == nil && !isConnLoss(err) {
			// A timeout or a domain error: say so with the UUID.
			c.log.Debug("libvirt call failed", "domain_uuid", uuid, "reason", op+": "+err.Error())
		}
		return v, wrapErr(op, uuid, err)
	}
	return v, nil
}

func wrapErr(op, uuid string, err error) error {
	prefix := "libvirtx: " + op
	if uuid != "" {
		prefix += " " + uuid
	}
	switch {
	case isCode(err, libvirt.ERR_NO_DOMAIN):
		return fmt.Errorf("%s: %w: %w", prefix, ErrNoDomain, err)
	case isCode(err, libvirt.ERR_NO_DOMAIN_METADATA):
		return fmt.Errorf("%s: %w: %w", prefix, ErrNoMetadata, err)
	case isCode(err, libvirt.ERR_OPERATION_INVALID):
		return fmt.Errorf("%s: %w: %w", prefix, ErrInvalidState, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// withDomain looks the domain up by UUID, runs fn and frees the domain.
func withDomain[T any](uuid string, fn func(*libvirt.Domain) (T, error)) func(*libvirt.Connect) (T, error) {
	return func(v *libvirt.Connect) (T, error) {
		d, err := v.LookupDomainByUUIDString(uuid)
		if err != nil {
			var zero T
			return zero, err
		}
		defer d.Free()
		return fn(d)
	}
}

// domainOp runs a state-changing operation on one domain.
func (c *Conn) domainOp(ctx context.Context, op, uuid string, fn func(*libvirt.Domain) error) error {
	_, err := call(c, ctx, op, uuid, withDomain(uuid, func(d *libvirt.Domain) (struct{}, error) {
		return struct{}{}, fn(d)
	}))
	return err
}

// ListDomains returns every domain, active and inactive, with its state,
// sorted by UUID. A domain that disappears while being listed is left out.
func (c *Conn) ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error) {
	return call(c, ctx, "list domains", "", func(v *libvirt.Connect) ([]lifecycle.DomainSnapshot, error) {
		doms, err := v.ListAllDomains(0) // 0: active and inactive
		if err != nil {
			return nil, err
		}
		out := make([]lifecycle.DomainSnapshot, 0, len(doms))
		var firstErr error
		for i := range doms {
			snap, err := snapshot(&doms[i])
			_ = doms[i].Free()
			switch {
			case err == nil:
				out = append(out, snap)
			case isCode(err, libvirt.ERR_NO_DOMAIN):
				// Undefined meanwhile.
			case firstErr == nil:
				firstErr = err
			}
		}
		if firstErr != nil {
			return nil, firstErr
		}
		slices.SortFunc(out, func(a, b lifecycle.DomainSnapshot) int { return strings.Compare(a.UUID, b.UUID) })
		return out, nil
	})
}

func snapshot(d *libvirt.Domain) (lifecycle.DomainSnapshot, error) {
	uuid, err := d.GetUUIDString()
	if err != nil {
		return lifecycle.DomainSnapshot{}, err
	}
	name, err := d.GetName()
	if err != nil {
		return lifecycle.DomainSnapshot{}, err
	}
	st, _, err := d.GetState()
	if err != nil {
		return lifecycle.DomainSnapshot{}, err
	}
	return lifecycle.DomainSnapshot{UUID: strings.ToLower(uuid), Name: name, State: mapState(int(st))}, nil
}

// State returns the domain's current state; lifecycle.StateGone with a nil
// error when no domain has this UUID.
func (c *Conn) State(ctx context.Context, uuid string) (lifecycle.State, error) {
	st, err := call(c, ctx, "state", uuid, func(v *libvirt.Connect) (lifecycle.State, error) {
		d, err := v.LookupDomainByUUIDString(uuid)
		if isCode(err, libvirt.ERR_NO_DOMAIN) {
			return lifecycle.StateGone, nil
		}
		if err != nil {
			return lifecycle.StateUnknown, err
		}
		defer d.Free()
		s, _, err := d.GetState()
		if isCode(err, libvirt.ERR_NO_DOMAIN) {
			return lifecycle.StateGone, nil
		}
		if err != nil {
			return lifecycle.StateUnknown, err
		}
		return mapState(int(s)), nil
	})
	if err != nil {
		return lifecycle.StateUnknown, err
	}
	return st, nil
}

// Suspend pauses the domain's vCPUs (virDomainSuspend).
func (c *Conn) Suspend(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "suspend", uuid, (*libvirt.Domain).Suspend)
}

// Resume unpauses the domain (virDomainResume).
func (c *Conn) Resume(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "resume", uuid, (*libvirt.Domain).Resume)
}

// Destroy powers the domain off at once (virDomainDestroy). It never
// undefines the domain and never touches its disks. Destroying a domain
// that is not running fails with an error wrapping ErrInvalidState.
func (c *Conn) Destroy(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "destroy", uuid, (*libvirt.Domain).Destroy)
}

// Metadata returns the element-type metadata of the domain in namespaceURI
// (e.g. Nova's "http://openstack.org/xmlns/libvirt/nova/1.1"), from the
// live definition of a running domain, else the persistent one. libvirt
// returns the element WITHOUT its namespace prefix (Nova's
// <nova:instance xmlns:nova="..."> comes back as <instance>). It returns ""
// and an error wrapping ErrNoMetadata when there is none.
func (c *Conn) Metadata(ctx context.Context, uuid, namespaceURI string) (string, error) {
	return call(c, ctx, "metadata", uuid, withDomain(uuid, func(d *libvirt.Domain) (string, error) {
		return d.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, namespaceURI, libvirt.DOMAIN_AFFECT_CURRENT)
	}))
}

// SetMetadata sets the element-type metadata of the domain in namespaceURI,
// with the element prefix key, to xml (one element, written without a
// namespace prefix: libvirt adds key and namespaceURI). It changes the live
// definition of a running domain and the persistent one of a defined
// domain.
func (c *Conn) SetMetadata(ctx context.Context, uuid, namespaceURI, key, xml string) error {
	return c.domainOp(ctx, "set metadata", uuid, func(d *libvirt.Domain) error {
		active, err := d.IsActive()
		if err != nil {
			return err
		}
		persistent, err := d.IsPersistent()
		if err != nil {
			return err
		}
		var flags libvirt.DomainModificationImpact
		if active {
			flags |= libvirt.DOMAIN_AFFECT_LIVE
		}
		if persistent {
			flags |= libvirt.DOMAIN_AFFECT_CONFIG
		}
		return d.SetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, xml, key, namespaceURI, flags)
	})
}

// DefineXML defines (but does not start) a persistent domain and returns
// its UUID in canonical lower-case form. Used by tests and the demo.
func (c *Conn) DefineXML(ctx context.Context, xml string) (uuid string, err error) {
	return call(c, ctx, "define", "", func(v *libvirt.Connect) (string, error) {
		d, err := v.DomainDefineXML(xml)
		if err != nil {
			return "", err
		}
		defer d.Free()
		uuid, err := d.GetUUIDString()
		return strings.ToLower(uuid), err
	})
}

// Start boots a defined domain (virDomainCreate). Used by tests and the
// demo.
func (c *Conn) Start(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "start", uuid, (*libvirt.Domain).Create)
}

// Shutdown asks the guest to shut down (ACPI; virDomainShutdown) and
// returns without waiting for it. Used by tests and the demo.
func (c *Conn) Shutdown(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "shutdown", uuid, (*libvirt.Domain).Shutdown)
}

// Reboot asks the guest to reboot (virDomainReboot, default method). Used
// by tests and the demo. The test driver emits no event for it.
func (c *Conn) Reboot(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "reboot", uuid, func(d *libvirt.Domain) error { return d.Reboot(0) })
}

// Undefine removes the persistent definition (virDomainUndefine); a running
// domain keeps running as a transient one. Used by tests and the demo.
func (c *Conn) Undefine(ctx context.Context, uuid string) error {
	return c.domainOp(ctx, "undefine", uuid, (*libvirt.Domain).Undefine)
}

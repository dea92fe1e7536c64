// Package libvirtx is hvguard's only door to libvirt. It is the one package
// in the project that imports the cgo binding (libvirt.org/go/libvirt); every
// value it hands out is a plain Go value from package lifecycle, so nothing
// outside libvirtx ever holds a libvirt handle.
//
// # Threading model
//
// Event loop. libvirt delivers events, keepalive pings and close
// notifications from its "default event loop". The first Dial in the process
// registers that loop (virEventRegisterDefaultImpl, exactly once, before any
// connection is opened) and starts ONE goroutine that calls
// virEventRunDefaultImpl for the life of the process. A 1 s timeout handle
// runs on that loop: it stamps the loop heartbeat reported as
// Status.EventLoopTick (a stale tick means the loop is stuck) and guarantees
// that the loop iterates at least once a second. The loop is shared by all
// Conns and is not stopped by Conn.Close.
//
// Callbacks. Domain event callbacks and the close callback run on the event
// loop goroutine. They never block and never call libvirt APIs that go over
// the wire: they copy the UUID and name out of the borrowed *Domain (local
// accessors; the Domain is never kept or freed), map libvirt's numbers to
// names and a lifecycle.Kind, stamp time.Now() and do a non-blocking send on
// the buffered hand-off channel returned by Conn.Events. If that channel is
// full the event cannot be delivered: it is counted in Status.Overflows, a
// resync is signalled on Conn.ResyncNeeded and a warning is logged once per
// burst. Events are never silently lost: either they are delivered or a
// resync is requested.
//
// Supervisor. Each Conn owns one supervisor goroutine. It waits for a
// connection loss (close callback, or an API error classified as connection
// loss by its libvirt error code), tears the session down (deregister every
// callback, unregister the close callback, close), and reconnects forever
// with exponential backoff and jitter. Each NewConnect runs in its own
// goroutine bounded by Config.ConnectTimeout, because NewConnect blocks for
// as long as a hung (SIGSTOPped) libvirtd stays hung; the supervisor does not
// wait for it beyond the timeout and never starts a second attempt while one
// is still blocked. After a successful reconnect every callback is registered
// again and ResyncNeeded is signalled: events during the outage are gone, the
// consumer must call ListDomains and reconcile.
//
// Calls. Every query and operation (State, Suspend, Destroy, ...) runs in a
// goroutine bounded by Config.CallTimeout and the caller's context, so a hung
// daemon cannot wedge the caller. The call holds a lease on the session: a
// session torn down by the supervisor is closed by whoever drops the last
// lease, so a call never uses a freed connection. While disconnected, calls
// fail fast with an error wrapping ErrNotConnected.
//
// Goroutines left behind. Close stops the supervisor and waits for it. The
// only goroutines that can outlive Close are those stuck inside libvirt on a
// hung daemon: an abandoned NewConnect (its connection is closed if it ever
// returns), an abandoned call (it releases its lease when it returns) and an
// abandoned teardown. Status.Abandoned counts them. They end when the daemon
// resumes or dies, or when keepalive declares the connection dead.
//
// # Events
//
// Events carries lifecycle events (virConnectDomainEventRegisterAny with
// VIR_DOMAIN_EVENT_ID_LIFECYCLE, which includes the crash-related
// CRASHED/PANICKED and STOPPED/CRASHED events where the driver emits them)
// and REBOOT events (VIR_DOMAIN_EVENT_ID_REBOOT → lifecycle.KindReboot).
// Event and detail numbers are mapped by this package, not by the binding's
// String methods (which are wrong for SHUTDOWN details and CRASHED); unknown
// numbers become lifecycle.KindUnknown with names such as "EVENT_17" and
// "DETAIL_9". The Events channel is closed by Close.
package libvirtx

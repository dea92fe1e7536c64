// Package reconcile destroys the local copies of instances that Nova
// evacuated to another host while this node was cut off. Nova itself
// destroys them only in nova-compute's init_host
// (_destroy_evacuated_instances): a node that comes back with nova-compute still running, or
// whose nova-compute is slow to restart, runs both copies on one IP and one
// volume (4 h 22 min in the incident behind issue 4). hvguard does it within
// seconds: at agent start, on every rejoin (before any fenced domain is
// resumed) and periodically.
//
// # Shape
//
// Decide is a pure function (standard library only, no I/O, no clock: Now
// is in the Input). Its input is the local domains, every evacuation record
// Nova lists with this host as source (all pages, with a completeness
// flag), the lookup of each candidate server and this host's Nova names;
// its output is one DomainDecision per domain — Destroy, Keep or Skip —
// with a typed Reason and the Evidence it rests on. Candidates says which
// servers the caller must look up (the local Nova instances that have an
// evacuation record from this host). Runner is the I/O shell: it lists
// libvirt domains, reads their Nova metadata, asks Nova (the Nova
// interface; openstack.Client implements it), calls Decide, and carries out
// the Destroy decisions (power off, never undefine, never touch disks or
// volumes; then mark the domain's metadata in MarkNamespace), or only
// reports them in ModeReport. It returns a serialisable Report.
//
// # Evidence (both are required for a Destroy)
//
//  1. Nova lists an evacuation migration of this instance (domain UUID =
//     instance UUID; the domain carries Nova's <instance> metadata) whose
//     source_compute is this host, the NEWEST such record is in a status
//     Nova treats as evacuated (accepted, pre-migrating, done, or completed
//     — cleaned up by a nova-compute start), it has a destination, and no
//     record of this instance names this host as destination.
//  2. Nova's current host of the server (OS-EXT-SRV-ATTR:host) is set and
//     is the newest evacuation's destination, and the server has no task
//     state (not migrating, rebuilding, resizing: its host may be about to
//     change — a live migration back to this host has a domain here while
//     the host is still the other one). "Another host" is not enough: a
//     host name missing from Hosts may be this very node (nova-compute
//     renamed, nova_hosts stale), and the server back here under that name
//     is the live instance (issue 10). The destination is known not to be
//     this node: it is not one of Hosts, and no evacuation record of the
//     instance went to a host or compute node (dest_compute, dest_node)
//     that may be this machine: one of Hosts, Nodes (the machine's own
//     host name) or the source_node of the evacuations from this host (for
//     libvirt the machine's host name, which a CONF.host rename keeps), or
//     a name with the same first DNS label as one of them (a rename to the
//     FQDN: hv1 evacuated onto hv1.example.org, this very machine).
//
// # Invariants (what must always hold; property-tested)
//
//   - Never Destroy without both pieces of evidence; the Evidence of a
//     Destroy names the migration (id, uuid, status, destination) and the
//     server's host, which is that destination.
//   - Any ambiguity about one domain is a Skip for that domain (metadata
//     unreadable, server 404, host null, task state set, destination this
//     host or this node, no destination, newest evacuation not in an
//     evacuated status while the server is elsewhere, server on a host
//     other than that destination, lookup missing).
//   - A global ambiguity is no Destroy at all: Nova or keystone unreachable,
//     timeouts, 5xx, authentication failure (ReasonNovaUnavailable); 4xx
//     (ReasonNovaRejected); an answer of unexpected shape or at another
//     microversion (ReasonMalformedData); a listing not known to be
//     complete (ReasonPartialData); a record that does not match the
//     filters asked for, or listed twice (ReasonUnexpectedMigration); now
//     unset, earlier than the previous run, or a Nova timestamp more than
//     MaxClockSkew ahead (ReasonClockOddity); no host name
//     (ReasonNoHostName); libvirt unreachable (ReasonLibvirtUnavailable).
//     Decisions are taken only after all of Nova's data is in: Nova dying
//     mid-reconcile destroys nothing.
//   - Making the data worse (a failure, an incomplete listing, a lookup
//     missing or 404) never adds a Destroy.
//   - A domain that is not a Nova instance is never destroyed.
//   - Decide is deterministic; its decisions are sorted by UUID, one per
//     input domain; every decision has a Reason.
//
// # Host names
//
// Host names compare case-insensitively (strings.EqualFold). Nova on
// MariaDB/MySQL (the usual deployment; measured here) matches its string
// filters case-insensitively and cannot hold two hosts that differ only by
// case. Case-insensitivity can only make a Destroy less likely: the
// comparisons that allow a Destroy are "the server's host is NOT this host"
// and "the destination is NOT this host", which EqualFold makes stricter;
// "the source is this host" is Nova's own filter, checked again here.
//
// # Periodic cost
//
// One filtered, paged listing per host name. Then the candidates (local
// Nova instances with an evacuation record from this host: stale copies and
// servers evacuated and migrated back, whose old record stays) are found
// where their newest evacuation sent them: one paged servers listing per
// destination that received at least MinListingCandidates of them
// (PlanLookups), one GET per remaining candidate (few destinations, or not
// found on its destination: moved on, back, or deleted). A rejoin after a
// whole host was evacuated is O(pages), not O(domains). Stale
// copies that an earlier run stopped and marked for the same migration, and
// that are still off, are not looked up again (ReasonAlreadyStopped), so
// after a rejoin the periodic run is one request per page.
//
// # Resuming fenced domains
//
// Report.OK is false after any global problem or failed destroy: a fenced
// host stays fenced. Report.MayResume(uuid) is true only for a domain
// decided Keep (other than ReasonAlreadyStopped) in an OK report.
package reconcile

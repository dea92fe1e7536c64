// Package natsperm holds the least-privilege NATS permissions of hvguard's
// roles — agent (one set per host), controller and read-only consumer —
// and renders them as a nats-server configuration (an accounts block
// with one NKey user per agent, controller and reader) to include in the
// server's configuration. packaging/nats/hvguard-accounts.conf is its
// output for example users; `hvguard-controller nats-accounts` writes the
// one for a real fleet (docs/security.md, "NATS permissions").
//
// nats-server's configuration-file users cannot use permission templates
// (those exist only for JWT scoped signing keys), and an agent's subjects
// carry its host token, so every agent gets its own user with its own
// permissions.
package natsperm

import (
	"fmt"
	"sort"
	"strings"

	"hvguard/controller"
	"hvguard/controller/instancerecovery"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/proto"
)

// Role is what a NATS user of hvguard does.
type Role string

const (
	// RoleAgent is one compute node's hvguard-agent.
	RoleAgent Role = "agent"
	// RoleController is an hvguard-controller (every controller: one
	// leads, the others stand by).
	RoleController Role = "controller"
	// RoleReader is a read-only consumer (dashboards, `nats` CLI, tools):
	// it reads the event stream, the lease bucket and the live decision
	// and fence events, and writes nothing.
	RoleReader Role = "reader"
)

// Account is the NATS account of the agents, the event stream and the
// lease bucket (JetStream enabled): every role has a user there.
const Account = "HVGUARD"

// ControlAccount is the controllers' own NATS account (JetStream enabled):
// the leader lock, the guard's authoritative copy, the controllers'
// memory and the recovery buckets (ControlBuckets). No agent has a user
// there. A JetStream API answer is published in the account of the
// request (on the reply subject the requester names, with the server's
// rights), so an agent can have the server publish anything it stored on
// any subject of HVGUARD ("reflection", reviewer X12), but on none of
// this account's: docs/security.md, "The controllers' account".
const ControlAccount = "HVGUARD_CONTROL"

// Names of what the permissions cover.
const (
	kvPrefix     = "$KV." + fencing.Bucket + "."
	eventsStream = proto.StreamName
	jsAPI        = "$JS.API."
)

// ControllerKeys are the lease bucket's keys only controllers write (the
// guard and the leader lock). Agents may write every other key (their own
// record, and their peers' records they relay), never these.
var ControllerKeys = []string{fencing.GuardKey, controller.LeaderKey}

// Permissions are one user's publish and subscribe permissions (subjects
// with NATS wildcards; a deny wins over an allow).
type Permissions struct {
	PubAllow, PubDeny, SubAllow, SubDeny []string
}

// User is one NATS user: its role, its name (an agent's host name, a
// controller's id, a reader's name) and its NKey public key; controllers
// and readers have a second user in ControlAccount (ControlNKey).
type User struct {
	Role Role
	Name string
	NKey string
	// ControlNKey is the public key of the user's ControlAccount user
	// (controllers and readers; agents have none).
	ControlNKey string
}

// HasControl reports whether u's role has a user in ControlAccount.
func (u User) HasControl() bool { return u.Role == RoleController || u.Role == RoleReader }

// Agent returns host's permissions.
//
// Publish: its own lifecycle, reconcile, fence, beacon and withdrawal
// receipt subjects (only the host itself may publish its beacon and its
// receipts: fencing.Beacon, natslease.ReceiptMsg); the lease
// bucket's keys (its own record and relays of its peers' records — with
// signed records a relay can only carry what the owner signed) except the
// controller's keys; the JetStream API calls it makes: stream info of the
// event stream and of the lease bucket (the membership: natslease.
// Subjects), message gets of lease keys. No consumer (kvGet says why).
// Subscribe: only its own inbox prefix (proto.AgentInboxPrefix), so it
// sees no other client's replies. Nothing else: no stream or consumer
// management, no other host's events, no purge or delete of a stream.
func Agent(host string) (Permissions, error) {
	tok, err := proto.HostToken(host)
	if err != nil {
		return Permissions{}, err
	}
	p := Permissions{
		PubAllow: []string{
			proto.SubjectPrefix + "." + tok + "." + proto.KindLifecycle,
			proto.SubjectPrefix + "." + tok + "." + proto.KindReconcile,
			proto.SubjectPrefix + "." + tok + "." + proto.KindFence,
			proto.SubjectPrefix + "." + tok + "." + proto.KindBeacon,
			proto.SubjectPrefix + "." + tok + "." + proto.KindWithdrawn,
			kvPrefix + "*",
			jsAPI + "INFO",
			jsAPI + "STREAM.INFO." + eventsStream,
		},
		SubAllow: []string{proto.AgentInboxPrefix(host) + ".>"},
	}
	p.PubAllow = append(p.PubAllow, kvGet(fencing.Bucket)...)
	for _, k := range ControllerKeys {
		p.PubDeny = append(p.PubDeny, kvPrefix+k)
	}
	return p, nil
}

// ControlBuckets are the KV buckets of ControlAccount, which only
// controllers write: the leader lock and the guard's authoritative copy
// (controller.ControlBucket), host recovery's progress, instance
// recovery's records, the controllers' memory (controller.MemoryBucket).
var ControlBuckets = []string{controller.ControlBucket, recovery.Bucket, instancerecovery.Bucket, controller.MemoryBucket}

// kvRead is the JetStream API a KV reader of bucket uses: stream info,
// message gets, ordered consumers (watch, keys) and their deletion. No
// direct gets: the server publishes a direct get's answer (a stored
// message, headers included) on whatever reply subject the requester
// names, and on a JetStream API subject that answer is executed as an API
// request with the server's rights (reviewer X14: an agent deleted the
// lease bucket and the event stream so). hvguard's buckets forbid direct
// gets (natslease.HardenStream) and nats.go's KV reads then use the
// message get, whose answer is JSON.
func kvRead(bucket string) []string {
	st := "KV_" + bucket
	return append(kvGet(bucket),
		jsAPI+"CONSUMER.CREATE."+st+".>",
		jsAPI+"CONSUMER.DELETE."+st+".>")
}

// kvGet is kvRead without consumers: what an agent may do on the lease
// bucket. A push consumer's config names its deliver subject, and it
// delivers the stored messages (an agent's own value, headers included)
// to any subject with a literal subscription in the account, the
// server's own internal ones among them: on
// $JS.API.CONSUMER.RESET.<stream>.<consumer> a delivered {"seq":N} reset
// the controllers' event consumer past every event (reviewer X15). The
// agents list the membership from the stream info (natslease.Subjects).
func kvGet(bucket string) []string {
	st := "KV_" + bucket
	return []string{
		jsAPI + "STREAM.INFO." + st,
		jsAPI + "STREAM.MSG.GET." + st,
	}
}

// Controller returns a controller's permissions in Account: everything on
// the lease bucket (it declares, releases, publishes the guard's copy the
// agents read), its durable consumer on the event stream (create, info,
// fetch, ack, delete: it starts a fresh one at start), its event subjects
// hvguard.v1._controller.> (decisions, host and instance recovery),
// replies on the default inbox prefix, the agents' beacons
// (hvguard.v1.*.beacon), the stream info and message gets of hosts'
// withdrawal receipts streams (receiptReads). Its own state is in
// ControlAccount (ControllerControl).
func Controller(hosts []string) (Permissions, error) {
	p := Permissions{
		PubAllow: []string{
			proto.SubjectPrefix + "._controller.>",
			jsAPI + "INFO",
			jsAPI + "STREAM.INFO." + eventsStream,
			jsAPI + "CONSUMER.CREATE." + eventsStream + ".>",
			jsAPI + "CONSUMER.DURABLE.CREATE." + eventsStream + ".>",
			jsAPI + "CONSUMER.DELETE." + eventsStream + ".>",
			jsAPI + "CONSUMER.INFO." + eventsStream + ".>",
			jsAPI + "CONSUMER.MSG.NEXT." + eventsStream + ".>",
			"$JS.ACK." + eventsStream + ".>",
			"$JS.FC.>",
		},
		// The agents' beacons (fencing.Beacon, controller/invalid.go).
		SubAllow: []string{"_INBOX.>", proto.BeaconWildcard},
	}
	p.PubAllow = append(p.PubAllow, kvPrefix+">")
	p.PubAllow = append(p.PubAllow, kvRead(fencing.Bucket)...)
	p.PubAllow = append(p.PubAllow, kvDirect(fencing.Bucket))
	r, err := receiptReads(hosts)
	p.PubAllow = append(p.PubAllow, r...)
	return p, err
}

// receiptReads are the stream info and message gets of hosts' own
// withdrawal receipts streams (proto.WithdrawalStreamOf) and of the older
// shared one (natslease.ReadHostReceipts reads a host's receipts there
// until it has its own stream). Each stream is named: a NATS wildcard
// matches whole tokens only, and a stream name is one token.
func receiptReads(hosts []string) ([]string, error) {
	out := []string{
		jsAPI + "STREAM.INFO." + proto.WithdrawalStream,
		jsAPI + "STREAM.MSG.GET." + proto.WithdrawalStream,
	}
	for _, h := range hosts {
		name, err := proto.WithdrawalStreamOf(h)
		if err != nil {
			return nil, err
		}
		out = append(out, jsAPI+"STREAM.INFO."+name, jsAPI+"STREAM.MSG.GET."+name)
	}
	return out, nil
}

// kvDirect is the direct get of bucket: controllers only (kvRead says why
// nobody else), so that a controller still reads a bucket provisioned
// without --no-allow-direct (natslease.StreamWarning reports it).
func kvDirect(bucket string) string { return jsAPI + "DIRECT.GET.KV_" + bucket + ".>" }

// ControllerControl returns a controller's permissions in ControlAccount:
// everything on ControlBuckets (the leader lock, the guard, the memory,
// host and instance recovery's records) and replies on the default inbox
// prefix.
func ControllerControl() Permissions {
	p := Permissions{
		PubAllow: []string{jsAPI + "INFO", "$JS.FC.>"},
		SubAllow: []string{"_INBOX.>"},
	}
	for _, b := range ControlBuckets {
		p.PubAllow = append(p.PubAllow, "$KV."+b+".>")
		p.PubAllow = append(p.PubAllow, kvRead(b)...)
		p.PubAllow = append(p.PubAllow, kvDirect(b))
	}
	return p
}

// ReaderControl returns a read-only consumer's permissions in
// ControlAccount: reads and live updates of ControlBuckets.
func ReaderControl() Permissions {
	p := Permissions{
		PubAllow: []string{jsAPI + "INFO", "$JS.FC.>"},
		SubAllow: []string{"_INBOX.>"},
	}
	for _, b := range ControlBuckets {
		p.PubAllow = append(p.PubAllow, kvRead(b)...)
		p.SubAllow = append(p.SubAllow, "$KV."+b+".>")
	}
	return p
}

// Reader returns a read-only consumer's permissions in Account: live
// subscriptions to hvguard's subjects (events, fence, decision and
// recovery events) and to the lease bucket's updates, stream info, message
// gets (no direct gets: kvRead), and its own ephemeral consumers on the event stream and the
// bucket; replies on the default inbox prefix (the controllers' buckets:
// ReaderControl). The controllers' durable consumers (named
// after the controllers' ids) are denied so a reader can neither change
// nor delete them. It reads hosts' withdrawal receipts (receiptReads).
func Reader(controllers, hosts []string) (Permissions, error) {
	p := Permissions{
		PubAllow: []string{
			jsAPI + "INFO",
			jsAPI + "STREAM.INFO." + eventsStream,
			jsAPI + "STREAM.MSG.GET." + eventsStream,
			jsAPI + "CONSUMER.CREATE." + eventsStream + ".>",
			"$JS.FC.>",
		},
		SubAllow: []string{"_INBOX.>", proto.SubjectPrefix + ".>"},
	}
	p.PubAllow = append(p.PubAllow, kvRead(fencing.Bucket)...)
	p.SubAllow = append(p.SubAllow, kvPrefix+">")
	p.PubDeny = durableDenies(controllers)
	r, err := receiptReads(hosts)
	p.PubAllow = append(p.PubAllow, r...)
	return p, err
}

// durableDenies denies the management of the controllers' durable
// consumers on the event stream.
func durableDenies(controllers []string) []string {
	var out []string
	for _, id := range controllers {
		d := controller.DurableName(id)
		out = append(out,
			jsAPI+"CONSUMER.CREATE."+eventsStream+"."+d,
			jsAPI+"CONSUMER.CREATE."+eventsStream+"."+d+".>",
			jsAPI+"CONSUMER.DELETE."+eventsStream+"."+d)
	}
	return out
}

// PermissionsOf returns u's permissions; controllers are the
// controllers' ids (for the readers' denies), hosts the agents' (whose
// receipts streams controllers and readers read).
func PermissionsOf(u User, controllers, hosts []string) (Permissions, error) {
	switch u.Role {
	case RoleAgent:
		return Agent(u.Name)
	case RoleController:
		return Controller(hosts)
	case RoleReader:
		return Reader(controllers, hosts)
	}
	return Permissions{}, fmt.Errorf("role %q: must be agent, controller or reader", u.Role)
}

// ControlPermissionsOf returns the permissions of u's ControlAccount user
// (ok false: its role has none).
func ControlPermissionsOf(u User) (p Permissions, ok bool) {
	switch u.Role {
	case RoleController:
		return ControllerControl(), true
	case RoleReader:
		return ReaderControl(), true
	}
	return Permissions{}, false
}

// Render returns the accounts block for users (sorted by role, then
// name), ready to include in a nats-server configuration.
func Render(users []User, header string) (string, error) {
	us := append([]User(nil), users...)
	order := map[Role]int{RoleController: 0, RoleAgent: 1, RoleReader: 2}
	sort.SliceStable(us, func(i, j int) bool {
		if order[us[i].Role] != order[us[j].Role] {
			return order[us[i].Role] < order[us[j].Role]
		}
		return us[i].Name < us[j].Name
	})
	var controllers, hosts []string
	for _, u := range us {
		switch u.Role {
		case RoleController:
			controllers = append(controllers, u.Name)
		case RoleAgent:
			hosts = append(hosts, u.Name)
		}
	}
	var b strings.Builder
	b.WriteString(header)
	fmt.Fprintf(&b, "accounts {\n  %s {\n    jetstream: enabled\n    users: [\n", Account)
	for _, u := range us {
		p, err := PermissionsOf(u, controllers, hosts)
		if err != nil {
			return "", fmt.Errorf("user %q: %w", u.Name, err)
		}
		if err := user(&b, u, u.NKey, "", p); err != nil {
			return "", err
		}
	}
	fmt.Fprintf(&b, "    ]\n  }\n  %s {\n    jetstream: enabled\n    users: [\n", ControlAccount)
	for _, u := range us {
		p, ok := ControlPermissionsOf(u)
		if !ok {
			continue
		}
		if err := user(&b, u, u.ControlNKey, " (controllers' account)", p); err != nil {
			return "", err
		}
	}
	b.WriteString("    ]\n  }\n}\n")
	return b.String(), nil
}

// user writes one user entry.
func user(b *strings.Builder, u User, nkey, what string, p Permissions) error {
	if !strings.HasPrefix(nkey, "U") {
		return fmt.Errorf("user %s %q%s: nkey %q is not a user public key", u.Role, u.Name, what, nkey)
	}
	fmt.Fprintf(b, "      # %s %s%s\n      {\n        nkey: %s\n        permissions: {\n", u.Role, u.Name, what, nkey)
	list(b, "publish", p.PubAllow, p.PubDeny)
	list(b, "subscribe", p.SubAllow, p.SubDeny)
	b.WriteString("        }\n      }\n")
	return nil
}

func list(b *strings.Builder, what string, allow, deny []string) {
	fmt.Fprintf(b, "          %s: {\n", what)
	for _, l := range []struct {
		name string
		subs []string
	}{{"allow", allow}, {"deny", deny}} {
		if len(l.subs) == 0 {
			continue
		}
		q := make([]string, len(l.subs))
		for i, s := range l.subs {
			q[i] = fmt.Sprintf("%q", s)
		}
		fmt.Fprintf(b, "            %s: [\n              %s\n            ]\n", l.name, strings.Join(q, "\n              "))
	}
	fmt.Fprintf(b, "          }\n")
}

// ParseUser parses a user given as "role:name" (agent:HOST,
// controller:ID, reader:NAME); the key is filled in later.
func ParseUser(spec string) (User, error) {
	role, name, ok := strings.Cut(spec, ":")
	u := User{Role: Role(role), Name: name}
	if !ok || name == "" {
		return u, fmt.Errorf("%q: want role:name (agent:HOST, controller:ID or reader:NAME)", spec)
	}
	switch u.Role {
	case RoleAgent:
		if _, err := proto.HostToken(name); err != nil {
			return u, fmt.Errorf("%q: %w", spec, err)
		}
	case RoleController, RoleReader:
		for _, r := range name {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
				return u, fmt.Errorf("%q: name may only have letters, digits, '-', '_', '.'", spec)
			}
		}
	default:
		return u, fmt.Errorf("%q: role %q must be agent, controller or reader", spec, role)
	}
	return u, nil
}

// SeedFile is the name of u's NKey seed file in a keys directory.
func SeedFile(u User) string { return string(u.Role) + "-" + u.Name + ".nk" }

// ControlSeedFile is the name of the NKey seed file of u's ControlAccount
// user (User.HasControl) in a keys directory.
func ControlSeedFile(u User) string { return string(u.Role) + "-" + u.Name + ".control.nk" }

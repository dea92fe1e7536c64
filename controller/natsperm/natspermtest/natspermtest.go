// Package natspermtest starts nats-server with hvguard's shipped
// least-privilege permissions (packaging/nats/hvguard-accounts.conf) for
// tests, and connects as its example users (their seeds are in
// controller/natsperm/testdata/example-users.txt): agents
// compute-1.example.org … compute-3.example.org, controllers ctl-1 and
// ctl-2, reader dashboard.
package natspermtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/natsperm"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// repo returns the repository's root (from this file's location).
func repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// ShippedAccounts is the shipped accounts file's path.
func ShippedAccounts() string {
	return filepath.Join(repo(), "packaging", "nats", "hvguard-accounts.conf")
}

// SeedsFile is the example users' seeds.
func SeedsFile() string {
	return filepath.Join(repo(), "controller", "natsperm", "testdata", "example-users.txt")
}

const adminPassword = "admin-only-for-provisioning"

// Agents are the example agents' hosts (users agent:HOST): the receipts
// stream StartServer provisions captures their subjects.
var Agents = []string{"compute-1.example.org", "compute-2.example.org", "compute-3.example.org"}

// StartServer starts nats-server the way an operator provisions it: first
// with an admin user in the HVGUARD account to create the event stream,
// the withdrawal receipts' stream and the buckets (lease, host recovery,
// instance recovery), then, on the same
// store, with only the shipped accounts file included (copied verbatim
// next to the main configuration). It returns the client URL; the server
// stops when the test ends. provision, if given, runs last in the first
// phase, as the HVGUARD account's admin (e.g. to provision an older
// release's receipts stream: OlderReceiptsStream).
func StartServer(t testing.TB, provision ...func(context.Context, jetstream.JetStream) error) string {
	t.Helper()
	return startServer(t, 0, 0, provision...)
}

// StartServerCapped is StartServer with the HVGUARD account's JetStream
// file storage capped at accountMaxFile bytes in the accounts file (which
// the shipped one is not: docs/security.md, "Withdrawal receipts"), its
// event stream 1 MiB.
func StartServerCapped(t testing.TB, accountMaxFile int64, provision ...func(context.Context, jetstream.JetStream) error) string {
	t.Helper()
	return startServer(t, accountMaxFile, 0, provision...)
}

// StartServerStoreCapped is StartServer on a server whose JetStream file
// storage is capped at maxFileStore bytes (max_file_store: every server
// has one, by default 75% of its disk), the accounts as shipped, its
// event stream 1 MiB.
func StartServerStoreCapped(t testing.TB, maxFileStore int64, provision ...func(context.Context, jetstream.JetStream) error) string {
	t.Helper()
	return startServer(t, 0, maxFileStore, provision...)
}

func startServer(t testing.TB, accountMaxFile, maxFileStore int64, provision ...func(context.Context, jetstream.JetStream) error) string {
	t.Helper()
	dir := t.TempDir()
	store := filepath.Join(dir, "js")
	start := func(conf string) *server.Server {
		main := filepath.Join(dir, "nats-server.conf")
		if err := os.WriteFile(main, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		o, err := server.ProcessConfigFile(main)
		if err != nil {
			t.Fatalf("nats-server config: %v", err)
		}
		o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		return s
	}
	js := fmt.Sprintf("jetstream: {store_dir: %q}\n", store)
	if maxFileStore > 0 {
		js = fmt.Sprintf("jetstream: {store_dir: %q, max_file_store: %d}\n", store, maxFileStore)
	}
	admin := start(js + fmt.Sprintf("accounts { %s { jetstream: enabled, users: [{user: admin, password: %s}] }, %s { jetstream: enabled, users: [{user: cadmin, password: %s}] } }\n",
		natsperm.Account, adminPassword, natsperm.ControlAccount, adminPassword))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	as := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(admin.ClientURL(), nats.UserInfo(user, adminPassword))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		j, _ := jetstream.New(nc)
		return j
	}
	j := as("admin") // HVGUARD: the event stream, the lease bucket
	events := delivery.StreamConfig(1)
	if accountMaxFile > 0 || maxFileStore > 0 {
		events.MaxBytes = 1 << 20 // within the cap
	}
	if _, err := j.CreateStream(ctx, events); err != nil {
		t.Fatal(err)
	}
	if _, err := natslease.CreateBucket(ctx, j, 1); err != nil {
		t.Fatal(err)
	}
	for _, h := range Agents { // each agent's withdrawal receipts
		if _, err := natslease.EnsureWithdrawalStream(ctx, j, h); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range provision {
		if err := p(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	cj := as("cadmin") // HVGUARD_CONTROL: the controllers' buckets
	if _, err := controller.EnsureControlBuckets(ctx, cj, true); err != nil {
		t.Fatal(err)
	}
	if _, err := controller.EnsureInstanceBucket(ctx, cj, true); err != nil {
		t.Fatal(err)
	}
	admin.Shutdown()
	admin.WaitForShutdown()

	shipped, err := os.ReadFile(ShippedAccounts())
	if err != nil {
		t.Fatal(err)
	}
	if accountMaxFile > 0 { // HVGUARD is the shipped file's first account
		shipped = []byte(strings.Replace(string(shipped), "jetstream: enabled", fmt.Sprintf("jetstream: {max_file: %d, max_mem: 0}", accountMaxFile), 1))
	}
	if err := os.WriteFile(filepath.Join(dir, "hvguard-accounts.conf"), shipped, 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(js + "include ./hvguard-accounts.conf\n")
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// Seeds returns the example users' seeds by "role:name" (and
// "role:name:control": a controller's or reader's user in the controllers'
// account).
func Seeds(t testing.TB) map[string]string {
	t.Helper()
	_, seeds, err := natsperm.ReadSeeds(SeedsFile())
	if err != nil {
		t.Fatal(err)
	}
	return seeds
}

// SeedFile writes user's ("role:name", or "role:name:control") example seed to a new file (mode
// 0600) for nats.nkey_seed_file and returns its path.
func SeedFile(t testing.TB, user string) string {
	t.Helper()
	s, ok := Seeds(t)[user]
	if !ok {
		t.Fatalf("no example user %s (see %s)", user, SeedsFile())
	}
	p := filepath.Join(t.TempDir(), "nats.nk")
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Connect connects to url as user ("role:name", or "role:name:control")
// with its NKey (an agent
// with its inbox prefix, as the agent connects) and opts; closed when the
// test ends.
func Connect(t testing.TB, url, user string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(SeedFile(t, user))
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]nats.Option{o}, opts...)
	if host, ok := strings.CutPrefix(user, string(natsperm.RoleAgent)+":"); ok {
		opts = append(opts, nats.CustomInboxPrefix(proto.AgentInboxPrefix(host)))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// SharedReceiptsConfig is the receipts stream the previous release
// provisioned for Agents: one stream (proto.WithdrawalStream) naming
// every agent's subject, each kept as a host's own stream keeps it — one
// that cannot vouch for its receipts, since the agents share its ingest
// queue (natslease.ReceiptsUnsound: reviewer X60).
func SharedReceiptsConfig() jetstream.StreamConfig {
	cfg, err := natslease.WithdrawalStreamConfig(1, Agents[0])
	if err != nil {
		panic(err) // Agents are valid host names
	}
	cfg.Name, cfg.Subjects = proto.WithdrawalStream, nil
	for _, h := range Agents {
		subj, _ := proto.WithdrawnSubject(h)
		cfg.Subjects = append(cfg.Subjects, subj)
	}
	return cfg
}

// OlderReceiptsConfig is the receipts stream the release before that
// provisioned: capturing hvguard.v1.*.withdrawn within one stream-wide
// limit of maxBytes (it shipped 256 MiB), DiscardNew — one that cannot
// vouch for its receipts (natslease.ReceiptsUnsound: reviewer X58).
func OlderReceiptsConfig(maxBytes int64) jetstream.StreamConfig {
	cfg := SharedReceiptsConfig()
	cfg.Subjects, cfg.MaxBytes = []string{proto.WithdrawnWildcard}, maxBytes
	return cfg
}

// replaceReceiptStreams deletes the agents' own receipts streams and
// creates cfg in their place.
func replaceReceiptStreams(ctx context.Context, j jetstream.JetStream, cfg jetstream.StreamConfig) error {
	if err := DeleteReceiptsStreams(ctx, j); err != nil {
		return err
	}
	_, err := j.CreateStream(ctx, cfg)
	return err
}

// DeleteReceiptsStreams deletes the agents' own receipts streams (a
// cluster that never provisioned them).
func DeleteReceiptsStreams(ctx context.Context, j jetstream.JetStream) error {
	for _, h := range Agents {
		name, _ := proto.WithdrawalStreamOf(h)
		if err := j.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
	}
	return nil
}

// SharedReceiptsStream replaces the agents' own receipts streams by the
// previous release's shared one (SharedReceiptsConfig).
func SharedReceiptsStream(ctx context.Context, j jetstream.JetStream) error {
	return replaceReceiptStreams(ctx, j, SharedReceiptsConfig())
}

// OlderReceiptsStream replaces the agents' own receipts streams by the
// wildcard one of the release before (OlderReceiptsConfig, 256 MiB).
func OlderReceiptsStream(ctx context.Context, j jetstream.JetStream) error {
	return replaceReceiptStreams(ctx, j, OlderReceiptsConfig(256<<20))
}

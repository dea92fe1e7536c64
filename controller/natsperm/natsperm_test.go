package natsperm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"hvguard/controller"
)

// SamplePath is the shipped sample, relative to this package.
const SamplePath = "../../packaging/nats/hvguard-accounts.conf"

// The shipped sample is what Render makes of the example users: the
// permissions in the packages are the code's. HVGUARD_UPDATE_SAMPLE=1
// rewrites it.
func TestShippedSampleUpToDate(t *testing.T) {
	users, _, err := ReadSeeds("testdata/example-users.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(users, SampleHeader)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("HVGUARD_UPDATE_SAMPLE") == "1" {
		if err := os.WriteFile(SamplePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(SamplePath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not Render's output for the example users; run HVGUARD_UPDATE_SAMPLE=1 go test -run TestShippedSampleUpToDate ./controller/natsperm/", SamplePath)
	}
	// nats-server parses it (as included from a server configuration).
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hvguard-accounts.conf"), got, 0o600); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(main, []byte("jetstream: {store_dir: \""+dir+"\"}\ninclude ./hvguard-accounts.conf\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatal(err)
	}
	want2 := len(users)
	for _, u := range users {
		if u.HasControl() {
			want2++ // and its user in the controllers' account
		}
	}
	if len(o.Nkeys) != want2 {
		t.Fatalf("%d nkey users parsed, want %d", len(o.Nkeys), want2)
	}
	for _, n := range o.Nkeys {
		if n.Account == nil {
			t.Fatalf("user %s has no account", n.Nkey)
		}
		ctl := strings.Contains(strings.Join(n.Permissions.Publish.Allow, " "), "KV_"+controller.ControlBucket)
		if ctl != (n.Account.Name == ControlAccount) {
			t.Errorf("user %s in account %s: control buckets in its permissions: %t", n.Nkey, n.Account.Name, ctl)
		}
	}
}

// Agents may publish only their own subjects and never the controllers'
// keys; a bad spec or host is refused with the reason.
func TestAgentPermissions(t *testing.T) {
	p, err := Agent("compute-1.example.org")
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(p.PubAllow, " ")
	for _, want := range []string{"hvguard.v1.compute-1_example_org.lifecycle", "$KV.hvguard-leases.*"} {
		if !strings.Contains(all, want) {
			t.Errorf("publish allow lacks %s: %v", want, p.PubAllow)
		}
	}
	if strings.Contains(all, "hvguard.v1.*") || strings.Contains(all, "hvguard.v1.>") || strings.Contains(all, "STREAM.CREATE") {
		t.Errorf("too broad: %v", p.PubAllow)
	}
	if strings.Join(p.PubDeny, " ") != "$KV.hvguard-leases._guard $KV.hvguard-leases._leader" {
		t.Errorf("deny %v", p.PubDeny)
	}
	if len(p.SubAllow) != 1 || p.SubAllow[0] != "_INBOX.hvguard-agent.compute-1_example_org.>" {
		t.Errorf("subscribe %v", p.SubAllow)
	}
	for _, bad := range []string{"agent", "agent:", "admin:x", "agent:bad host", "reader:a b"} {
		if _, err := ParseUser(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// KeyPair creates a seed (0600) once and reads it back afterwards.
func TestKeyPair(t *testing.T) {
	dir := t.TempDir()
	u, err := ParseUser("agent:compute-9.example.org")
	if err != nil {
		t.Fatal(err)
	}
	created, err := KeyPair(dir, &u)
	if err != nil || len(created) != 1 || !strings.HasPrefix(u.NKey, "U") || u.ControlNKey != "" {
		t.Fatalf("%v %v %+v", created, err, u)
	}
	st, err := os.Stat(filepath.Join(dir, SeedFile(u)))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("seed file: %v %v", st.Mode(), err)
	}
	pub := u.NKey
	created, err = KeyPair(dir, &u)
	if err != nil || len(created) != 0 || u.NKey != pub {
		t.Fatalf("second call: %v %v %s != %s", created, err, u.NKey, pub)
	}
	// A controller has a second user, in the controllers' account.
	c, _ := ParseUser("controller:ctl-9")
	created, err = KeyPair(dir, &c)
	if err != nil || len(created) != 2 || !strings.HasPrefix(c.ControlNKey, "U") || c.ControlNKey == c.NKey ||
		created[1] != filepath.Join(dir, "controller-ctl-9.control.nk") {
		t.Fatalf("controller: %v %v %+v", created, err, c)
	}
}

package keyfile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hvguard/fencing"
	"hvguard/fencing/keyfile"
)

func TestGenerateLoadAndSign(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys", "host.seed")
	pub, err := keyfile.Generate(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("seed file mode: %v %v", fi.Mode(), err)
	}
	if _, err := keyfile.Generate(path); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("Generate overwrote an existing seed: %v", err)
	}
	s, err := keyfile.Signer(path)
	if err != nil || s.ID != pub {
		t.Fatalf("Signer: %+v %v (public %s)", s.ID, err, pub)
	}
	k, err := keyfile.Public(pub)
	if err != nil {
		t.Fatal(err)
	}
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{"h0": {k}}}
	r := s.Seal(fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseActive}, 3)
	if err := ring.VerifyRecord(r); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := keyfile.Signer(path); err == nil || !strings.Contains(err.Error(), "0640") || !strings.Contains(err.Error(), path) {
		t.Fatalf("a group-readable seed was accepted or the error names neither file nor mode: %v", err)
	}
}

func TestHostKeys(t *testing.T) {
	dir := t.TempDir()
	a, _ := keyfile.Generate(filepath.Join(dir, "a"))
	b, _ := keyfile.Generate(filepath.Join(dir, "b"))
	path := filepath.Join(dir, "hosts")
	os.WriteFile(path, []byte("# fleet\nnode1 "+a+"\n\nnode2 "+a+" "+b+"\n"), 0o644)
	keys, err := keyfile.HostKeys(path)
	if err != nil || len(keys["node1"]) != 1 || len(keys["node2"]) != 2 {
		t.Fatalf("%v %v", keys, err)
	}
	for _, bad := range []string{"node1\n", "node1 SUAXXX\n", "node1 " + a + " nope\n"} {
		os.WriteFile(path, []byte(bad), 0o644)
		if _, err := keyfile.HostKeys(path); err == nil || !strings.Contains(err.Error(), path+":1") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := keyfile.Publics("fence.controller_keys", []string{a, "x"}); err == nil || !strings.Contains(err.Error(), "fence.controller_keys[1]") {
		t.Errorf("Publics: %v", err)
	}
}

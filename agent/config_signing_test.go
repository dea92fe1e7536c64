package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"hvguard/fencing/keyfile"
)

// TestSigningConfigValidation: every problem of fence.signing names the
// field and the value; a valid section loads the key and the keyring.
func TestSigningConfigValidation(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef-long-enough\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seed, ctl := filepath.Join(dir, "agent.seed"), filepath.Join(dir, "ctl.seed")
	pub, _ := keyfile.Generate(seed)
	ctlPub, _ := keyfile.Generate(ctl)
	other, _ := keyfile.Generate(filepath.Join(dir, "other.seed"))
	hosts := filepath.Join(dir, "host_keys")
	os.WriteFile(hosts, []byte("node1.example.org "+pub+"\n"), 0o644)
	wrong := filepath.Join(dir, "wrong_keys")
	os.WriteFile(wrong, []byte("node1.example.org "+other+"\n"), 0o644)
	valid := SigningConfig{Mode: "required", KeyFile: seed, ControllerKeys: []string{ctlPub}, HostKeysFile: hosts}
	for _, tc := range []struct {
		name, want string
		mod        func(*SigningConfig)
	}{
		{"mode", `fence.signing.mode: "always": must be off, optional or required`, func(s *SigningConfig) { s.Mode = "always" }},
		{"nokey", `fence.signing.key_file: "` + filepath.Join(dir, "none") + `"`, func(s *SigningConfig) { s.KeyFile = filepath.Join(dir, "none") }},
		{"noctl", "fence.signing.controller_keys: []: required with signing required", func(s *SigningConfig) { s.ControllerKeys = nil }},
		{"badctl", "fence.signing.controller_keys[0]", func(s *SigningConfig) { s.ControllerKeys = []string{"nope"} }},
		{"nohosts", `fence.signing.host_keys_file: "": required`, func(s *SigningConfig) { s.HostKeysFile = "" }},
		{"notlisted", "is not listed for host node1.example.org", func(s *SigningConfig) { s.HostKeysFile = wrong }},
		{"lying", "fence.signing.lying_peers: -1: must not be negative", func(s *SigningConfig) { s.LyingPeers = ptr(-1) }},
		{"lyingoff", "fence.signing.lying_peers: 1: needs signing", func(s *SigningConfig) { *s = SigningConfig{Mode: "off", LyingPeers: ptr(1)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Host = "node1.example.org"
			c.Fence.Enabled, c.Fence.PeerSecretFile = true, secret
			c.Fence.Signing = valid
			tc.mod(&c.Fence.Signing)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	c := DefaultConfig()
	c.Host = "node1.example.org"
	c.Fence.Enabled, c.Fence.PeerSecretFile, c.Fence.Signing = true, secret, valid
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	keys, signer, serr := valid.load(c.Host)
	if serr != nil || signer.ID != pub || !keys.Required() || len(keys.Controllers) != 1 {
		t.Fatalf("load: %+v %v %v", keys, signer.ID, serr)
	}
}

// TestSigningConfigWithoutFencing: with fencing off, fence.signing's key
// still signs the agent's events, so a mode other than off is validated
// too (a missing key is named at start, not found missing later).
func TestSigningConfigWithoutFencing(t *testing.T) {
	c := DefaultConfig()
	c.Host = "node1.example.org"
	c.Fence.Signing.Mode, c.Fence.Signing.KeyFile = "optional", filepath.Join(t.TempDir(), "none")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "fence.signing.key_file") {
		t.Fatalf("fencing off, signing optional without a key: %v", err)
	}
	c.Fence.Signing.Mode = "off"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func ptr(n int) *int { return &n }

// TestLyingPeersDefault: fence.signing.lying_peers defaults to 1 with
// mode required (the compromised-node threat model; with 0 one lying
// peer keeps a declared host running: controller
// TestLyingRelayCannotKeepDeclaredHostRunning), to 0 otherwise; an
// explicit value (0 too) wins, from YAML as well.
func TestLyingPeersDefault(t *testing.T) {
	for _, tc := range []struct {
		s    SigningConfig
		want int
	}{
		{SigningConfig{Mode: "required"}, 1},
		{SigningConfig{Mode: "optional"}, 0},
		{SigningConfig{Mode: "off"}, 0},
		{defaultSigning(), 0},
		{SigningConfig{Mode: "required", LyingPeers: ptr(0)}, 0},
		{SigningConfig{Mode: "required", LyingPeers: ptr(2)}, 2},
	} {
		if got := tc.s.lyingPeers(); got != tc.want {
			t.Errorf("mode %s, lying_peers %v: %d, want %d", tc.s.Mode, tc.s.LyingPeers, got, tc.want)
		}
	}
	var s SigningConfig
	if err := yaml.Unmarshal([]byte("mode: required\nlying_peers: 0\n"), &s); err != nil || s.lyingPeers() != 0 {
		t.Errorf("explicit lying_peers: 0 with required: %d (%v), want 0", s.lyingPeers(), err)
	}
}

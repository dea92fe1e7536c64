package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hvguard/fencing/keyfile"
)

// TestSigningConfigValidation: every problem of signing names the field
// and the value; a valid section trusts this controller's own key and the
// listed ones.
func TestSigningConfigValidation(t *testing.T) {
	dir := t.TempDir()
	seed := filepath.Join(dir, "ctl.seed")
	pub, _ := keyfile.Generate(seed)
	peer, _ := keyfile.Generate(filepath.Join(dir, "peer.seed"))
	hosts := filepath.Join(dir, "host_keys")
	os.WriteFile(hosts, []byte("node1 "+peer+"\n"), 0o644)
	valid := SigningConfig{Mode: "required", KeyFile: seed, HostKeysFile: hosts, ControllerKeys: []string{peer}}
	for _, tc := range []struct {
		name, want string
		mod        func(*SigningConfig)
	}{
		{"mode", `signing.mode: "on": must be off, optional or required`, func(s *SigningConfig) { s.Mode = "on" }},
		{"nokey", `signing.key_file: "` + filepath.Join(dir, "none") + `"`, func(s *SigningConfig) { s.KeyFile = filepath.Join(dir, "none") }},
		{"nohosts", `signing.host_keys_file: "": required with signing required`, func(s *SigningConfig) { s.HostKeysFile = "" }},
		{"badpeer", "signing.controller_keys[0]", func(s *SigningConfig) { s.ControllerKeys = []string{"U-nope"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.ID = "ctl-1"
			c.Signing = valid
			tc.mod(&c.Signing)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	keys, signer, serr := valid.Load()
	if serr != nil || signer.ID != pub || len(keys.Controllers) != 2 || keys.Controllers[0].ID != pub || len(keys.Hosts["node1"]) != 1 {
		t.Fatalf("load: %+v %s %v", keys, signer.ID, serr)
	}
}

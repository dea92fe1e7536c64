package daemon

import (
	"fmt"

	"hvguard/fencing"
	"hvguard/fencing/keyfile"
)

// SigningConfig is `signing:`: signed lease records (docs/security.md,
// "Signed leases"). Off by default; the rollout is off → optional on every
// agent and controller → required.
type SigningConfig struct {
	// Mode is off, optional or required (fencing.SigningMode).
	Mode string `yaml:"mode"`
	// KeyFile is this controller's private key (an nkey user seed written
	// by `hvguard-controller keygen`, mode 0600): it signs declarations,
	// releases and the guard.
	KeyFile string `yaml:"key_file"`
	// HostKeysFile lists every host's public key(s), "<host> <key>…" per
	// line: a host's active and withdrawn records are trusted only when
	// signed by one of its keys. A host that is not listed is never
	// declared (its records are unverifiable; alerted at every renewal).
	HostKeysFile string `yaml:"host_keys_file"`
	// ControllerKeys are the other controllers' public keys (HA, and a
	// rotation of this controller's key): their declarations, releases
	// and guard are trusted too. This controller's own key is always.
	ControllerKeys []string `yaml:"controller_keys"`
}

// DefaultKeyFile is where `hvguard-controller keygen` writes the key.
const DefaultKeyFile = "/etc/hvguard/keys/controller.seed"

func defaultSigning() SigningConfig {
	return SigningConfig{Mode: string(fencing.SigningOff), KeyFile: DefaultKeyFile}
}

// validate appends the section's problems.
func (s SigningConfig) validate(bad func(field string, val any, why string)) {
	if _, err := fencing.ParseSigningMode(s.Mode); err != nil {
		bad("signing.mode", fmt.Sprintf("%q", s.Mode), "must be off, optional or required")
		return
	}
	if _, _, err := s.Load(); err != nil {
		bad(err.Field, err.Val, err.Why)
	}
}

// SigningError names the field and value that cannot be loaded.
type SigningError struct {
	Field string
	Val   any
	Why   string
}

func (e *SigningError) Error() string { return fmt.Sprintf("%s %v: %s", e.Field, e.Val, e.Why) }

// Load returns the controller's signer and keyring (nil, zero Signer when
// signing is off).
func (s SigningConfig) Load() (*fencing.Keyring, fencing.Signer, *SigningError) {
	mode, err := fencing.ParseSigningMode(s.Mode)
	if err != nil || mode == fencing.SigningOff {
		return nil, fencing.Signer{}, nil
	}
	signer, err := keyfile.Signer(s.KeyFile)
	if err != nil {
		return nil, fencing.Signer{}, &SigningError{"signing.key_file", fmt.Sprintf("%q", s.KeyFile), err.Error() + " (create it with: hvguard-controller keygen)"}
	}
	if s.HostKeysFile == "" {
		return nil, fencing.Signer{}, &SigningError{"signing.host_keys_file", `""`, "required with signing " + string(mode)}
	}
	hosts, err := keyfile.HostKeys(s.HostKeysFile)
	if err != nil {
		return nil, fencing.Signer{}, &SigningError{"signing.host_keys_file", fmt.Sprintf("%q", s.HostKeysFile), err.Error()}
	}
	others, err := keyfile.Publics("signing.controller_keys", s.ControllerKeys)
	if err != nil {
		return nil, fencing.Signer{}, &SigningError{"signing.controller_keys", s.ControllerKeys, err.Error()}
	}
	own, _ := keyfile.Public(signer.ID)
	return &fencing.Keyring{Mode: mode, Hosts: hosts, Controllers: append([]fencing.PublicKey{own}, others...)}, signer, nil
}

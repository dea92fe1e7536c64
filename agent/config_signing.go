package agent

import (
	"fmt"
	"slices"

	"hvguard/fencing"
	"hvguard/fencing/keyfile"
)

// SigningConfig is `fence.signing:`: signed lease records (docs/security.md,
// "Signed leases"). Off by default (the behaviour before signed records);
// the rollout is off → optional on every agent and controller → required.
type SigningConfig struct {
	// Mode is off, optional or required (fencing.SigningMode).
	Mode string `yaml:"mode"`
	// KeyFile is this host's private key: an nkey user seed written by
	// `hvguard-agent keygen`, mode 0600 (refused if group- or
	// world-readable).
	KeyFile string `yaml:"key_file"`
	// ControllerKeys are the controllers' public keys (nkey "U…"), pinned
	// here: declarations, releases and the guard are trusted only when
	// signed by one of them (several: HA controllers, and rotation).
	ControllerKeys []string `yaml:"controller_keys"`
	// HostKeysFile lists every host's public key(s), "<host> <key>…" per
	// line (the controller's file, distributed like ssh's known_hosts):
	// a relay is written for a peer only when its record is signed by
	// that peer's key, and this host's own key must be listed for it.
	HostKeysFile string `yaml:"host_keys_file"`
	// LyingPeers is how many compromised peers the agent must survive:
	// Held only when this host plus the peers that confirmed exceed the
	// guard threshold by more than it, and a relay counts only when more
	// than it peers report the landing (fencing.Config.LyingPeers). Peers' answers
	// are verified against their own keys whenever signing is on, so a
	// compromised node can only lie for itself. Unset: 1 with mode
	// required, else 0 (fencing.DefaultLyingPeers).
	LyingPeers *int `yaml:"lying_peers,omitempty"`
}

// lyingPeers returns lying_peers, or its default for the mode.
func (s SigningConfig) lyingPeers() int {
	if s.LyingPeers != nil {
		return *s.LyingPeers
	}
	mode, _ := fencing.ParseSigningMode(s.Mode)
	return fencing.DefaultLyingPeers(mode)
}

// DefaultKeyFile is where `hvguard-agent keygen` writes the host's key.
const DefaultKeyFile = "/etc/hvguard/keys/agent.seed"

func defaultSigning() SigningConfig {
	return SigningConfig{Mode: string(fencing.SigningOff), KeyFile: DefaultKeyFile}
}

// validate appends the section's problems (host: this agent's host).
func (s SigningConfig) validate(host string, enabled bool, bad func(field string, val any, why string)) {
	mode, err := fencing.ParseSigningMode(s.Mode)
	if err != nil {
		bad("fence.signing.mode", fmt.Sprintf("%q", s.Mode), "must be off, optional or required")
		return
	}
	n := s.lyingPeers()
	if n < 0 {
		bad("fence.signing.lying_peers", n, "must not be negative")
	}
	if mode == fencing.SigningOff {
		if n > 0 && enabled {
			bad("fence.signing.lying_peers", n, "needs signing (optional or required): without host-signed answers one member can answer in every peer's name")
		}
		return
	}
	// With fencing off too: the key signs the agent's events.
	if _, _, err := s.load(host); err != nil {
		bad(err.field, err.val, err.why)
	}
}

type signingErr struct {
	field string
	val   any
	why   string
}

// load returns this host's signer and the keyring it verifies with (nil,
// zero Signer when signing is off).
func (s SigningConfig) load(host string) (*fencing.Keyring, fencing.Signer, *signingErr) {
	mode, err := fencing.ParseSigningMode(s.Mode)
	if err != nil || mode == fencing.SigningOff {
		return nil, fencing.Signer{}, nil
	}
	signer, err := keyfile.Signer(s.KeyFile)
	if err != nil {
		return nil, fencing.Signer{}, &signingErr{"fence.signing.key_file", fmt.Sprintf("%q", s.KeyFile), err.Error() + " (create it with: hvguard-agent keygen)"}
	}
	if len(s.ControllerKeys) == 0 {
		return nil, fencing.Signer{}, &signingErr{"fence.signing.controller_keys", "[]", "required with signing " + string(mode) + ": the controllers' public keys (hvguard-controller keygen prints them)"}
	}
	ctl, err := keyfile.Publics("fence.signing.controller_keys", s.ControllerKeys)
	if err != nil {
		return nil, fencing.Signer{}, &signingErr{"fence.signing.controller_keys", s.ControllerKeys, err.Error()}
	}
	if s.HostKeysFile == "" {
		return nil, fencing.Signer{}, &signingErr{"fence.signing.host_keys_file", `""`, "required with signing " + string(mode) + ": peers' records are relayed only when signed by their own key"}
	}
	hosts, err := keyfile.HostKeys(s.HostKeysFile)
	if err != nil {
		return nil, fencing.Signer{}, &signingErr{"fence.signing.host_keys_file", fmt.Sprintf("%q", s.HostKeysFile), err.Error()}
	}
	if !slices.ContainsFunc(hosts[host], func(k fencing.PublicKey) bool { return k.ID == signer.ID }) {
		return nil, fencing.Signer{}, &signingErr{"fence.signing.key_file", fmt.Sprintf("%q", s.KeyFile),
			fmt.Sprintf("its public key %s is not listed for host %s in %s (add the line \"%s %s\" there and on the controllers)", signer.ID, host, s.HostKeysFile, host, signer.ID)}
	}
	return &fencing.Keyring{Mode: mode, Hosts: hosts, Controllers: ctl}, signer, nil
}

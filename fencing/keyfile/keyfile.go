// Package keyfile reads and writes the key files of signed lease records
// (docs/security.md, "Signed leases"): a host's or a controller's private
// key is an nkey user seed ("SU…", the format of `nk -gen user`) in a file
// readable by its owner only; public keys are nkey public keys ("U…"),
// listed in configuration (an agent pins its controllers' keys) or in a
// host key file (one line per host, like ssh's known_hosts:
// "<host> <key> [<key>…]", several keys during a rotation, "#" comments).
package keyfile

import (
	"bufio"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"hvguard/fencing"
)

// Signer reads the seed file at path (it must not be readable by group or
// others) and returns the signer it holds, its ID being its public key.
func Signer(path string) (fencing.Signer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fencing.Signer{}, fmt.Errorf("key file %s: %w", path, err)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return fencing.Signer{}, fmt.Errorf("key file %s: mode %04o: it must not be readable by group or others (chmod 600 %s)", path, m, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fencing.Signer{}, fmt.Errorf("key file %s: %w", path, err)
	}
	return FromSeed(strings.TrimSpace(string(b)))
}

// FromSeed returns the signer of an nkey user seed.
func FromSeed(seed string) (fencing.Signer, error) {
	prefix, raw, err := nkeys.DecodeSeed([]byte(seed))
	if err != nil {
		return fencing.Signer{}, fmt.Errorf("key: not an nkey seed: %w", err)
	}
	if prefix != nkeys.PrefixByteUser {
		return fencing.Signer{}, errors.New("key: not an nkey user seed (SU…)")
	}
	priv := ed25519.NewKeyFromSeed(raw)
	id, err := nkeys.Encode(nkeys.PrefixByteUser, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return fencing.Signer{}, fmt.Errorf("key: %w", err)
	}
	return fencing.Signer{ID: string(id), Key: priv}, nil
}

// Public parses an nkey public user key ("U…").
func Public(s string) (fencing.PublicKey, error) {
	raw, err := nkeys.Decode(nkeys.PrefixByteUser, []byte(s))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return fencing.PublicKey{}, fmt.Errorf("public key %q: not an nkey public user key (U…)", s)
	}
	return fencing.PublicKey{ID: s, Key: ed25519.PublicKey(raw)}, nil
}

// Publics parses a list of public keys; field names the configuration
// field in errors.
func Publics(field string, list []string) ([]fencing.PublicKey, error) {
	var out []fencing.PublicKey
	for i, s := range list {
		k, err := Public(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// HostKeys reads a host key file: "<host> <key> [<key>…]" per line.
func HostKeys(path string) (map[string][]fencing.PublicKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("host key file %s: %w", path, err)
	}
	defer f.Close()
	out := map[string][]fencing.PublicKey{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("host key file %s:%d: want \"<host> <key> [<key>…]\", got %q", path, n, line)
		}
		for _, s := range fields[1:] {
			k, err := Public(s)
			if err != nil {
				return nil, fmt.Errorf("host key file %s:%d: host %s: %w", path, n, fields[0], err)
			}
			out[fields[0]] = append(out[fields[0]], k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("host key file %s: %w", path, err)
	}
	return out, nil
}

// Generate writes a new seed to path (mode 0600; it refuses to overwrite
// an existing file) and returns its public key.
func Generate(path string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("keygen: %s exists: not overwritten (its public key: hvguard-agent keygen --show %s)", path, path)
	}
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	if _, err := f.Write(append(seed, '\n')); err != nil {
		f.Close()
		return "", fmt.Errorf("keygen: %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("keygen: %s: %w", path, err)
	}
	return pub, nil
}

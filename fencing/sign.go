package fencing

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Signed lease records (docs/security.md, "Signed leases").
//
// Every host has its own ed25519 key pair, every controller its own. A
// record is sealed by its writer (Signer.Seal): PrevRev is set to the
// revision the write is a compare-and-set on (0: a create) and Sig to the
// signature of the record's canonical encoding. A Keyring verifies:
//
//   - active and withdrawn records only with a key of the record's host
//     (only the agent of a host speaks for it);
//   - expired and released records with a controller key, or the host's
//     own key (the agent's self-declaration after a key delete, and
//     `hvguard-agent --unfence` run on the host: a host can only give up its
//     own lease, which it can do anyway by fencing);
//   - the guard only with a controller key.
//
// PrevRev binds a record to the one it replaced: a copy of an old record
// written again later (a replay: every agent can read every key) names a
// revision the key has left, which the controller and the agent detect
// (StaleRecord). The signature covers PrevRev, so it cannot be moved.

// ErrInvalidRecord wraps every reason a lease record (or guard) is not
// trusted: undecodable, unsigned where signatures are required, signed by
// an unknown key or by a key not allowed to write that state, a bad
// signature, or a replay.
var ErrInvalidRecord = errors.New("invalid lease record")

// ErrForgedRecord (always with ErrInvalidRecord) marks a record that cannot
// be a genuine write of its host's agent: signed by a known key that may
// not write it (another host's, a controller's on an active or withdrawn
// record), or a replay (StaleRecord). Other invalid records — unsigned, an
// unknown signer, a bad signature, undecodable — may be a genuine agent's
// that this reader cannot verify (a key not provisioned here, an old
// agent): the controller counts them as renewals for the silence of the
// host (never declared, alerted), not as forgeries.
var ErrForgedRecord = errors.New("forged")

// SigningMode says what a reader does with signatures.
type SigningMode string

// Signing modes.
const (
	// SigningOff: nothing is signed or verified (the behaviour before
	// signed records; any holder of NATS credentials can write any
	// record).
	SigningOff SigningMode = "off"
	// SigningOptional: the migration step. Records are signed when a key
	// is configured; a signed record must verify, an unsigned one is
	// accepted (so an unsigned forgery is too: no protection yet).
	SigningOptional SigningMode = "optional"
	// SigningRequired: only records signed by the right key count.
	SigningRequired SigningMode = "required"
)

// ParseSigningMode parses a signing mode ("" is off).
func ParseSigningMode(s string) (SigningMode, error) {
	switch m := SigningMode(s); m {
	case "":
		return SigningOff, nil
	case SigningOff, SigningOptional, SigningRequired:
		return m, nil
	}
	return "", fmt.Errorf("signing mode %q: want off, optional or required", s)
}

// PublicKey is a verification key and the ID records name it by (the
// shells use the NATS nkey encoding of the public key, "U…").
type PublicKey struct {
	ID  string
	Key ed25519.PublicKey
}

// Signer is a writer's signing key and its ID. The zero Signer signs
// nothing.
type Signer struct {
	ID  string
	Key ed25519.PrivateKey
}

// Keyring holds the keys a reader trusts. A nil Keyring verifies nothing
// (SigningOff).
type Keyring struct {
	Mode SigningMode
	// Hosts lists each host's accepted keys (several during a rotation).
	Hosts map[string][]PublicKey
	// Controllers lists the controllers' accepted keys (several: HA
	// controllers, and rotation).
	Controllers []PublicKey
}

// Enabled reports whether records are verified at all.
func (k *Keyring) Enabled() bool { return k != nil && k.Mode != SigningOff && k.Mode != "" }

// Required reports whether unsigned records are refused.
func (k *Keyring) Required() bool { return k != nil && k.Mode == SigningRequired }

const (
	recordDomain = "hvguard lease record v1\n"
	guardDomain  = "hvguard guard v1\n"
	beaconDomain = "hvguard beacon v1\n"
	prevDomain   = "hvguard beacon prev v1\n"
	recDomain    = "hvguard beacon v2\n"
)

// beaconPayload is what a beacon's Sig signs: the beacon without Sig,
// Prev, PrevSig, Epoch, Seq and RecSig — the bytes a controller from
// before them computes from the fields it knows, so a new agent's beacon
// verifies there too (agents and controllers of neighbouring releases
// work together).
func beaconPayload(b Beacon) ([]byte, error) {
	b.Sig, b.Prev, b.PrevSig = "", 0, ""
	b.Epoch, b.Seq, b.RecSig = 0, 0, ""
	out, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	return append([]byte(beaconDomain), out...), nil
}

// prevPayload is what a beacon's PrevSig signs: its host, revision, Prev
// and signer.
func prevPayload(b Beacon) []byte {
	return fmt.Appendf([]byte(prevDomain), "%s\n%d\n%d\n%s", b.Host, b.Revision, b.Prev, b.Signer)
}

// recPayload is what a beacon's RecSig signs: the whole beacon but its
// signatures (Prev, Epoch and Seq included), so a controller that knows
// RecSig checks one signature where an older one checks Sig and PrevSig.
func recPayload(b Beacon) ([]byte, error) {
	b.Sig, b.PrevSig, b.RecSig = "", "", ""
	out, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	return append([]byte(recDomain), out...), nil
}

// SealBeacon returns b signed by s, the host's key (the zero Signer
// returns it unchanged).
func (s Signer) SealBeacon(b Beacon) Beacon {
	if s.Key == nil {
		return b
	}
	b.Signer = s.ID
	p, err := beaconPayload(b)
	if err != nil {
		return b
	}
	b.Sig = base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, p))
	b.PrevSig = ""
	if b.Prev != 0 {
		b.PrevSig = base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, prevPayload(b)))
	}
	b.RecSig = ""
	if b.Epoch != 0 || b.Seq != 0 {
		if p, err := recPayload(b); err == nil {
			b.RecSig = base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, p))
		}
	}
	return b
}

// VerifyBeacon checks that b is signed by one of its host's keys. With
// signing required an unsigned beacon is refused; with optional it is
// taken (as unsigned records are); off: nothing is checked. Every error
// wraps ErrInvalidRecord and names the host and signer.
func (k *Keyring) VerifyBeacon(b Beacon) error {
	if !k.Enabled() {
		return nil
	}
	if b.Sig == "" {
		if k.Required() {
			return fmt.Errorf("%w: beacon of %s is unsigned (signing: required)", ErrInvalidRecord, b.Host)
		}
		return nil
	}
	key := find(k.Hosts[b.Host], b.Signer)
	if key == nil {
		return fmt.Errorf("%w: beacon of %s signed by %q, not one of its keys", ErrInvalidRecord, b.Host, b.Signer)
	}
	if b.RecSig != "" {
		// One signature over every field (a beacon from an agent that
		// names its record); Sig and PrevSig are for older controllers.
		p, err := recPayload(b)
		if err != nil || !verifySig(key, p, b.RecSig) {
			return fmt.Errorf("%w: beacon of %s: record epoch %d seq %d (rec_sig) not signed by %q", ErrInvalidRecord, b.Host, b.Epoch, b.Seq, b.Signer)
		}
		return nil
	}
	if b.Epoch != 0 || b.Seq != 0 {
		return fmt.Errorf("%w: beacon of %s: record epoch %d seq %d not signed by %q (no rec_sig)", ErrInvalidRecord, b.Host, b.Epoch, b.Seq, b.Signer)
	}
	p, err := beaconPayload(b)
	if err != nil || !verifySig(key, p, b.Sig) {
		return fmt.Errorf("%w: beacon of %s: bad signature by %q", ErrInvalidRecord, b.Host, b.Signer)
	}
	if (b.Prev != 0 || b.PrevSig != "") && !verifySig(key, prevPayload(b), b.PrevSig) {
		return fmt.Errorf("%w: beacon of %s: prev %d not signed by %q", ErrInvalidRecord, b.Host, b.Prev, b.Signer)
	}
	return nil
}

func recordPayload(r LeaseRecord) ([]byte, error) {
	r.Sig = ""
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append([]byte(recordDomain), b...), nil
}

func guardPayload(g Guard) ([]byte, error) {
	g.Sig = ""
	b, err := json.Marshal(g)
	if err != nil {
		return nil, err
	}
	return append([]byte(guardDomain), b...), nil
}

// Seal returns r as written by CAS on prevRev (0: a create) and signed by
// s. The zero Signer returns r unchanged.
func (s Signer) Seal(r LeaseRecord, prevRev uint64) LeaseRecord {
	if s.Key == nil {
		return r
	}
	r.PrevRev, r.Signer = prevRev, s.ID
	p, err := recordPayload(r)
	if err != nil {
		return r // cannot happen for a LeaseRecord; the reader refuses it unsigned
	}
	r.Sig = base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, p))
	return r
}

// SealGuard returns g signed by s (the zero Signer returns it unchanged).
func (s Signer) SealGuard(g Guard) Guard {
	if s.Key == nil {
		return g
	}
	g.Signer = s.ID
	p, err := guardPayload(g)
	if err != nil {
		return g
	}
	g.Sig = base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, p))
	return g
}

func find(keys []PublicKey, id string) ed25519.PublicKey {
	for _, k := range keys {
		if k.ID == id && len(k.Key) == ed25519.PublicKeySize {
			return k.Key
		}
	}
	return nil
}

func verifySig(key ed25519.PublicKey, payload []byte, sig string) bool {
	b, err := base64.RawStdEncoding.DecodeString(sig)
	return err == nil && len(b) == ed25519.SignatureSize && ed25519.Verify(key, payload, b)
}

// VerifyRecord checks r's signature and that its signer may write r's
// state for r.Host (see the package comment above). Every error wraps
// ErrInvalidRecord and names the host, state and signer.
func (k *Keyring) VerifyRecord(r LeaseRecord) error {
	if !k.Enabled() {
		return nil
	}
	if r.Sig == "" {
		if k.Required() {
			return fmt.Errorf("%w: %s record of %s is unsigned (signing: required)", ErrInvalidRecord, r.State, r.Host)
		}
		return nil
	}
	key, role := find(k.Hosts[r.Host], r.Signer), "host"
	if key == nil {
		key, role = find(k.Controllers, r.Signer), "controller"
	}
	if key == nil {
		for h, keys := range k.Hosts {
			if find(keys, r.Signer) != nil {
				return fmt.Errorf("%w: %w: %s record of %s signed by %s's key %q", ErrInvalidRecord, ErrForgedRecord, r.State, r.Host, h, r.Signer)
			}
		}
		return fmt.Errorf("%w: %s record of %s signed by %q, neither a key of %s nor a controller key", ErrInvalidRecord, r.State, r.Host, r.Signer, r.Host)
	}
	if role == "controller" && (r.State == LeaseActive || r.State == LeaseWithdrawn) {
		return fmt.Errorf("%w: %w: %s record of %s signed by controller key %q: only the host's key may write it", ErrInvalidRecord, ErrForgedRecord, r.State, r.Host, r.Signer)
	}
	p, err := recordPayload(r)
	if err != nil || !verifySig(key, p, r.Sig) {
		return fmt.Errorf("%w: %s record of %s: bad signature by %s key %q", ErrInvalidRecord, r.State, r.Host, role, r.Signer)
	}
	return nil
}

// SignedByHost reports whether r is signed by one of its host's own keys
// (signature not checked: call VerifyRecord first).
func (k *Keyring) SignedByHost(r LeaseRecord) bool {
	return k != nil && r.Sig != "" && find(k.Hosts[r.Host], r.Signer) != nil
}

// VerifyGuard checks that g is signed by a controller key.
func (k *Keyring) VerifyGuard(g Guard) error {
	if !k.Enabled() {
		return nil
	}
	if g.Sig == "" {
		if k.Required() {
			return fmt.Errorf("%w: guard is unsigned (signing: required)", ErrInvalidRecord)
		}
		return nil
	}
	key := find(k.Controllers, g.Signer)
	if key == nil {
		return fmt.Errorf("%w: guard signed by %q, not a controller key", ErrInvalidRecord, g.Signer)
	}
	p, err := guardPayload(g)
	if err != nil || !verifySig(key, p, g.Sig) {
		return fmt.Errorf("%w: guard: bad signature by controller key %q", ErrInvalidRecord, g.Signer)
	}
	return nil
}

// CheckRelay checks a record a peer asks this agent to relay (write to its
// host's key by CAS on rev): only an active record, signed by its own
// host (when k verifies), written by CAS on the revision it names
// (PrevRev == rev when signed: a replayed record names a revision the key
// has left, so its CAS fails). Anything else — a forged declaration or
// withdrawal, a record of another host, a record the asker's host did not
// sign — is refused; the relayer writes nothing.
func (k *Keyring) CheckRelay(r LeaseRecord, rev uint64) error {
	if r.State != LeaseActive {
		return fmt.Errorf("%w: relay of a %s record of %s refused: a relay carries only active records", ErrInvalidRecord, r.State, r.Host)
	}
	if !k.Enabled() {
		return nil
	}
	if err := k.VerifyRecord(r); err != nil {
		return fmt.Errorf("relay refused: %w", err)
	}
	if r.Sig != "" && r.PrevRev != rev {
		return fmt.Errorf("%w: relay of %s's record for revision %d on revision %d refused", ErrInvalidRecord, r.Host, r.PrevRev, rev)
	}
	return nil
}

// StaleRecord reports whether cur, the record found at revision curRev of
// a key whose revision lastRev (< curRev) the reader knew to be in the key
// before, is a replay: a signed record names the revision it replaced
// (PrevRev); if that is older than lastRev, the record was written before
// lastRev and copied in again since. Unsigned records (SigningOptional,
// SigningOff) cannot be told.
func StaleRecord(cur LeaseRecord, curRev, lastRev uint64) bool {
	return cur.Sig != "" && lastRev != 0 && curRev > lastRev && cur.PrevRev < lastRev
}

// Peer answers (fencing/peer) are signed with the answering host's key
// too: the fleet's HMAC secret says only that some member wrote an answer,
// and any member holding it could answer in any peer's name — a
// compromised node could confirm "cannot renew" for many peers and hold a
// cut-off rack that the controller then declares. With host signatures a
// node can only speak for itself (Config.LyingPeers bounds what that is
// worth).
const answerDomain = "hvguard peer answer v1\n"

// SignAnswer returns the signature of a peer answer's body ("" for the
// zero Signer).
func (s Signer) SignAnswer(body []byte) string {
	if s.Key == nil {
		return ""
	}
	return s.ID + " " + base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, append([]byte(answerDomain), body...)))
}

// VerifyAnswer checks that body, an answer of host, carries sig
// (SignAnswer) by one of host's keys. Unsigned answers pass unless
// signatures are required. Errors wrap ErrInvalidRecord.
func (k *Keyring) VerifyAnswer(host string, body []byte, sig string) error {
	if !k.Enabled() {
		return nil
	}
	if sig == "" {
		if k.Required() {
			return fmt.Errorf("%w: answer of %s is not signed by its host key (signing: required)", ErrInvalidRecord, host)
		}
		return nil
	}
	id, b64, _ := strings.Cut(sig, " ")
	key := find(k.Hosts[host], id)
	if key == nil {
		return fmt.Errorf("%w: answer of %s signed by %q, not one of its keys", ErrInvalidRecord, host, id)
	}
	if !verifySig(key, append([]byte(answerDomain), body...), b64) {
		return fmt.Errorf("%w: answer of %s: bad signature", ErrInvalidRecord, host)
	}
	return nil
}

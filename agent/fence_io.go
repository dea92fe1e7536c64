package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/daemonkit"
	"hvguard/daemonkit/atomicfile"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// bootNow is the fencing clock, CLOCK_BOOTTIME (see daemonkit.BootNow for
// why this clock).
var bootNow = daemonkit.BootNow

// bootIDPath identifies this boot of the host.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

func readBootID() (string, error) {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Files in state_dir.
const (
	// fenceStateFile is the fencing.Durable (lease age, fence state, the
	// set of domains hvguard paused).
	fenceStateFile = "fence.json"
	// fenceMembersFile caches the bucket membership and the controller's
	// guard, for a restart while NATS is unreachable.
	fenceMembersFile = "fence-members.json"
)

// writeJSONAtomic writes v to path with atomicfile.WriteNoSync: a crash
// leaves the old or the new file, never a torn one. No fsync: it runs on
// the fencing loop, whose latency is a safety input (an fsync behind a
// busy hypervisor's guest I/O can take seconds, and the fence waits for
// the Persist before it), and only an agent crash must be survived (a
// host crash stops every domain anyway; the page cache survives an agent
// crash).
func writeJSONAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return atomicfile.WriteNoSync(path, b, 0o600)
}

// loadDurable reads the durable fence state (nil, nil when there is none).
func loadDurable(path string) (*fencing.Durable, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fence state %s: %w", path, err)
	}
	var d fencing.Durable
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("fence state %s: %w", path, err)
	}
	return &d, nil
}

// runtimeCopy is the per-boot copy of fenceStateFile in fence.runtime_dir
// (tmpfs): the durable state and the state_dir it belongs to (a copy left
// by an agent with another state_dir — a test, a second instance — is
// not ours).
type runtimeCopy struct {
	StateDir string          `json:"state_dir"`
	Durable  fencing.Durable `json:"durable"`
}

// fenceStateFiles are the two copies of the durable fence state.
type fenceStateFiles struct {
	stateDir, statePath, runtimePath string
}

// write writes both copies, each atomically (the same helper), and
// returns each one's error.
func (p fenceStateFiles) write(d *fencing.Durable) (stateErr, runtimeErr error) {
	return writeJSONAtomic(p.statePath, d),
		writeJSONAtomic(p.runtimePath, runtimeCopy{StateDir: p.stateDir, Durable: *d})
}

// load reads both copies and picks one (fencing.ChooseDurable): a
// state_dir copy missing or unreadable (logged at ERROR) is replaced by
// the runtime copy of this boot, which is logged at WARN.
func (p fenceStateFiles) load(bootID string, log *slog.Logger) (*fencing.Durable, fencing.DurableSource) {
	st, err := loadDurable(p.statePath)
	if err != nil {
		// Without it (and without the runtime copy) the paused set is lost
		// (nothing is resumed) and the lease age restarts; fencing still
		// works. Loud, not fatal: a node whose agent refuses to start is
		// not fenced at all.
		log.Error("fence state unreadable", "path", p.statePath, "err", err)
		st = nil
	}
	var rt *fencing.Durable
	switch b, err := os.ReadFile(p.runtimePath); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		log.Warn("runtime copy of the fence state unreadable", "path", p.runtimePath, "err", err)
	default:
		var c runtimeCopy
		if err := json.Unmarshal(b, &c); err != nil {
			log.Warn("runtime copy of the fence state unreadable", "path", p.runtimePath, "err", err)
		} else if c.StateDir == p.stateDir {
			rt = &c.Durable
		}
	}
	d, src := fencing.ChooseDurable(st, rt, bootID)
	switch {
	case src == fencing.DurableRuntime:
		log.Warn("fence state restored from the runtime copy (state_dir's is missing, unreadable or older): the lease age and the fence state of this boot are kept",
			"used", p.runtimePath, "missing", p.statePath, "writes", d.Writes)
	case src == fencing.DurableNone && st == nil && rt == nil:
	case src == fencing.DurableNone:
		log.Warn("no fence state of this boot: starting as a first start", "state", p.statePath, "runtime", p.runtimePath)
	}
	return d, src
}

// membersCache is fenceMembersFile.
type membersCache struct {
	Members []string      `json:"members"`
	Guard   fencing.Guard `json:"guard"`
}

func loadMembers(path string) (membersCache, error) {
	var m membersCache
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("fence members %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("fence members %s: %w", path, err)
	}
	return m, nil
}

// errNATSDown: the lease bucket cannot be opened while NATS is not
// connected; a renewal then definitely did not happen.
var errNATSDown = errors.New("nats not connected")

// leaseStore opens the lease bucket lazily (NATS may be down at start) and
// then is a natslease.Store. Safe for concurrent use.
type leaseStore struct {
	nc     *nats.Conn
	host   string // this host: its receipt subject, added to the receipts stream it creates
	create bool
	// signer, keys, onInvalid: natslease.Store's (signed records).
	signer    fencing.Signer
	keys      *fencing.Keyring
	onInvalid func(host string, rev uint64, err error)
	// log, insecureStream: once the bucket is open, whether its stream allows
	// rollups or direct gets (natslease.WarnStream: logged at ERROR,
	// listed among the insecure settings).
	log            *slog.Logger
	insecureStream atomic.Bool
	mu             sync.Mutex
	st             *natslease.Store
}

func (l *leaseStore) get(ctx context.Context, timeout time.Duration) (*natslease.Store, error) {
	l.mu.Lock()
	st := l.st
	l.mu.Unlock()
	if st != nil {
		return st, nil
	}
	if !l.nc.IsConnected() {
		return nil, errNATSDown
	}
	js, err := jetstream.New(l.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	kv, err := natslease.EnsureBucket(cctx, js, l.create)
	if err != nil {
		return nil, err
	}
	if l.create && l.log != nil {
		// This host's withdrawal receipts stream (fencer.publishReceipt),
		// with the bucket when this user may create it (not with the
		// shipped permissions: provisioned for every enrolled host,
		// docs/operations.md).
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), natslease.ReadTimeout)
			defer cancel()
			if _, err := natslease.EnsureWithdrawalStream(ctx, js, l.host); err != nil {
				l.log.Warn("this host's withdrawal receipts stream not found and not created: an orderly stop's receipt will not be stored there", "err", err)
			}
		}()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		// NC: reads use the stream API's message get, never a direct get
		// (natslease.Store.get: agents may not make direct gets).
		l.st = &natslease.Store{KV: kv, NC: l.nc, Signer: l.signer, Keys: l.keys, OnInvalid: l.onInvalid}
		if l.log != nil { // off the renewal's path (bounded by natslease.ReadTimeout)
			go func() { l.insecureStream.Store(natslease.WarnStream(context.Background(), js, l.log)) }()
		}
	}
	return l.st, nil
}

// Renew is natslease.Store.Renew; a bucket that cannot be opened is a
// renewal that definitely failed.
func (l *leaseStore) Renew(ctx context.Context, req fencing.RenewRequest, timeout time.Duration) fencing.RenewResult {
	st, err := l.get(ctx, timeout)
	if err != nil {
		return fencing.RenewResult{Outcome: fencing.RenewFailed}
	}
	return st.Renew(ctx, req, timeout)
}

// Relay implements peer.Relayer.
func (l *leaseStore) Relay(ctx context.Context, req fencing.RenewRequest, timeout time.Duration) fencing.RenewResult {
	st, err := l.get(ctx, timeout)
	if err != nil {
		return fencing.RenewResult{Outcome: fencing.RenewFailed}
	}
	return st.Relay(ctx, req, timeout)
}

// ForbidResetEnv, set to 1, makes SysrqReset refuse: the tests that run the
// real agent binary (test/netns, test/realvirt) set it as a second guard
// behind their configuration (allow_reset false, action pause), because
// /proc/sysrq-trigger is the machine's own even inside a network namespace.
const ForbidResetEnv = "HVGUARD_FORBID_RESET"

// sysrqTrigger is the kernel's magic SysRq interface. Writes by root work
// whatever kernel.sysrq says (that sysctl only governs the keyboard).
const sysrqTrigger = "/proc/sysrq-trigger"

// SysrqReset resets the host at once: sysrq 'b' reboots without syncing or
// unmounting (like pulling the plug; SBD does the same). It returns only
// if the write failed. The production value of Options.ResetHost.
func SysrqReset() error {
	if os.Getenv(ForbidResetEnv) == "1" {
		return fmt.Errorf("host reset refused: %s=1 (a test run: never reset the test machine)", ForbidResetEnv)
	}
	if err := os.WriteFile(sysrqTrigger, []byte("b"), 0); err != nil {
		return fmt.Errorf("host reset via %s: %w", sysrqTrigger, err)
	}
	return nil
}

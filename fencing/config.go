package fencing

import (
	"errors"
	"fmt"
	"time"
)

// Timing defaults. Every number is chosen against the measured NATS
// behaviour in nats-partitions.md; docs/fencing.md draws them on one
// timeline.
const (
	// DefaultRenewInterval is how often the agent renews its lease. 2 s gives
	// six attempts inside one DefaultLeaseTTL and costs a 10 000-host fleet
	// 5 000 CAS updates/s, measured without failures on a 3-node cluster.
	DefaultRenewInterval = 2 * time.Second

	// MinRenewInterval is the shortest renew_interval accepted. Each
	// renewal the agent writes is followed by a beacon, and the controller
	// verifies at most 50 beacons a second of a host (after a burst of
	// 200; controller.BeaconVerifyRate): beyond it they are shed and
	// counted against the host as a flooding one's (its missing beacons no
	// loss window — reviewer X81 found an honest agent renewing every 20 ms
	// would be shed). 100 ms: at most 10 renewals a second plus retries, a
	// fifth of the budget; no deployment renews faster.
	MinRenewInterval = 100 * time.Millisecond

	// DefaultRenewTimeout bounds one renewal (KV update) before its outcome
	// becomes UNKNOWN. 30 % packet loss made renewals take up to 1.8 s, so
	// less would turn loss into false suspicion; more would delay it.
	DefaultRenewTimeout = 2 * time.Second

	// DefaultPeerTimeout bounds one round of peer questions. A peer that can
	// renew relays our renewal with its own KV update (up to
	// DefaultRenewTimeout) and answers over HTTP: 2 s + 1 s.
	DefaultPeerTimeout = 3 * time.Second

	// DefaultFenceDeadline is the time reserved at the end of the lease for
	// the fence action to complete (pausing 1000 domains takes well under
	// it, see the benchmark). Fencing starts at the latest at
	// LeaseTTL-FenceDeadline after the send time of the last acknowledged
	// renewal.
	DefaultFenceDeadline = 5 * time.Second

	// DefaultLeaseTTL is how long an acknowledged renewal holds the lease,
	// counted from its SEND time. It must hold the whole detection path:
	// one renew interval, a timed-out renewal, one peer round and the fence
	// deadline (2+2+3+5 = 12 s), plus 3 s for a second peer round so a
	// control-plane blip does not fence: 15 s.
	DefaultLeaseTTL = 15 * time.Second

	// DefaultHeldRecheck is how often a Held agent asks its peers again, so
	// it notices that the mass failure ended for the others (and fences
	// if it alone is still cut off) well inside the controller's guard
	// memory (DefaultGuardWindow).
	DefaultHeldRecheck = 5 * time.Second

	// DefaultResetBudget is the time a host reset (sysrq 'b') needs to stop
	// every domain once it is issued: the kernel reboots at once, no
	// userspace is involved.
	DefaultResetBudget = time.Second

	// DefaultWatchdogTimeout is the hardware watchdog timeout set when the
	// watchdog is armed: a wedged fencing loop resets the host after it.
	DefaultWatchdogTimeout = 10 * time.Second

	// MaxClockDrift is the default bound on the relative clock-RATE error
	// between an agent and the controller (each against real time). NTP
	// disciplined or not, crystal oscillators are within 200 ppm and the
	// kernel slews monotonic clocks by at most 500 ppm; 1 % is a 20x
	// margin that costs 0.3 s of grace at the defaults.
	MaxClockDrift = 0.01

	// MaxSupportedDrift is the largest drift bound a Config may declare.
	MaxSupportedDrift = 0.1

	// DefaultGuardCount and DefaultGuardShare are the controller's
	// mass-failure guard: it holds when MORE than min(Count, Share*N) of
	// the N hosts in the lease bucket are silent within one
	// DefaultGuardWindow. 10 hosts is more than a rack; 20 % of a small
	// cloud is more than any single failure domain should be.
	DefaultGuardCount = 10
	DefaultGuardShare = 0.2

	// DefaultGuardWindow is the controller's guard memory: a host silent at
	// any time in the last window still counts. It must cover a Held
	// agent noticing that the others recovered (DefaultHeldRecheck +
	// DefaultPeerTimeout) and completing its fence (DefaultFenceDeadline),
	// and writes that land late (measured 16 s): 60 s.
	DefaultGuardWindow = 60 * time.Second

	// DefaultPeerBatch is how many peers one round asks at most beyond the
	// guard threshold: a round asks min(N-1, Threshold+DefaultPeerBatch)
	// peers drawn at random from the whole membership.
	DefaultPeerBatch = 6
)

// ErrInvalidConfig is wrapped by every Config validation error.
var ErrInvalidConfig = errors.New("fencing: invalid config")

// Action is what fencing does to the host's domains.
type Action string

// Fence actions (config fence.action).
const (
	// ActionPause suspends every running domain and remembers durably which
	// ones hvguard paused, so that only those are resumed on rejoin.
	ActionPause Action = "pause"
	// ActionDestroy destroys (hard stops) every running domain.
	ActionDestroy Action = "destroy"
	// ActionResetHost resets the host (sysrq 'b').
	ActionResetHost Action = "reset-host"
	// ActionNone only monitors: the agent runs the whole state machine and
	// publishes what it would have done. The controller never declares such
	// a host expired (its domains keep running).
	ActionNone Action = "none"
)

// Backstop is what makes a host's domains stop when the fence action did not
// complete in time or the agent itself is wedged.
type Backstop string

// Backstops, as advertised in the lease record: the SLOWEST path that
// stops the domains when the agent does not (Config.Backstop).
const (
	// BackstopReset: the agent escalates to a host reset at the fence
	// deadline (Config.AllowReset, or action reset-host) and no hardware
	// watchdog is armed. It needs a LIVE agent: a crashed, hung or
	// OOM-killed agent resets nothing, so the controller refuses such a
	// host unless its operator accepts that risk explicitly.
	BackstopReset Backstop = "reset"
	// BackstopWatchdog: the hardware watchdog is armed and stops being fed;
	// the host resets within WatchdogTimeout, whatever the agent process
	// does. Advertised whenever the watchdog is armed, reset allowed or not:
	// a dead agent is reset by the watchdog only, and that is the slowest
	// path.
	BackstopWatchdog Backstop = "watchdog"
	// BackstopNone: nothing stops a fence that did not complete. The
	// controller declares such a host only if it is configured to accept it.
	BackstopNone Backstop = "none"
)

// Timing is the set of timing constants an agent advertises in its lease
// record; the controller computes its grace from them.
type Timing struct {
	RenewInterval   time.Duration `json:"renew_interval"`
	RenewTimeout    time.Duration `json:"renew_timeout"`
	LeaseTTL        time.Duration `json:"lease_ttl"`
	FenceDeadline   time.Duration `json:"fence_deadline"`
	PeerTimeout     time.Duration `json:"peer_timeout"`
	WatchdogTimeout time.Duration `json:"watchdog_timeout,omitempty"`
	ResetBudget     time.Duration `json:"reset_budget,omitempty"`
	MaxClockDrift   float64       `json:"max_clock_drift"`
}

// DefaultTiming returns the default timing constants.
func DefaultTiming() Timing {
	return Timing{
		RenewInterval: DefaultRenewInterval, RenewTimeout: DefaultRenewTimeout,
		LeaseTTL: DefaultLeaseTTL, FenceDeadline: DefaultFenceDeadline,
		PeerTimeout: DefaultPeerTimeout, WatchdogTimeout: DefaultWatchdogTimeout,
		ResetBudget: DefaultResetBudget, MaxClockDrift: MaxClockDrift,
	}
}

// SuspectAfter is the age (since the send time of the last acknowledged
// renewal) at which an agent suspects it can no longer renew, and answers
// its peers that it cannot renew: one interval for the next renewal, one
// timeout for its outcome.
func (t Timing) SuspectAfter() time.Duration { return t.RenewInterval + t.RenewTimeout }

// FenceBy is the age at which the agent starts fencing at the latest.
func (t Timing) FenceBy() time.Duration { return t.LeaseTTL - t.FenceDeadline }

// ConfirmableAge is the largest lease age (since the send time of the last
// landed renewal) at which an agent that is not Held still confirms to its
// peers that it cannot renew. Older, the controller may already have
// declared it expired without the agent knowing (it declares no earlier
// than LeaseTTL + grace, and grace >= FenceDeadline), and a declared host
// no longer counts toward the controller's guard once its declaration is
// older than the guard window; so such an answer must not count toward a
// hold. The drift factor covers both clocks.
func (t Timing) ConfirmableAge() time.Duration {
	return time.Duration(float64(t.LeaseTTL+t.FenceDeadline) * (1 - 2*t.MaxClockDrift))
}

// Validate checks that the constants make a lease the agent can defend: the
// detection path (SuspectAfter + one peer round) fits before FenceBy.
func (t Timing) Validate() error {
	var errs []error
	pos := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%w: %s must be > 0, got %s", ErrInvalidConfig, name, d))
		}
	}
	pos("renew_interval", t.RenewInterval)
	if t.RenewInterval > 0 && t.RenewInterval < MinRenewInterval {
		errs = append(errs, fmt.Errorf("%w: renew_interval must be at least %s (the controller verifies at most 50 beacons a second of a host), got %s", ErrInvalidConfig, MinRenewInterval, t.RenewInterval))
	}
	pos("renew_timeout", t.RenewTimeout)
	pos("lease_ttl", t.LeaseTTL)
	pos("fence_deadline", t.FenceDeadline)
	pos("peer_timeout", t.PeerTimeout)
	if t.MaxClockDrift < 0 || t.MaxClockDrift > MaxSupportedDrift {
		errs = append(errs, fmt.Errorf("%w: max_clock_drift must be in [0, %g], got %g", ErrInvalidConfig, MaxSupportedDrift, t.MaxClockDrift))
	}
	if len(errs) == 0 && t.SuspectAfter()+t.PeerTimeout > t.FenceBy() {
		errs = append(errs, fmt.Errorf("%w: lease_ttl %s too short: renew_interval+renew_timeout+peer_timeout (%s) must fit before lease_ttl-fence_deadline (%s)",
			ErrInvalidConfig, t.LeaseTTL, t.SuspectAfter()+t.PeerTimeout, t.FenceBy()))
	}
	return errors.Join(errs...)
}

// Guard is the controller's mass-failure guard as the agents know it: the
// controller publishes it in the lease bucket (key GuardKey) with the
// membership size it computed it for, and agents cache it while healthy.
type Guard struct {
	// Count and Share: the controller holds when more than
	// min(Count, floor(Share*Members)) hosts are silent in one Window.
	Count  int           `json:"count"`
	Share  float64       `json:"share"`
	Window time.Duration `json:"window"`
	// Members is the number of hosts in the lease bucket when the guard was
	// published.
	Members int `json:"members"`
	// Version numbers the guards the controller published (1, 2, …; 0:
	// unversioned). An agent never replaces its guard by an older version
	// and names the version and threshold it acts on in its lease record
	// (LeaseRecord.Guard).
	Version uint64 `json:"version,omitempty"`
	// History lists the (version, threshold) of this and earlier versions
	// that some agent may still act on, pruned by the controller; a
	// controller that restarts (or takes over) restores it, so that it
	// never holds later than an agent still on an older guard expects.
	History []GuardVersion `json:"history,omitempty"`
	// Deleted lists the hosts whose lease key was deleted while their
	// agent may still run (and confirm its peers' holds): the controller
	// keeps counting them as silent, and a controller that restarts (or
	// takes over) restores them from here. Agents ignore it.
	Deleted []DeletedHost `json:"deleted,omitempty"`
	// Signer and Sig: the controller key that signed the guard and its
	// signature (sign.go); absent when signing is off.
	Signer string `json:"signer,omitempty"`
	Sig    string `json:"sig,omitempty"`
}

// DeletedHost is a host of Guard.Deleted: its name and the guard version
// its last record named.
type DeletedHost struct {
	Host  string        `json:"host"`
	Guard *GuardVersion `json:"guard,omitempty"`
}

// GuardVersion is one published guard version and its threshold.
type GuardVersion struct {
	Version   uint64 `json:"version"`
	Threshold int    `json:"threshold"`
}

// Ref returns the version and threshold an agent acting on g names in its
// lease record (nil when g is not valid: the agent cannot be Held).
func (g Guard) Ref() *GuardVersion {
	if !g.Valid() {
		return nil
	}
	return &GuardVersion{Version: g.Version, Threshold: g.Threshold(g.Members)}
}

// DefaultGuard returns the default guard for members hosts.
func DefaultGuard(members int) Guard {
	return Guard{Count: DefaultGuardCount, Share: DefaultGuardShare, Window: DefaultGuardWindow, Members: members}
}

// Threshold is the largest number of silent hosts that does NOT make the
// controller hold, for members hosts: min(Count, floor(Share*members)).
// Holding needs strictly more.
func (g Guard) Threshold(members int) int {
	t := int(g.Share * float64(members))
	if g.Count < t {
		t = g.Count
	}
	if t < 0 {
		t = 0
	}
	return t
}

// Valid reports whether the guard can be used by an agent to hold.
func (g Guard) Valid() bool {
	return g.Members > 0 && g.Count >= 0 && g.Share >= 0 && g.Window > 0
}

// Mutations switch individual safety fixes OFF, for the simulation's
// mutation checks (controller/sim_test.go) only: each switch must make a
// safety property fail there, which shows that the property guards the
// fix. Production code never sets them.
var Mutations struct {
	// RelayedNoBeacon: a relayed landing asks for no beacon (the shell
	// published beacons of its own writes only).
	RelayedNoBeacon bool
	// RestartRefreshesHold: a restart carrying Held over from the durable
	// state grants itself a fresh hold (peer_timeout from now) however old
	// its last confirmation is.
	RestartRefreshesHold bool
	// LegacyBackstop: advertise reset over an armed watchdog when reset
	// is allowed (the grace then misses a dead agent's watchdog reset).
	LegacyBackstop bool
	// StopWithoutWithdrawal: Stop reports the host withdrawn without
	// writing anything (the old orderly stop: watchdog magic-closed, the
	// lease left to lapse into a declaration).
	StopWithoutWithdrawal bool
	// RestartKeepsWithdrawnAge: a start from a withdrawn record keeps the
	// lease age of the durable state (the process that withdrew), so an
	// upgrade that took longer than fence_by fences at once.
	RestartKeepsWithdrawnAge bool
	// FencedFeedsUnlisted: a restart carrying "fenced" over from the
	// durable state feeds the watchdog before it listed (and re-fenced)
	// the domains.
	FencedFeedsUnlisted bool
	// WithdrawnRestartConfirms: an agent started from its withdrawn record
	// confirms "cannot renew" to its peers before a renewal of its landed
	// (the controller does not count a withdrawn host).
	WithdrawnRestartConfirms bool
	// WithdrawnKeyNotCarried: a restart with NATS unreachable forgets that
	// the previous process started behind a withdrawn key and never
	// landed a renewal (it confirms its peers' holds again).
	WithdrawnKeyNotCarried bool
	// NewTimingForOldLease: a restart with changed timing constants counts
	// the lease it inherits with the new ones (a longer lease_ttl or
	// watchdog_timeout the controller never saw).
	NewTimingForOldLease bool
	// ReleaseHidesDeclaration: a released record read at start, or of a
	// newer epoch in a conflict, is taken over as if the host had never
	// been declared (the rejoin resumes the paused set).
	ReleaseHidesDeclaration bool
	// StopTrustsFencedState: a stop from fenced, rejoining or awaiting
	// release ends "fenced" at once, on the last listing, fencing nothing
	// that runs (a domain started while rejoining).
	StopTrustsFencedState bool
	// FencedStopMagicCloses: a stop that fenced (its withdrawal not
	// confirmed) magic-closes the watchdog as a withdrawn one does: a
	// domain started after it runs into the controller's declaration.
	FencedStopMagicCloses bool
	// RuntimeCopyIgnored: ChooseDurable ignores the per-boot runtime copy
	// of the durable state: a restart whose state_dir lost fence.json
	// starts as a first start (the lease age of one interval feeds the
	// watchdog past the real lease).
	RuntimeCopyIgnored bool
	// UntrustedRecordsTrusted (issue 11): a conflict's record is taken as
	// it comes — a record of another host, a replay (StaleRecord), an old
	// epoch's withdrawal — and an invalid one fails the renewal without
	// its revision being learned (before signed records).
	UntrustedRecordsTrusted bool
	// PeerRevisionTrusted: a revision one peer reports is sealed into
	// the next renewal at once, as before reviewer X85.
	PeerRevisionTrusted bool
	// IncarnationFloorIgnored: Config.IncarnationFloor is ignored, as
	// before reviewer X86.
	IncarnationFloorIgnored bool
	// SharedTally: peers' landing reports and revision claims are counted
	// in one tally, as before reviewer X86.
	SharedTally bool
	// SharedClaimTally: the kinds of peers' revision claims (invalid
	// record, key absent, another active record) are counted in one
	// tally, as before reviewer X88.
	SharedClaimTally bool
	// KeyAbsentRevisionIgnored: the marker revision a conflict showing no
	// record names (own, or a peer's "key absent") is ignored, and the
	// next relayed write is a create sealed for 0: relayed creates
	// unanchored, as before.
	KeyAbsentRevisionIgnored bool
	// KeyAbsentZeroActed (reviewer X92): with lying_peers ≥ 1, a peer's
	// "key absent" naming no marker (revision 0) is acted on as before:
	// the next relayed renewal is a create sealed for 0 the liar holds.
	KeyAbsentZeroActed bool
	// SelfDeclOnNamedMarker (reviewer X92): a self-declaration whose write
	// conflicted with no record is retried by a CAS on the marker the
	// conflict named (not on revision 0, anchored as it is written).
	SelfDeclOnNamedMarker bool
	// RelayShownDeclarationIgnored (issue 11, reviewer X4): a signed
	// declaration of a later epoch that a peer's relay shows is ignored
	// (the agent fences only when its lease lapses, never while Held).
	RelayShownDeclarationIgnored bool

	// Issue 10 items 3 and 4 (guard versions, deleted keys):
	//
	// AcceptOlderGuard: SetMembers takes a guard older than the one the
	// agent has (a lagging read, an old publish landing late): the agent
	// may act on a version the controller no longer keeps.
	AcceptOlderGuard bool
	// KeyDeleteAlwaysRecreates: an agent that finds its key deleted
	// re-creates its active record whatever its state (it rejoins and
	// resumes, though the delete may have erased a declaration).
	KeyDeleteAlwaysRecreates bool
	// SelfDeclareBeforeFence: the self-declaration after a key delete is
	// written while the fence is still in progress.
	SelfDeclareBeforeFence bool
}

// Config configures an Agent. Start from DefaultConfig.
type Config struct {
	// Host is this node's name; BootID identifies this boot of the host
	// (/proc/sys/kernel/random/boot_id).
	Host   string
	BootID string
	// Enabled turns fencing on. Off, the agent still renews its lease
	// (advertising fencing off, which the controller refuses to declare),
	// never fences and never arms the hardware watchdog.
	Enabled bool
	// Action is the fence action (default ActionPause).
	Action Action
	// AllowReset allows escalation to a host reset when the fence action
	// did not complete by its deadline.
	AllowReset bool
	// HardwareWatchdog says the hardware watchdog is armed (the caller arms
	// it when Enabled and the action is not ActionNone).
	HardwareWatchdog bool
	// Timing holds the timing constants (advertised in the lease).
	Timing Timing
	// HeldRecheck is how often a Held agent asks its peers again.
	HeldRecheck time.Duration
	// PeerBatch: a round asks min(N-1, threshold+PeerBatch) peers.
	PeerBatch int
	// LyingPeers is how many peers may lie (compromised nodes answering
	// "cannot renew" while they renew): the agent is Held only when itself
	// plus its confirmations exceed the guard threshold by more than
	// LyingPeers, so that the hosts really silent — the ones the
	// controller counts — still exceed it; and a landing of a renewal that
	// only peers report (a relay) counts once more than LyingPeers peers
	// reported it (docs/security.md). Meaningful
	// only with answers signed by each peer's own key (signing); 0: every
	// peer is trusted (the protocol before issue 11). The agent's default
	// is DefaultLyingPeers(mode).
	LyingPeers int
	// Seed seeds the random choice of peers.
	Seed uint64
	// IncarnationFloor is the lowest incarnation this agent process takes
	// (0: none). The shell passes the wall clock in milliseconds at start
	// (or the fencing clock, CLOCK_BOOTTIME, if later): a later process
	// never takes an earlier one's incarnation, even with its durable
	// state lost while its key showed none of its records (reviewer X68's
	// case) or an old record of its own put back (the start takes the
	// key's incarnation + 1). A reused incarnation restarted its seqs: its
	// records were not newer than the earlier process's, and the
	// controller refused them as held back after that process's withdrawal
	// — the restarted host, once dead, never declared (reviewer X86,
	// TestX86StateLostAfterWithdrawalNeverDeclared). The boot clock alone
	// (X86's fix) did not do: durable state carries the previous boot's
	// incarnations (a month of uptime: ~2.6e9 ms) far above a new boot's
	// clock (reviewer X87, TestX87PutBackRecordReusesIncarnation). Left: a
	// wall clock stepped back across a state-lost restart.
	IncarnationFloor uint64
	// AgentVersion is advertised in the lease record (agent_version), for
	// the controller's fleet view; informational only.
	AgentVersion string
}

// DefaultLyingPeersRequired is fence.signing.lying_peers' default with
// signing required: `required` exists for a compromised-node threat model,
// and with 0 one compromised peer answering "relayed" (writing nothing)
// kept a cut-off host running past its declaration
// (TestLyingRelayCannotKeepDeclaredHostRunning). The price (docs/security.md,
// "Lying peers"): a hold needs one more confirmation than the guard
// threshold, and a relayed renewal counts only when two peers that reach
// NATS report it.
const DefaultLyingPeersRequired = 1

// DefaultLyingPeers returns LyingPeers' default for a signing mode:
// DefaultLyingPeersRequired with SigningRequired; 0 otherwise (off: answers
// are not host-signed, so one member can answer in every name and n
// bounds nothing; optional: a migration step).
func DefaultLyingPeers(mode SigningMode) int {
	if mode == SigningRequired {
		return DefaultLyingPeersRequired
	}
	return 0
}

// DefaultConfig returns the defaults for host (fencing off).
func DefaultConfig(host, bootID string) Config {
	return Config{
		Host: host, BootID: bootID, Action: ActionPause, Timing: DefaultTiming(),
		HeldRecheck: DefaultHeldRecheck, PeerBatch: DefaultPeerBatch,
	}
}

// Backstop returns what stops this host's domains when the agent does not,
// the slowest of the paths configured: the hardware watchdog if armed
// (it alone works without the agent process; a live agent may reset
// sooner), else a reset if allowed (needs a live agent), else none.
func (c Config) Backstop() Backstop {
	switch {
	case c.HardwareWatchdog && !Mutations.LegacyBackstop:
		return BackstopWatchdog
	case c.Action == ActionResetHost || c.AllowReset:
		return BackstopReset
	case c.HardwareWatchdog:
		return BackstopWatchdog
	}
	return BackstopNone
}

// Validate checks the configuration, reporting every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Host == "" {
		errs = append(errs, fmt.Errorf("%w: host is empty", ErrInvalidConfig))
	}
	switch c.Action {
	case ActionPause, ActionDestroy, ActionResetHost, ActionNone:
	default:
		errs = append(errs, fmt.Errorf("%w: fence action %q (want pause, destroy, reset-host or none)", ErrInvalidConfig, c.Action))
	}
	if c.HeldRecheck <= 0 {
		errs = append(errs, fmt.Errorf("%w: held_recheck must be > 0, got %s", ErrInvalidConfig, c.HeldRecheck))
	}
	if c.LyingPeers < 0 {
		errs = append(errs, fmt.Errorf("%w: lying_peers must not be negative, got %d", ErrInvalidConfig, c.LyingPeers))
	}
	if c.PeerBatch < 0 {
		errs = append(errs, fmt.Errorf("%w: peer_batch must be >= 0, got %d", ErrInvalidConfig, c.PeerBatch))
	}
	if c.HardwareWatchdog && c.Timing.WatchdogTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: watchdog_timeout must be > 0 when the hardware watchdog is armed", ErrInvalidConfig))
	}
	if err := c.Timing.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

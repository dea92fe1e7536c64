// Command hvguard-controller is the central hvguard daemon: it watches the
// agents' leases, declares silent hosts expired (one leader at a time among
// the controllers that run) and serves their status. See
// `hvguard-controller --help`, the README and docs/controller.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"syscall"
	"time"

	"hvguard/controller"
	"hvguard/controller/daemon"
	"hvguard/controller/natsperm"
	"hvguard/daemonkit"
	"hvguard/fencing/natslease"

	"github.com/nats-io/nats.go/jetstream"
)

// ExitConfig is the exit status for an unreadable or invalid configuration
// (78, EX_CONFIG: systemd does not restart the controller).
const ExitConfig = daemonkit.ExitConfig

// StatusTimeout bounds `status`'s request to the running controller.
const StatusTimeout = 5 * time.Second

const usage = `hvguard-controller — the central hvguard daemon. It watches the agents'
leases in the NATS KV bucket hvguard-leases and declares a host expired when
it stopped renewing for its lease TTL plus the grace its fencing constants
need (never while the mass-failure guard holds, never a host whose constants
it cannot honour). Run two or more: one leader, chosen by a compare-and-set
lock in the same bucket, acts; the standbys watch and take over. The leader
recovers a declared host as recovery.mode says: notify (the default: publish
the decision, call nothing), evacuate (force its nova-compute down, remove
the dead host's Cinder attachments, evacuate and verify, keep it forced down
until its agent has rejoined) or masakari (hand it to Masakari). With
instance_recovery.mode restart the leader also restarts instances whose
domain stopped unexpectedly as the agents classified it (never a reboot nor
a stop Nova made; once per stop, within a budget; masakari: a Masakari VM
notification instead; notify: report only; off: the default).

Usage:
  hvguard-controller [flags]            run the daemon
  hvguard-controller status [HOST] [--json] [--addr HOST:PORT]
                                        print the running controller's view
  hvguard-controller nats-accounts --keys DIR [--receipts-streams DIR
                      [--replicas N]] USER...
                                        print the NATS server accounts block
                                        (and write each agent's withdrawal
                                        receipts stream's configuration)
  hvguard-controller confirm-rollback [--config PATH] [--reason TEXT] HOST...
                                        after the lease stream rolled back:
                                        let the controllers declare HOST
                                        (check it is down first)
  hvguard-controller mark-rollback [--config PATH] [--reason TEXT] [--clear]
                                        the lease stream was restored while
                                        no controller ran: gate them all
                                        (--clear: delete it, then restart
                                        the controllers)
  hvguard-controller keygen [--show] [PATH]
                                        write this controller's signing key
                                        for signed lease records (default
                                        /etc/hvguard/keys/controller.seed,
                                        mode 0600, never overwritten) and
                                        print its public key for the agents'
                                        fence.signing.controller_keys
                                        (docs/security.md)

Flags:
  --config PATH        configuration file (default %s)
  --check-config [PATH]
                       validate the configuration file (--config, or PATH)
                       and exit (0 = valid, 78 = invalid)
  --print-defaults     print the built-in default configuration as YAML and exit
  --log-level LEVEL    override log.level (debug, info, warn, error)
  --log-format FORMAT  override log.format (json, text)
                       (under systemd, on the journal's stream, each line
                       starts with its syslog priority: journalctl -p err)
  --version            print the version and exit
  -h, --help           this help

status: asks the controller on --addr (default: metrics.listen of --config
if that file exists, else %s) for GET /status and prints this process's
role (leader or standby), the lock's holder and term, the mass-failure
guard and, per host, the lease state, epoch, backstop, the grace granted,
the time since its last renewal and why it is refused; then the event
stream: the consumer's lag and counters (duplicates, missing events, new
incarnations, poison messages) and, per host, its domains, how many run,
its last seq and incarnation and whether its view is complete or STALE
(and why: until the agent's next full report). status HOST prints that
host's lease, its domains (state, last transition, reason, classification)
and its last 50 events with what the controller did with each. The
leader's status also shows host recovery: per host the phase, whether it
is forced down, its instances (done, in flight, failed, unrecoverable) and
why it is where it is (a refusal, a pause, Nova refusing to clear
forced_down); a standby runs none. With instance recovery on, status
lists its mode, the stops in progress, the instances over budget and the
last 20 stops (classification, step, reason, action, time to ACTIVE). --json
prints the endpoint's JSON. Any controller (leader or standby) answers,
each from its own view of the stream. Exit status:
0 printed, 1 no controller answered (or a bad answer), 2 bad command line,
78 invalid --config.

nats-accounts: prints, for nats-server.conf (include it), the HVGUARD
account (agents, the event stream, the lease bucket) and the
HVGUARD_CONTROL account (the controllers' own buckets: leader lock, guard,
memory, recovery; no agent has a user there) with one NKey user per USER
and its least-privilege permissions (docs/security.md, "NATS permissions").
USER is agent:HOST (one per compute node, its host: setting),
controller:ID (every controller) or reader:NAME (read-only consumers).
Each user's NKey seed is DIR/ROLE-NAME.nk, and a controller's or reader's
HVGUARD_CONTROL user's DIR/ROLE-NAME.control.nk: read if it exists, else
created (mode 0600, said on stderr); copy them to that machine (e.g.
/etc/hvguard/nats.nk and nats-control.nk, mode 0600) and set
nats.nkey_seed_file (and, on controllers, nats.control.nkey_seed_file).
With --receipts-streams DIR it also writes each agent's own withdrawal
receipts stream's JSON configuration to DIR/hvguard-withdrawals-HOST.json
(HOST with '_' for '.'; --replicas N: 1 to 5, default 1; 3 in a
three-server cluster): create each with nats stream add --config FILE
(the files of hosts that have their stream already can be skipped). A
host's stream captures its receipt subject only, so no other host's
flood shares its ingest queue, and it has no stream-wide limit, so no
flood can fill it and make it refuse a receipt; a controller does not
take the absence of a receipt as evidence from a stream that is not the
host's own or breaks these rules (docs/security.md, "Withdrawal
receipts"). The older shared stream hvguard-withdrawals is read but
vouches for no host: move each host to its own stream
(docs/operations.md).
Run it again with the whole fleet whenever a host or controller is added.
Exit status: 0 printed, 2 bad command line or user, 1 a key or a stream's
file could not be read or written.

confirm-rollback: after the lease stream rolled back (the alert
HvguardControllerLeaseRevisionsRegressed), a controller declares a silent
host only once a beacon of the host has proved its record is its own and
newer than what it wrote before, or an operator confirms it: status shows
such hosts as NOT DECLARED, the metric hvguard_controller_hosts_rollback_gated
counts them. Check the host is down (powered off, or its guests gone), then
confirm it: the command writes the confirmation to the controllers' control
bucket with --config's NATS user (nats.control when set), and every running
controller takes it within 2 s — a controller started after it (or less
than 10 s before it) does not: confirm again after restarting one. The
controller that finds a rollback
writes a rollback marker to the control bucket; a confirmation names the
marker that stands (none: nothing to confirm, exit 1) and counts only
while it stands. While the marker stands every controller that
(re)starts is gated too. mark-rollback writes it by hand: run it after
restoring the lease stream while no controller ran (none can find that
rollback), before starting them. mark-rollback --clear deletes it: do it
once the fleet's host keys are rotated (copies of records from before the
rollback then fail their signature), then restart the controllers — a
running controller that read the marker keeps its gate until it restarts. Exit status: 0 written, 2 bad command line or host name,
78 bad configuration, 1 NATS refused or timed out. docs/security.md, "The
rollback gate".

Exit status: 0 stopped cleanly, 1 failed at run time, 2 bad command line,
78 unreadable or invalid configuration (systemd does not restart it).

Signals: SIGTERM/SIGINT stop gracefully: the tracker stops (no write in
flight), then the leader lock is resigned, so a standby takes over within
about 2 s (TakeoverAfter(act_margin)) instead of a whole lock TTL (10.2 s).

Under systemd (Type=notify) the controller sends READY=1 once NATS is
connected and both watches (the leader lock, the lease bucket) have synced
(or, after nats.ready_timeout, in a degraded mode that keeps retrying and
acts on nothing), WATCHDOG=1 from the tracker's loop while the leader
lock's loop progresses too, and a STATUS= line (leader or standby, term,
hosts, guard).

Endpoint (metrics.listen): /metrics (Prometheus), /healthz, /status.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "keygen" {
		// The public key for the agents' fence.signing.controller_keys
		// (and the other controllers' signing.controller_keys).
		return daemonkit.Keygen("hvguard-controller", daemon.DefaultKeyFile, args[1:], stdout, stderr,
			func(pub string) string { return pub })
	}
	if len(args) > 0 && args[0] == "status" {
		return runStatus(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "confirm-rollback" {
		return runConfirmRollback(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "mark-rollback" {
		return runMarkRollback(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "nats-accounts" {
		return runNATSAccounts(args[1:], stdout, stderr)
	}
	cli := daemonkit.NewCLI("hvguard-controller", daemon.DefaultConfigPath, stderr, func() {
		fmt.Fprintf(stderr, usage, daemon.DefaultConfigPath, daemon.DefaultListen)
	})
	if code, done := cli.Parse(args, stderr); done {
		return code
	}
	cfg, code, done := daemonkit.Start(cli, stdout, stderr, daemon.Version, daemon.DefaultConfig(), daemon.LoadConfig)
	if done {
		return code
	}
	cfgPath := cli.Config
	if *cli.Check {
		fmt.Fprintf(stdout, "%s: configuration is valid (id %s, nats %s)\n", *cfgPath, cfg.ID, cfg.NATS.URL())
		return 0
	}
	log, err := daemon.NewLogger(stderr, cfg.Log)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("starting", "version", daemon.Version, "config", *cfgPath, "id", cfg.ID)
	if err := daemon.Run(ctx, cfg, log, daemon.Options{}); err != nil {
		log.Error("controller failed", "err", err)
		return 1
	}
	return 0
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := subcommand("status", stderr)
	cfgPath := fs.String("config", daemon.DefaultConfigPath, "")
	addr := fs.String("addr", "", "")
	asJSON := fs.Bool("json", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	host := ""
	if fs.NArg() > 0 {
		// status HOST [flags]: flags may follow the host.
		host = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "hvguard-controller status: unexpected argument %q (see --help)\n", fs.Arg(0))
			return 2
		}
	}
	if *addr == "" {
		*addr = daemon.DefaultListen
		if _, err := os.Stat(*cfgPath); err == nil || daemonkit.FlagSet(fs, "config") {
			cfg, err := daemon.LoadConfig(*cfgPath)
			if err != nil {
				fmt.Fprintf(stderr, "hvguard-controller status: %v\n", err)
				return ExitConfig
			}
			if cfg.Metrics.Listen == "" {
				fmt.Fprintf(stderr, "hvguard-controller status: metrics.listen is empty in %s: the controller serves no status (give --addr)\n", *cfgPath)
				return 1
			}
			*addr = cfg.Metrics.Listen
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), StatusTimeout)
	defer cancel()
	st, err := daemon.FetchStatus(ctx, *addr, host)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller status: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
		return 0
	}
	if host != "" {
		daemon.PrintHost(stdout, host, st)
		return 0
	}
	daemon.PrintStatus(stdout, st)
	return 0
}

func runNATSAccounts(args []string, stdout, stderr io.Writer) int {
	fs := subcommand("nats-accounts", stderr)
	keys := fs.String("keys", "", "")
	streamDir := fs.String("receipts-streams", "", "")
	oldStream := fs.String("receipts-stream", "", "")
	replicas := fs.Int("replicas", 1, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *keys == "" || fs.NArg() == 0 {
		fmt.Fprintln(stderr, "hvguard-controller nats-accounts: --keys DIR and at least one USER (agent:HOST, controller:ID, reader:NAME) are required")
		return 2
	}
	if *replicas < 1 || *replicas > 5 {
		fmt.Fprintf(stderr, "hvguard-controller nats-accounts: --replicas %d: want 1 to 5\n", *replicas)
		return 2
	}
	var users []natsperm.User
	seen := map[string]bool{}
	for _, spec := range fs.Args() {
		u, err := natsperm.ParseUser(spec)
		if err != nil {
			fmt.Fprintf(stderr, "hvguard-controller nats-accounts: %v\n", err)
			return 2
		}
		if seen[spec] {
			fmt.Fprintf(stderr, "hvguard-controller nats-accounts: %q given twice\n", spec)
			return 2
		}
		seen[spec] = true
		users = append(users, u)
	}
	if err := os.MkdirAll(*keys, 0o700); err != nil {
		fmt.Fprintf(stderr, "hvguard-controller nats-accounts: --keys: %v\n", err)
		return 1
	}
	for i := range users {
		created, err := natsperm.KeyPair(*keys, &users[i])
		if err != nil {
			fmt.Fprintf(stderr, "hvguard-controller nats-accounts: %v\n", err)
			return 1
		}
		for _, path := range created {
			fmt.Fprintf(stderr, "created %s (copy it to %s %s, mode 0600)\n", path, users[i].Role, users[i].Name)
		}
	}
	out, err := natsperm.Render(users, natsperm.Header)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller nats-accounts: %v\n", err)
		return 2
	}
	if *oldStream != "" {
		fmt.Fprintln(stderr, "hvguard-controller nats-accounts: --receipts-stream FILE is gone: each agent has its own receipts stream now — use --receipts-streams DIR (docs/operations.md)")
		return 2
	}
	if *streamDir != "" {
		if code := writeReceiptsStreams(*streamDir, *replicas, users, stderr); code != 0 {
			return code
		}
	}
	_, _ = io.WriteString(stdout, out)
	return 0
}

// writeReceiptsStreams writes each of users' agents' own withdrawal
// receipts stream's JSON configuration to dir/<stream>.json (for nats
// stream add --config; natslease.WithdrawalStreamConfig).
func writeReceiptsStreams(dir string, replicas int, users []natsperm.User, stderr io.Writer) int {
	var cfgs []jetstream.StreamConfig
	for _, u := range users {
		if u.Role != natsperm.RoleAgent {
			continue
		}
		cfg, err := natslease.WithdrawalStreamConfig(replicas, u.Name)
		if err != nil {
			fmt.Fprintf(stderr, "hvguard-controller nats-accounts: --receipts-streams: %v\n", err)
			return 2
		}
		cfgs = append(cfgs, cfg)
	}
	if len(cfgs) == 0 {
		fmt.Fprintln(stderr, "hvguard-controller nats-accounts: --receipts-streams needs the agents (agent:HOST): each has its own stream")
		return 2
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "hvguard-controller nats-accounts: --receipts-streams: %v\n", err)
		return 1
	}
	for _, cfg := range cfgs {
		b, err := json.MarshalIndent(cfg, "", "  ")
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, cfg.Name+".json"), append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "hvguard-controller nats-accounts: --receipts-streams: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "wrote %d withdrawal receipts stream configuration(s) to %s (for each: nats stream add --config %s/hvguard-withdrawals-HOST.json)\n", len(cfgs), dir, dir)
	return 0
}

func runConfirmRollback(args []string, stdout, stderr io.Writer) int {
	fs := subcommand("confirm-rollback", stderr)
	cfgPath := fs.String("config", daemon.DefaultConfigPath, "")
	reason := fs.String("reason", "", "")
	var hosts []string
	rest := args
	for {
		// Flags may follow the hosts.
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		hosts = append(hosts, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(hosts) == 0 {
		fmt.Fprintln(stderr, "hvguard-controller confirm-rollback: at least one HOST is required (see --help)")
		return 2
	}
	for _, h := range hosts {
		if _, err := controller.ConfirmKey(h); err != nil {
			fmt.Fprintf(stderr, "hvguard-controller confirm-rollback: host %q: %v\n", h, err)
			return 2
		}
	}
	cfg, err := daemon.LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller confirm-rollback: %v\n", err)
		return ExitConfig
	}
	revs, err := daemon.ConfirmRollback(context.Background(), cfg, hosts, operator(), *reason, time.Now())
	for i, rev := range revs {
		fmt.Fprintf(stdout, "%s: confirmed (control bucket revision %d): the controllers declare it when due, within %s\n", hosts[i], rev, controller.ConfirmPollInterval)
	}
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller confirm-rollback: %v\n", err)
		return 1
	}
	return 0
}

// subcommand is the flag set of `hvguard-controller NAME` (its usage is
// the whole --help).
func subcommand(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("hvguard-controller "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintf(stderr, usage, daemon.DefaultConfigPath, daemon.DefaultListen) }
	return fs
}

// operator names who runs the command: user@host.
func operator() string {
	by := "unknown"
	if u, err := user.Current(); err == nil {
		by = u.Username
	}
	if hn, err := os.Hostname(); err == nil {
		by += "@" + hn
	}
	return by
}

func runMarkRollback(args []string, stdout, stderr io.Writer) int {
	fs := subcommand("mark-rollback", stderr)
	cfgPath := fs.String("config", daemon.DefaultConfigPath, "")
	reason := fs.String("reason", "marked by hand: the lease stream was restored while no controller ran", "")
	clear := fs.Bool("clear", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hvguard-controller mark-rollback: unexpected argument %q (see --help)\n", fs.Arg(0))
		return 2
	}
	cfg, err := daemon.LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller mark-rollback: %v\n", err)
		return ExitConfig
	}
	rev, err := daemon.MarkRollback(context.Background(), cfg, operator(), *reason, time.Now(), *clear)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-controller mark-rollback: %v\n", err)
		return 1
	}
	if *clear {
		fmt.Fprintf(stdout, "rollback marker (revision %d) deleted: controllers started from now on run without the rollback gate; restart the running ones (each keeps its gate until it restarts)\n", rev)
		return 0
	}
	fmt.Fprintf(stdout, "rollback marker written (control bucket revision %d): every controller declares only hosts whose beacon proves their record, or that an operator confirms, until it is cleared (--clear)\n", rev)
	return 0
}

// Command hvguard-agent is the hvguard daemon for an OpenStack/libvirt
// compute node. See `hvguard-agent --help` and the README.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"hvguard/agent"
	"hvguard/daemonkit"
)

// DefaultConfigPath is where the packages install the configuration.
const DefaultConfigPath = "/etc/hvguard/agent.yaml"

// ExitConfig is the exit status for an unreadable or invalid configuration
// (78, EX_CONFIG: systemd does not restart the agent).
const ExitConfig = daemonkit.ExitConfig

const usage = `hvguard-agent — reports libvirt domain lifecycle events to NATS JetStream,
debounced per domain and checked against the domain's real state, so that a
rebooting guest is never reported as stopped and a real stop is reported once.

Usage:
  hvguard-agent [flags]                 run the agent
  hvguard-agent status [--json] [flags] one screen: is this host healthy?
  hvguard-agent unfence [flags]         release this host after a declaration
  hvguard-agent keygen [--show] [PATH]  write this host's signing key for
                                        signed lease records and events (an nkey seed,
                                        mode 0600, never overwritten; default
                                        /etc/hvguard/keys/agent.seed) and
                                        print "<host> <public key>" for the
                                        fleet's host key file (--show: for an
                                        existing key); docs/security.md

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

status (alias --status): asks the running agent on its unix socket
(status.socket, default /run/hvguard/agent.sock, mode 0600: run it as root)
and prints the fence state and reason, the lease (held, last renewal, age),
the hardware watchdog, the NATS and libvirt connections, the outbox (depth
of its bound, dropped events, gap markers), the stops held back (in their
window, being classified) and the last reconciliation with Nova (what was
checked, found, destroyed and why not). When the agent does not answer
within 3 s it says so and reads the state files instead (state_dir/fence.json
or its runtime copy, state_dir/reconcile-last.json).
  --json               the same as JSON (its fields: README, "Status")
  --socket PATH        ask this socket instead of status.socket
Exit status of status: 0 healthy, 1 degraded (running, but NATS or libvirt
disconnected, the lease not held, fencing not healthy, the watchdog not
armed, the outbox at 80%% of its bound, or the last reconciliation not OK),
3 fenced (fencing, fenced or declared: awaiting release; also from the
state files when the agent is down), 4 the agent is down (and its state
files do not say fenced), 2 bad command line, 78 invalid configuration.

unfence (alias --unfence): release this host after the controller declared
it expired (fencing), or after the agent declared itself because its lease
key was deleted while it was fenced: writes a released lease record;
refuses while evacuations are not reconciled; the agent then resumes
nothing (see docs/fencing.md).

Exit status: 0 stopped cleanly, 1 failed at run time, 2 bad command line,
78 unreadable or invalid configuration (systemd does not restart it).

Signals: SIGTERM/SIGINT stop gracefully. With fencing on, the lease is
withdrawn first (the controller will not declare the host, which is then
unprotected until the agent runs again); if that cannot be confirmed (NATS
unreachable) the host is fenced before the agent leaves, and a fence that
misses its deadline leaves the hardware watchdog armed. Then the outbox is
flushed to NATS within shutdown_timeout; what is not sent stays on disk and
is sent at next start. A start that fails after fencing started (outbox,
libvirt, ...) withdraws the lease the same way.

Under systemd (Type=notify) the agent sends READY=1 once libvirt is connected
and NATS is connected (or, after nats.ready_timeout, in a degraded mode that
keeps events in the outbox), and WATCHDOG=1 from its event loop.

Metrics: http://<metrics.listen>/metrics, health: /healthz.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Subcommands (the first argument); the flags --status and --unfence
// are their older spellings, kept as aliases.
const (
	cmdStatus  = "status"
	cmdUnfence = "unfence"
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "keygen" {
		// The line for the fleet's host key file (the controllers' and
		// every agent's fence.signing.host_keys_file).
		return daemonkit.Keygen("hvguard-agent", agent.DefaultKeyFile, args[1:], stdout, stderr,
			func(pub string) string { return daemonkit.Hostname() + " " + pub })
	}
	cli := daemonkit.NewCLI("hvguard-agent", DefaultConfigPath, stderr, func() { fmt.Fprintf(stderr, usage, DefaultConfigPath) })
	unfence := cli.FS.Bool("unfence", false, "")
	status := cli.FS.Bool("status", false, "")
	asJSON := cli.FS.Bool("json", false, "")
	socket := cli.FS.String("socket", "", "")
	if len(args) > 0 {
		switch args[0] {
		case cmdStatus:
			*status, args = true, args[1:]
		case cmdUnfence:
			*unfence, args = true, args[1:]
		}
	}
	if code, done := cli.Parse(args, stderr); done {
		return code
	}
	if *status && *unfence {
		fmt.Fprintln(stderr, "hvguard-agent: status and unfence exclude each other (see --help)")
		return 2
	}
	if !*status && (*asJSON || daemonkit.FlagSet(cli.FS, "socket")) {
		fmt.Fprintln(stderr, "hvguard-agent: --json and --socket go with status (see --help)")
		return 2
	}
	cfg, code, done := daemonkit.Start(cli, stdout, stderr, agent.Version, agent.DefaultConfig(), agent.LoadConfig)
	if done {
		return code
	}
	cfgPath := cli.Config
	if *cli.Check {
		fmt.Fprintf(stdout, "%s: configuration is valid (host %s, libvirt %s)\n", *cfgPath, cfg.Host, cfg.Libvirt.URI)
		return 0
	}
	if *status {
		return runStatus(cfg, *socket, *asJSON, stdout, stderr)
	}
	log, err := agent.NewLogger(stderr, cfg.Log)
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-agent: %v\n", err)
		return 1
	}
	if *unfence {
		// With reconcile.enabled, refuse while Nova shows stale copies of
		// evacuated instances still running here (a report-mode run).
		rec, closeRec, err := agent.NewUnfenceReconciler(context.Background(), cfg, log)
		if err != nil {
			fmt.Fprintf(stderr, "hvguard-agent: %v\n", err)
			return 1
		}
		defer closeRec()
		msg, err := agent.Unfence(context.Background(), cfg, log, rec)
		if err != nil {
			fmt.Fprintf(stderr, "hvguard-agent: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, msg)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("starting", "version", agent.Version, "config", *cfgPath, "host", cfg.Host)
	if err := agent.Run(ctx, cfg, log, agent.Options{}); err != nil {
		log.Error("agent failed", "err", err)
		return 1
	}
	return 0
}

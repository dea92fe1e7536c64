package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"hvguard/controller"
	"hvguard/controller/instancerecovery"
	"hvguard/proto"
)

// startInstanceRecovery wires instance recovery (unless its mode is off):
// the bucket hvguard-instance-recovery (created with nats.create_bucket),
// the OpenStack adapter, the runner hooked into the event consumer. It
// returns at once; done is closed when the runner has stopped (at once
// when off). ctx is the daemon's (bucket retries end with it), runCtx the
// runner's.
func (d *Daemon) startInstanceRecovery(ctx, runCtx context.Context, js jetstream.JetStream, done chan struct{}) error {
	cfg := d.cfg
	if cfg.InstanceRecovery.Mode == instancerecovery.ModeOff || cfg.InstanceRecovery.Mode == "" {
		close(done)
		return nil
	}
	core, err := instancerecovery.New(cfg.InstanceRecoveryCore())
	if err != nil {
		close(done)
		return fmt.Errorf("instance_recovery: %w", err)
	}
	osr, err := cfg.NewOpenStack(d.log.With("component", "openstack"))
	if err != nil || osr == nil {
		close(done)
		return fmt.Errorf("instance_recovery needs openstack.cloud: %v", err)
	}
	log := d.log.With("component", "instance-recovery")
	d.irReports = make(chan controller.InstanceRecoveryEvent, DecisionQueue)
	d.ir = &controller.InstanceRecoveryRunner{Core: core, Cloud: instanceCloud{os: osr}, MayAct: d.lr.MayAct, LeaderNow: d.now,
		CloudTimeout: cfg.OpenStack.RequestTimeout.D(), Log: log, OnReport: d.instanceReported}
	d.cons.OnApplied = d.ir.Observe
	d.cons.OnSynced = d.ir.Synced
	go func() {
		defer close(done)
		backoff := 500 * time.Millisecond
		for {
			actx, cancel := context.WithTimeout(ctx, BucketAttemptTimeout)
			kv, err := controller.EnsureInstanceBucket(actx, js, cfg.NATS.CreateBucket)
			cancel()
			if err == nil {
				d.ir.KV = kv
				break
			}
			log.Warn("instance recovery bucket not available yet; retrying", "err", err, "retry_in", backoff)
			select {
			case <-runCtx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, BucketRetryMax)
		}
		go d.publishInstanceReports(runCtx)
		_ = osr.Authenticate(runCtx) // the first recovery should not wait for keystone
		log.Info("instance recovery running", "mode", cfg.InstanceRecovery.Mode, "protect", cfg.InstanceRecovery.Protect,
			"details", cfg.InstanceRecovery.Details, "unknown", cfg.InstanceRecovery.Unknown)
		_ = d.ir.Run(runCtx)
	}()
	return nil
}

// instanceReported queues a report for publishing while this controller
// leads (a standby's reports are its own view, not decisions).
func (d *Daemon) instanceReported(rep instancerecovery.Report) {
	if !d.lr.MayAct(d.now()) {
		return
	}
	ev := controller.InstanceRecoveryEvent{Schema: controller.InstanceRecoveryEventSchema, Controller: d.cfg.ID, Term: d.lr.Term(), Report: rep}
	select {
	case d.irReports <- ev:
	default:
		d.m.decisionsDropped.Add(1)
	}
}

// publishInstanceReports publishes queued reports until ctx ends (core
// NATS, best effort, off the runner's loop: a publish on a blackholed
// connection blocks).
func (d *Daemon) publishInstanceReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-d.irReports:
			b, err := json.Marshal(ev)
			if err == nil {
				err = d.nc.Publish(proto.ControllerInstanceRecoverySubject, b)
			}
			if err != nil {
				d.m.decisionsDropped.Add(1)
				d.log.Debug("instance recovery event not published", "domain_uuid", ev.UUID, "err", err)
			}
		}
	}
}

// StatusRecent is how many of the recent instance recovery reports
// `status` prints (the JSON has InstanceRecent).
const StatusRecent = 20

// printInstanceRecovery writes the instance recovery part of status.
func printInstanceRecovery(w io.Writer, v *controller.InstanceRecoveryView) {
	if v == nil {
		return
	}
	fmt.Fprintf(w, "instance recovery: mode %s, %d stops in progress, %d instances over budget\n", v.Mode, v.InProgress, len(v.OverBudget))
	if len(v.OverBudget) > 0 {
		tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "OVER BUDGET\tUUID\tHOST\tSINCE\tNOTE")
		for _, r := range v.OverBudget {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", orDash(r.Name), r.UUID, r.Host, r.At.Local().Format("15:04:05"), r.Error)
		}
		_ = tw.Flush()
	}
	recent := v.Recent
	if len(recent) > StatusRecent {
		recent = recent[len(recent)-StatusRecent:]
	}
	if len(recent) == 0 {
		return
	}
	fmt.Fprintln(w, "recent stops (oldest first):")
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tDOMAIN\tUUID\tHOST\tCLASSIFICATION\tSTEP\tREASON\tACTION\tTOOK")
	for _, r := range recent {
		cl := orDash(r.Classification)
		if r.Detail != "" {
			cl += "/" + r.Detail
		}
		took := "-"
		if r.TookSeconds > 0 {
			took = secs(r.TookSeconds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.At.Local().Format("15:04:05"), orDash(r.Name), r.UUID, r.Host, cl,
			r.Step, r.Reason, orDash(string(r.Action)), took)
	}
	_ = tw.Flush()
}

// irBuckets are the histogram buckets of stop → ACTIVE (s): the floor is
// the agent's 15 s debounce window, then Nova's sync (16–47 s) and start.
var irBuckets = []float64{15, 20, 25, 30, 40, 50, 60, 90, 120, 180, 300}

func collectInstanceRecovery(ch chan<- prometheus.Metric, v controller.InstanceRecoveryView) {
	for k, n := range v.Counts {
		step, reason, _ := strings.Cut(k, "/")
		ch <- prometheus.MustNewConstMetric(descIRReports, prometheus.CounterValue, float64(n), step, reason)
	}
	for _, a := range []instancerecovery.Action{instancerecovery.ActionStart, instancerecovery.ActionHardReboot, instancerecovery.ActionMasakari} {
		ch <- prometheus.MustNewConstMetric(descIRActions, prometheus.CounterValue, float64(v.Actions[a]), string(a))
	}
	ch <- prometheus.MustNewConstMetric(descIRInProgress, prometheus.GaugeValue, float64(v.InProgress))
	ch <- prometheus.MustNewConstMetric(descIROverBudget, prometheus.GaugeValue, float64(len(v.OverBudget)))
	buckets := make(map[float64]uint64, len(irBuckets))
	sum := 0.0
	for _, t := range v.Took {
		sum += t.Seconds()
		for _, b := range irBuckets {
			if t.Seconds() <= b {
				buckets[b]++
			}
		}
	}
	ch <- prometheus.MustNewConstHistogram(descIRSeconds, uint64(len(v.Took)), sum, buckets)
}

# test/e2e targets (included by the top Makefile; each ## line shows in make help).
E2E_OS := test/e2e/openstack

.PHONY: e2e e2e-openstack-up e2e-openstack-down e2e-openstack-purge e2e-openstack-smoke e2e-openstack-record

# make e2e: the OpenStack harness up ONCE, then both real-Nova scenarios,
# then down (only what it started; HVG_OS_KEEP=1 keeps it):
#
# 1. Issue 4 (test/e2e/agent, TestAgentReconcileE2E) through the whole
#    agent as node1 on the libvirt test driver: servers booted on node1;
#    0. rejoin: NATS cut → fenced → node1 down, forced down, servers
#       evacuated to node2 meanwhile → heal → lease renewed → the rejoin
#       reconciliation destroys the stale copies, the rest resumed (renewed
#       → last destroyed measured, target <= 5 s); 1. nova-api stopped
#       mid-reconcile destroys nothing; 2. the start destroys the evacuated
#       copies (measured); 3. a server migrated back is left alone; 4. a
#       restart with nova-api warm (measured). E2E_SERVERS lists the sizes
#       ("10 200" also runs the 200-server case, ~25 min more).
# 2. Issues 6 and 14 (test/e2e/classify/run.sh, the e2e-classify target
#    below): node3 with the libvirt driver, the reboot storm over
#    E2E_STORM_GUESTS real QEMU/TCG guests (E2E_STORM_ROUNDS rounds) with
#    the real controller's instance recovery on the classified stream, its
#    crash phase (crashes measured, a guest's poweroff, a crash loop to the
#    budget, a controller restart mid-recovery, Nova alone) and its Masakari
#    mode against the real Masakari; run.sh stops node3 again if it started
#    it.
# 3. Issue 13 (test/e2e/recovery, the e2e-recovery target below): node1's
#    agent and the real hvguard-controller binary recover 2 BFV
#    (multiattach=False) + 1 ephemeral servers of a powered-off node1 —
#    mode evacuate with faults (Cinder down mid-recovery, the leader
#    SIGKILLed after its first evacuation, a node2 attachment that must
#    stay), node1's return and release; the lease back mid-recovery; mode
#    masakari against the real Masakari.
#
# The cloud comes up with Masakari (HVG_OS_MASAKARI=1) and the engine's
# wait_period_after_service_update at E2E_MASAKARI_WAIT s (upstream: 180;
# make bench measures Masakari at its defaults).
# HVG_E2E_REQUIRE=1 makes a missing harness a failure instead of a skip.
# Both scenarios run even if the first fails; the exit status is the
# first failure's.
E2E_SERVERS ?= 10
E2E_MASAKARI_WAIT ?= 15
e2e: ## up the OpenStack harness once, run the issue 4 rejoin-reconciliation scenario (whole agent, fencing, real Nova), the issue 6 reboot storm (real libvirt-driver guests) with issue 14's instance recovery and the issue 13 host recovery (BFV, Cinder, Masakari), down (only what it started)
	@was_up=0; st="$$(bash $(E2E_OS)/ctl.sh status 2>/dev/null || true)"; grep -q '^nova-api running' <<<"$$st" && was_up=1; \
	t0=$$(date +%s); rc=0; \
	if HVG_OS_MASAKARI=1 HVG_OS_MASAKARI_WAIT=$(E2E_MASAKARI_WAIT) bash $(E2E_OS)/up.sh; then \
		t1=$$(date +%s); \
		HVG_E2E_REQUIRE=1 HVG_E2E_SERVERS="$(E2E_SERVERS)" $(GO) test -tags e2e -count=1 -v -timeout 60m -run TestAgentReconcileE2E ./test/e2e/agent/ || rc=$$?; \
		t2=$$(date +%s); \
		$(MAKE) --no-print-directory e2e-classify || { r=$$?; [ $$rc != 0 ] || rc=$$r; }; \
		t5=$$(date +%s); \
		$(MAKE) --no-print-directory e2e-recovery || { r=$$?; [ $$rc != 0 ] || rc=$$r; }; \
	else rc=1; fi; \
	t3=$$(date +%s); \
	if [ $$was_up = 0 ] && [ "$${HVG_OS_KEEP:-0}" != 1 ]; then bash $(E2E_OS)/down.sh || rc=$$?; else echo "leaving the cloud up (was up before, or HVG_OS_KEEP=1)"; fi; \
	t4=$$(date +%s); \
	echo "e2e: up $$(( $${t1:-$$t3} - t0 )) s, reconcile $$(( $${t2:-$$t3} - $${t1:-$$t3} )) s, storm $$(( $${t5:-$$t3} - $${t2:-$$t3} )) s, recovery $$(( t3 - $${t5:-$$t3} )) s, down $$(( t4 - t3 )) s, total $$(( t4 - t0 )) s, rc=$$rc"; \
	exit $$rc

# The issue 13 scenarios on a running cloud (make e2e runs it after the
# storm): test/e2e/recovery, see its package doc and the comment above.
.PHONY: e2e-recovery
e2e-recovery: ## on the running harness: issue 13 host recovery (real hvguard-controller, BFV multiattach=False, faults, Masakari mode)
	HVG_E2E_REQUIRE=1 GO=$(GO) $(GO) test -tags e2e -count=1 -v -timeout 20m ./test/e2e/recovery/

e2e-openstack-up: ## start the real OpenStack e2e cloud (keystone, placement, glance, Nova, Cinder, computes node1+node2; HVG_OS_MASAKARI=1: Masakari) in /var/tmp/hvguard-e2e
	bash $(E2E_OS)/up.sh

e2e-openstack-down: ## stop the OpenStack e2e cloud (keeps its data; e2e-openstack-purge removes it)
	bash $(E2E_OS)/down.sh

e2e-openstack-purge: ## stop the OpenStack e2e cloud and delete its work dir
	bash $(E2E_OS)/down.sh --purge

# Tears the cloud down afterwards only if this target started it (others may
# be using a cloud that was already up); HVG_OS_KEEP=1 keeps it either way.
e2e-openstack-smoke: ## up + boot/kill/force-down/evacuate/migrate-back scenario on the real Nova, prints the migrations, down
	@was_up=0; bash $(E2E_OS)/ctl.sh status 2>/dev/null | grep -q '^nova-api running' && was_up=1; \
	t0=$$(date +%s); rc=0; \
	bash $(E2E_OS)/up.sh && t1=$$(date +%s) && \
	HVG_E2E_OPENSTACK=1 $(GO) test -count=1 -v -timeout 15m -run TestEvacuationScenario ./$(E2E_OS)/ || rc=$$?; \
	t2=$$(date +%s); \
	if [ $$was_up = 0 ] && [ "$${HVG_OS_KEEP:-0}" != 1 ]; then bash $(E2E_OS)/down.sh || rc=$$?; else echo "leaving the cloud up (was up before, or HVG_OS_KEEP=1)"; fi; \
	t3=$$(date +%s); \
	echo "e2e-openstack-smoke: up $$(( $${t1:-$$t2} - t0 )) s, scenario $$(( t2 - $${t1:-$$t2} )) s, down $$(( t3 - t2 )) s, total $$(( t3 - t0 )) s, rc=$$rc"; \
	exit $$rc

e2e-openstack-record: ## rerun the scenario on the running cloud and rewrite test/e2e/openstack/testdata/ with the real Nova responses
	HVG_E2E_OPENSTACK=1 HVG_E2E_RECORD=1 $(GO) test -count=1 -v -timeout 15m -run TestEvacuationScenario ./$(E2E_OS)/

# The recovery adapter (openstack.Recovery, docs/openstack.md) against the
# running harness with Cinder, the service user and Masakari: two BFV servers
# and one ephemeral on node1, node1 forced down, attachments removed (the
# attachments API beside os-force_detach), evacuated, node1 restored; a
# Masakari VM notification (~2.5 min). Run it under the cloud's lock.
.PHONY: e2e-openstack-adapter
e2e-openstack-adapter: ## the OpenStack recovery adapter against the running harness (Cinder, service token, Masakari); HVG_RECORD=1 rewrites openstack/testdata/rec-*.json
	$(GO) test -tags e2e -count=1 -v -timeout 15m -run 'TestE2ERecovery|TestE2EMasakari' ./openstack/

# The issue 6 reboot storm and issue 14's instance recovery
# (test/e2e/classify/run.sh): up.sh, node3 with the libvirt driver
# (libvirt-compute.sh up), stress-ng; E2E_STORM_GUESTS real QEMU/TCG guests
# soft- and hard-rebooted through Nova in rounds under stress-ng, one virsh
# destroy and one stop-API call mid-storm, then a round with Nova
# unreachable for the classifying agent; two agents (classified, plain)
# side by side, the real controller (instance_recovery.mode restart) on the
# classified stream: 0 actions for reboots, each real stop started once,
# beside what consumers of the raw libvirt STOPPED events and of the plain
# agent's stops would have done; then the crash phase under the same load
# and TestMasakariInstanceRecovery (mode masakari). Prints STORM-RESULT,
# RECOVERY-STORM, RECOVERY-RESULT, RECOVERY-COUNTS and MASAKARI-RESULT
# lines. Tears down only what it started (HVG_OS_KEEP=1 keeps it).
#
# make e2e runs it with 20 guests (the issue's "20+") and E2E_STORM_ROUNDS=1
# reboot round (with the virsh destroy and the stop API in it) + the round
# with Nova cut off; make bench runs the full storm: 30 guests,
# BENCH_STORM_ROUNDS=3 rounds + the cut round, with the same recovery part
# (crash phase 76-95 s, Masakari test 40 s). Why not 30 in CI: with 30 TCG
# guests plus stress-ng --cpu 2 on the 2-core CI machine (load 43-46) the
# guests' consoles came up ~300 s after a round's first request (2026-12-02
# 14:00), and in the CI run after it 25 of 27 guests were not up 4 min after
# ACTIVE, so the round's 10-min bound failed the run (stop 22): the storm
# measured the machine, not hvguard, and took 1107 s of CI's 45-min budget.
# Issue 6's assertions are the same at 20 (0 reboots reported as stops by
# the classifying agent, each special stop once and classified). At 20 the
# plain agent may misreport nothing (every domain off < 15 s in the
# 2026-12-01 runs), so the side-by-side figures come from make bench.
# One reboot round, not 2: a round takes 150-300 s here, and the fresh-clone
# CI run of 6cbfddb (2 rounds) measured make test 626 s + package-test 625 s
# + e2e ~1550 s, over CI's 45-min habit.
# HVG_STORM_RECOVERY=0 runs the issue 6 storm alone.
E2E_STORM_GUESTS ?= 20
E2E_STORM_ROUNDS ?= 1
BENCH_STORM_GUESTS ?= 30
BENCH_STORM_ROUNDS ?= 3
.PHONY: e2e-classify bench-classify
e2e-classify: ## as root: Nova reboot storm on real libvirt-driver guests, classified vs plain agent, with issue 14's instance recovery, crash phase and Masakari mode (E2E_STORM_GUESTS 20, E2E_STORM_ROUNDS 1)
	HVG_OS_MASAKARI=1 HVG_OS_MASAKARI_WAIT=$(E2E_MASAKARI_WAIT) HVG_E2E_MASAKARI=1 \
	HVG_STORM_GUESTS=$(E2E_STORM_GUESTS) HVG_STORM_ROUNDS=$(E2E_STORM_ROUNDS) GO=$(GO) bash test/e2e/classify/run.sh

bench: bench-classify bench-recovery
# Issue 13 (docs/BENCHMARKS.md): hvguard vs Masakari on the same harness and
# servers, each at its defaults (test/e2e/recovery/bench.sh, ~7 min).
.PHONY: bench-recovery
bench-recovery: ## as root: host recovery partition → BFV ACTIVE elsewhere, hvguard (default settings) vs Masakari (defaults), split by phase; skipped when not root
	@if [ "$$(id -u)" != 0 ]; then echo "bench-recovery: skipped (needs root: the OpenStack harness)"; \
	else GO=$(GO) bash test/e2e/recovery/bench.sh; fi
bench-classify: ## as root: the full storm (BENCH_STORM_GUESTS 30, BENCH_STORM_ROUNDS 3) with issue 14's recovery part, for docs/BENCHMARKS.md; skipped when not root
	@if [ "$$(id -u)" != 0 ]; then echo "bench-classify: skipped (needs root: libvirtd, nova-compute, packages)"; \
	else HVG_STORM_GUESTS=$(BENCH_STORM_GUESTS) HVG_STORM_ROUNDS=$(BENCH_STORM_ROUNDS) GO=$(GO) bash test/e2e/classify/run.sh; fi

#!/usr/bin/env bash
# up.sh — bring up a real OpenStack Zed control plane (Debian 12 packages) for
# hvguard's e2e tests, on a fresh Debian 12 machine, as root. Idempotent: a
# second run starts only what is not running and skips finished setup steps.
#
# Real: MariaDB, RabbitMQ, keystone, placement, glance (file store), nova-api,
# nova-conductor, nova-scheduler, two nova-compute (compute_driver=fake.FakeDriver,
# hosts node1 and node2), cinder-api/-scheduler/-volume (two fake backends,
# volume types hvg-fake and hvg-image), service tokens ([service_user] in
# nova.conf and cinder.conf), and with HVG_OS_MASAKARI=1 masakari-api and
# masakari-engine 14.0.2 (segment hvg-segment: node1, node2). NOT real: a
# Neutron stand-in on :9696 (neutron_standin.py) answering lists with empty
# collections.
#
# Work dir: $HVG_OS_WORKDIR (default /var/tmp/hvguard-e2e): etc/ log/ run/
# data/ and clouds.yaml (cloud "hvguard-e2e", admin; "hvguard-service", the
# service-role user). All logs go to log/; on failure the tails of the
# relevant logs are printed.
#
# Environment: HVG_OS_WORKDIR, HVG_OS_WAIT (per-step wait bound, default 180 s),
# HVG_OS_MASAKARI=1 (also Masakari; a later run with it adds Masakari to a
# running cloud), HVG_OS_MASAKARI_WAIT (engine's wait_period_after_service_update,
# default 180 s = upstream).
set -euo pipefail
SCRIPT=up.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
WAIT="${HVG_OS_WAIT:-180}"
MASAKARI="${HVG_OS_MASAKARI:-0}"

[[ "$(id -u)" == 0 ]] || die "must run as root"
mkdir -p "$LOGD" "$RUND" "$DATA"

phase install
install_packages

phase configs
write_configs

phase "mariadb+rabbitmq"
if [[ ! -d "$DATA/mysql/mysql" ]]; then
	mkdir -p "$DATA/mysql" && chown mysql:mysql "$DATA/mysql"
	mariadb-install-db --no-defaults --user=mysql --datadir="$DATA/mysql" --skip-test-db \
		--auth-root-authentication-method=socket >"$LOGD/mariadb-install.log" 2>&1 ||
		{ FAIL_LOGS=("$LOGD/mariadb-install.log"); die "mariadb-install-db failed"; }
fi
start_service mariadb
start_service rabbitmq
wait_service mariadb "$WAIT"
wait_service rabbitmq "$WAIT"

phase "databases"
sql() { mariadb --socket="$MYSQL_SOCK" -uroot -e "$1"; }
for db in keystone placement glance nova_api nova nova_cell0 cinder masakari; do
	sql "CREATE DATABASE IF NOT EXISTS $db"
done
sql "CREATE USER IF NOT EXISTS 'hvg'@'localhost' IDENTIFIED BY 'hvg-db'; GRANT ALL ON *.* TO 'hvg'@'localhost'"
# each sync once (marker file); independent ones in parallel
sync_once() { # NAME CMD...
	local name="$1"
	shift
	[[ -e "$DATA/.synced-$name" ]] && return 0
	"$@" >>"$LOGD/dbsync-$name.log" 2>&1 && touch "$DATA/.synced-$name"
}
nova_sync() {
	local nm=("$BIND/nova-manage" --config-file "$ETC/nova/nova.conf")
	"${nm[@]}" api_db sync && "${nm[@]}" cell_v2 map_cell0 &&
		{ "${nm[@]}" cell_v2 list_cells | grep -q ' cell1 ' || "${nm[@]}" cell_v2 create_cell --name cell1; } &&
		"${nm[@]}" db sync
}
km=("$BIND/keystone-manage" --config-file "$ETC/keystone/keystone.conf")
key_setup() { # keystone key repositories need no database: made during the syncs
	[[ -d "$DATA/keystone/fernet-keys" ]] || "${km[@]}" fernet_setup --keystone-user root --keystone-group root
	[[ -d "$DATA/keystone/credential-keys" ]] || "${km[@]}" credential_setup --keystone-user root --keystone-group root
}
pids=()
key_setup >>"$LOGD/keystone-bootstrap.log" 2>&1 & pids+=($!)
sync_once keystone "$BIND/keystone-manage" --config-file "$ETC/keystone/keystone.conf" db_sync & pids+=($!)
sync_once placement "$BIND/placement-manage" --config-file "$ETC/placement/placement.conf" db sync & pids+=($!)
sync_once glance "$BIND/glance-manage" --config-file "$ETC/glance/glance-api.conf" db_sync & pids+=($!)
sync_once nova nova_sync & pids+=($!)
sync_once cinder "$BIND/cinder-manage" --config-file "$ETC/cinder/cinder.conf" db sync & pids+=($!)
if [[ "$MASAKARI" == 1 ]]; then
	sync_once masakari "$BIND/masakari-manage" --config-file "$ETC/masakari/masakari.conf" db sync & pids+=($!)
fi
for p in "${pids[@]}"; do
	wait "$p" || { FAIL_LOGS=("$LOGD/dbsync-*.log" "$LOGD/keystone-bootstrap.log"); die "a database sync or keystone key setup failed"; }
done

phase keystone
if [[ ! -e "$DATA/.bootstrapped-keystone" ]]; then
	"${km[@]}" bootstrap --bootstrap-password "$ADMIN_PASS" --bootstrap-region-id "$REGION" \
		--bootstrap-admin-url "$KS_URL" --bootstrap-internal-url "$KS_URL" --bootstrap-public-url "$KS_URL" \
		>>"$LOGD/keystone-bootstrap.log" 2>&1 || { FAIL_LOGS=("$LOGD/keystone-bootstrap.log"); die "keystone bootstrap failed"; }
	touch "$DATA/.bootstrapped-keystone"
fi
start_service keystone
wait_service keystone "$WAIT"
# v2: + cinder, masakari, hvguard-service users, volumev3/block-storage/instance-ha
if [[ ! -e "$DATA/.identity-done-v2" ]]; then
	osctl identity "$SVC_PASS" >>"$LOGD/osctl.log" 2>&1 || { FAIL_LOGS=("$LOGD/osctl.log" "$LOGD/keystone.log"); die "identity setup failed"; }
	touch "$DATA/.identity-done-v2"
fi

phase "control services"
for s in placement glance neutron-standin nova-conductor cinder-scheduler cinder-volume cinder-api; do start_service "$s"; done
# conductor first: computes started before its queue exists stall 60 s
wait_service nova-conductor "$WAIT"
start_service nova-scheduler
start_service nova-api
for s in placement glance neutron-standin nova-scheduler nova-api cinder-api cinder-scheduler cinder-volume; do
	wait_service "$s" "$WAIT"
done

phase computes
start_service nova-compute-node1
start_service nova-compute-node2
FAIL_LOGS=("$LOGD/nova-compute-node*.log" "$LOGD/placement.log" "$LOGD/nova-conductor.log")
wait_for "$WAIT" "node1 and node2 up in nova and in placement" osctl computes-ready node1 node2
if ! osctl hypervisors 2 >/dev/null 2>&1; then
	"$BIND/nova-manage" --config-file "$ETC/nova/nova.conf" cell_v2 discover_hosts >>"$LOGD/discover-hosts.log" 2>&1 ||
		{ FAIL_LOGS=("$LOGD/discover-hosts.log"); die "discover_hosts failed"; }
fi
wait_for "$WAIT" "2 hypervisors in nova" osctl hypervisors 2

phase seed
[[ -e "$DATA/fake-image.raw" ]] || head -c 1048576 /dev/zero >"$DATA/fake-image.raw"
FAIL_LOGS=("$LOGD/osctl.log" "$LOGD/glance.log" "$LOGD/nova-api.log")
osctl seed "$DATA/fake-image.raw" >>"$LOGD/osctl.log" 2>&1 || die "seeding flavor/image failed"
FAIL_LOGS=("$LOGD/osctl.log" "$LOGD/cinder-api.log")
osctl seed-volume >>"$LOGD/osctl.log" 2>&1 || die "seeding volume types failed"

if [[ "$MASAKARI" == 1 ]]; then
	phase masakari
	start_service masakari-engine
	start_service masakari-api
	wait_service masakari-engine "$WAIT"
	wait_service masakari-api "$WAIT"
	FAIL_LOGS=("$LOGD/osctl.log" "$LOGD/masakari-api.log")
	osctl masakari-seed >>"$LOGD/osctl.log" 2>&1 || die "seeding the masakari segment failed"
fi

phase_report
log "ready: clouds.yaml at $W/clouds.yaml (cloud hvguard-e2e); logs in $LOGD"

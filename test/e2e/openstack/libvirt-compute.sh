#!/usr/bin/env bash
# libvirt-compute.sh — an OPTIONAL third nova-compute for the shared harness:
# host node3 with compute_driver=libvirt.LibvirtDriver (QEMU/TCG, cpu_mode=none)
# against the machine's real system libvirtd, for issue 6 (Nova-aware stop
# classification). The fake-driver cloud (up.sh) must be running; this script
# never stops or restarts the shared services (only its own nova-compute).
#
#   libvirt-compute.sh up       start libvirtd if needed (test/libvirtd/start.sh),
#                               build the guest if needed (test/guest/build.sh),
#                               install python3-libvirt if missing, write
#                               etc/nova/nova-compute-node3.conf, start
#                               nova-compute-node3, map it (discover_hosts), seed
#                               flavor "lv256" and images hvg-lv-{kernel,ramdisk,root}
#   libvirt-compute.sh down     stop nova-compute-node3 (SIGTERM, SIGKILL after 30 s);
#                               its guests keep running in libvirt, as on a real host
#   libvirt-compute.sh status   one line: running PID | stopped
#
# Facts (shared/reference/openstack.md): Debian's python3-nova needs the privsep
# helper_command fix (no nova-rootwrap); the guest is the busybox initramfs of
# test/guest booted by direct kernel boot from aki/ari images; 256 MB / 1 vCPU.
# Environment: HVG_OS_WORKDIR, HVG_OS_WAIT (default 180 s), HVG_OS_LV_HOST (node3).
set -euo pipefail
SCRIPT=libvirt-compute.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
WAIT="${HVG_OS_WAIT:-180}"
LVHOST="${HVG_OS_LV_HOST:-node3}"
NAME="nova-compute-$LVHOST"
CONF="$ETC/nova/$NAME.conf"
REPO="$(cd "$HERE/../../.." && pwd)"
GUEST_OUT="${HVG_GUEST_OUT:-$REPO/test/guest/out}"

write_lv_config() {
	mkdir -p "$DATA/nova-$LVHOST/instances"
	local sect priv=""
	for sect in nova_sys_admin privsep_osbrick vif_plug_ovs_privileged vif_plug_linux_bridge_privileged; do
		priv+="[$sect]
helper_command = /usr/bin/privsep-helper --config-file $CONF
"
	done
	# Same [DEFAULT]/auth sections as the fake computes (lib.sh write_configs),
	# no [database]/[api_database] (nova-compute refuses DB access).
	cat >"$CONF" <<INI
[DEFAULT]
host = $LVHOST
transport_url = $RABBIT_URL
graceful_shutdown_timeout = 5
my_ip = 127.0.0.1
compute_driver = libvirt.LibvirtDriver
state_path = $DATA/nova-$LVHOST
instances_path = $DATA/nova-$LVHOST/instances
# the 1 MiB root image grows to the flavor's 1 GB as a qcow2 overlay
use_cow_images = true
[libvirt]
virt_type = qemu
cpu_mode = none
images_type = qcow2
connection_uri = qemu:///system
[api]
auth_strategy = keystone
[placement]
$(ks_auth placement)
[neutron]
$(ks_auth nova)
[glance]
region_name = $REGION
[vnc]
enabled = false
[oslo_concurrency]
lock_path = $DATA/locks
[oslo_messaging_rabbit]
heartbeat_timeout_threshold = 0
$priv
INI
}

lv_osctl() { /usr/bin/python3 "$HERE/lvctl.py" --clouds "$W/clouds.yaml" "$@"; }

case "${1:-}" in
up)
	[[ "$(id -u)" == 0 ]] || die "must run as root"
	pid_of nova-api >/dev/null || die "the harness is not running (test/e2e/openstack/up.sh first)"
	phase prerequisites
	if ! /usr/bin/python3 -c 'import libvirt' 2>/dev/null; then
		log "installing python3-libvirt"
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
			python3-libvirt >>"$LOGD/apt.log" 2>&1 || { FAIL_LOGS=("$LOGD/apt.log"); die "apt-get install python3-libvirt failed"; }
	fi
	bash "$REPO/test/libvirtd/start.sh"
	HVG_GUEST_OUT="$GUEST_OUT" bash "$REPO/test/guest/build.sh"
	phase "$NAME"
	write_lv_config
	since="$(date -u +%Y-%m-%dT%H:%M:%S)"
	spawn "$NAME" "$BIND/nova-compute" --config-file "$CONF" --log-file "$LOGD/$NAME.log"
	FAIL_LOGS=("$LOGD/$NAME.log")
	# a just-stopped compute still looks "up" for service_down_time (60 s):
	# wait until its service record was refreshed after this start
	wait_for "$WAIT" "$NAME to report to nova" osctl compute-reported "$LVHOST" "$since"
	wait_for "$WAIT" "$NAME up in nova" osctl compute-up "$LVHOST"
	# /os-hypervisors lists a compute node before its host mapping exists:
	# map it once (a marker), as boots to an unmapped host fail.
	if [[ ! -e "$DATA/.discovered-$LVHOST" ]]; then
		"$BIND/nova-manage" --config-file "$ETC/nova/nova.conf" cell_v2 discover_hosts >>"$LOGD/discover-hosts.log" 2>&1 ||
			{ FAIL_LOGS=("$LOGD/discover-hosts.log"); die "discover_hosts failed"; }
		touch "$DATA/.discovered-$LVHOST"
	fi
	wait_for "$WAIT" "$LVHOST's hypervisor listed by nova" lv_osctl ready "$LVHOST"
	phase seed
	FAIL_LOGS=("$LOGD/lvctl.log" "$LOGD/glance.log")
	lv_osctl seed "$GUEST_OUT/vmlinuz" "$GUEST_OUT/initrd.cpio.gz" >>"$LOGD/lvctl.log" 2>&1 || die "seeding lv256/hvg-lv images failed"
	phase_report
	log "ready: $NAME (libvirt driver, qemu:///system); boot with flavor lv256, image hvg-lv-root, host $LVHOST (since $since)"
	;;
down)
	stop_service "$NAME" 30
	;;
status)
	if p="$(pid_of "$NAME")"; then echo "$NAME running $p"; else echo "$NAME stopped"; fi
	;;
*)
	echo "usage: $0 up|down|status" >&2
	exit 2
	;;
esac

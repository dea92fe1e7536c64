#!/usr/bin/env bash
# lib.sh — shared by up.sh, down.sh and ctl.sh (sourced, not run).
# Work dir layout ($HVG_OS_WORKDIR, default /var/tmp/hvguard-e2e, outside the
# repo so nothing generated can be committed):
#   etc/   configs          log/   one log per service     run/  pid files
#   data/  mysql, rabbitmq, glance images, keystone keys, nova state
#   clouds.yaml             admin credentials for gophercloud (cloud hvguard-e2e)
# shellcheck disable=SC2034  # variables used by the scripts that source this

W="${HVG_OS_WORKDIR:-/var/tmp/hvguard-e2e}"
# /usr/bin/python3 explicitly: a python3 earlier on PATH (pyenv) lacks the Debian modules
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ETC="$W/etc" LOGD="$W/log" RUND="$W/run" DATA="$W/data" BIND="$W/bin"
MYSQL_RUN=/run/mysqld # mariadbd (user mysql) cannot write its pid under $W
MYSQL_SOCK="$MYSQL_RUN/hvg-e2e.sock"
MYSQL_PID="$MYSQL_RUN/hvg-e2e.pid"
ADMIN_PASS="${HVG_OS_ADMIN_PASS:-hvg-admin}"
SVC_PASS="${HVG_OS_SERVICE_PASS:-hvg-service}"
REGION=RegionOne
KS_URL=http://127.0.0.1:5000/v3
RABBIT_URL="rabbit://guest:guest@127.0.0.1:5672/"
# The minimal package set: python3-* libraries only (no service packages,
# so no dbconfig-common/debconf prompts and no init scripts).
PKGS=(python3-keystone python3-nova python3-placement python3-glance python3-cinder
	python3-masakari python3-pymysql mariadb-server rabbitmq-server uwsgi-core
	uwsgi-plugin-python3 curl)
# every service this harness runs, in start order (masakari-* only with
# HVG_OS_MASAKARI=1 or when ctl.sh starts them)
SERVICES=(mariadb rabbitmq keystone placement glance neutron-standin
	nova-conductor nova-scheduler nova-api cinder-scheduler cinder-volume cinder-api
	nova-compute-node1 nova-compute-node2 masakari-api masakari-engine)
# The user whose token hvguard sends as X-Service-Token (role "service" only;
# clouds.yaml entry "hvguard-service"): Cinder lets only a service token
# delete or force-detach an attachment that Nova still uses (OSSA-2023-003).
HVG_SVC_USER=hvguard-service
# Masakari: the failover segment up.sh creates, with node1 and node2 as hosts.
MASAKARI_SEGMENT=hvg-segment

T0="${T0:-$(date +%s%N)}"
elapsed() { local now; now="$(date +%s%N)"; printf '%d.%d' $(((now - T0) / 1000000000)) $((((now - T0) / 100000000) % 10)); }
log() { printf '[%s +%ss] %s\n' "${SCRIPT:-os}" "$(elapsed)" "$*"; }
# tails prints the last lines of the logs named (or of all logs).
tails() {
	local f
	for f in "${@:-$LOGD/*.log}"; do
		# shellcheck disable=SC2086
		for g in $f; do [[ -f "$g" ]] && { echo "===== tail $g"; tail -n 25 "$g"; }; done
	done >&2
}
die() { printf '[%s +%ss] ERROR: %s\n' "${SCRIPT:-os}" "$(elapsed)" "$*" >&2; tails "${FAIL_LOGS[@]}"; exit 1; }
FAIL_LOGS=()

# phase NAME: prints the duration of the previous phase, starts timing NAME.
PHASE="" PHASE_T=0 PHASES=()
phase() {
	local now; now="$(date +%s%N)"
	if [[ -n "$PHASE" ]]; then
		PHASES+=("$(printf '%-22s %6.1f s' "$PHASE" "$(((now - PHASE_T) / 1000000))e-3")")
	fi
	PHASE="$1" PHASE_T="$now"
	[[ -n "$PHASE" ]] && log "phase: $PHASE"
	return 0
}
phase_report() { phase ""; log "phase durations:"; printf '    %s\n' "${PHASES[@]}"; log "total $(elapsed) s"; }

# wait_for SECS DESC CMD...: polls CMD every second until it succeeds.
wait_for() {
	local secs="$1" desc="$2" i
	shift 2
	for ((i = 0; i < secs * 2; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "timed out after ${secs}s waiting for $desc"
}

# starttime PID: the process start time (clock ticks since boot), field 22 of /proc/PID/stat.
starttime() { local st; st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1; st="${st##*) }"; awk '{print $20}' <<<"$st"; }

# pid_of NAME: prints the pid in run/NAME.pid if that very process is alive.
# A pid file holds "PID STARTTIME": a reused pid (after a reboot, say) does
# not match, so down.sh never signals a stranger's process group. MariaDB
# writes its own pid file: its command line must name our data dir.
pid_of() {
	local f="$RUND/$1.pid" pid st
	[[ "$1" == mariadb ]] && f="$MYSQL_PID"
	[[ -r "$f" ]] || return 1
	read -r pid st _ <"$f" || true
	[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
	if [[ "$1" == mariadb ]]; then
		tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "--datadir=$DATA/mysql" || return 1
	else
		[[ -n "$st" && "$(starttime "$pid")" == "$st" ]] || return 1
	fi
	echo "$pid"
}

pkgs_missing() {
	local p
	for p in "${PKGS[@]}"; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
	done
}

# install_packages: apt-get update once, then install what is missing.
install_packages() {
	local missing apt_log="$LOGD/apt.log" made_policy=0
	mapfile -t missing < <(pkgs_missing)
	if ((${#missing[@]})); then
		log "installing: ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		# postinsts must not start mariadb/rabbitmq from init scripts
		if [[ ! -e /usr/sbin/policy-rc.d ]]; then
			printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
			chmod 755 /usr/sbin/policy-rc.d
			made_policy=1
		fi
		FAIL_LOGS=("$apt_log")
		apt-get -o DPkg::Lock::Timeout=600 update -q >"$apt_log" 2>&1 || die "apt-get update failed"
		apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >>"$apt_log" 2>&1 ||
			die "apt-get install failed"
		((made_policy)) && rm -f /usr/sbin/policy-rc.d
	fi
	# api-paste.ini files live in the service packages: extract, never install them
	local deb
	for deb in nova-common glance-common cinder-common masakari-api; do
		[[ -d "$DATA/debs/$deb" ]] && continue
		mkdir -p "$DATA/debs"
		(cd "$DATA/debs" && apt-get download -q "$deb" >>"$apt_log" 2>&1) || die "apt-get download $deb failed"
		dpkg-deb -x "$DATA/debs/${deb}"_*.deb "$DATA/debs/$deb"
	done
	# entry points python3-nova/-glance do not ship
	mkdir -p "$BIND"
	local m
	for m in nova.cmd.api nova.cmd.conductor nova.cmd.scheduler nova.cmd.compute nova.cmd.manage \
		glance.cmd.api glance.cmd.manage placement.cmd.manage keystone.cmd.manage \
		cinder.cmd.api cinder.cmd.scheduler cinder.cmd.volume cinder.cmd.manage \
		masakari.cmd.api masakari.cmd.engine masakari.cmd.manage; do
		# cinder: the harness dir on sys.path for its volume driver
		# (hvg_cinder_driver.py); masakari: the read_deleted fix below
		{
			echo '#!/usr/bin/python3'
			echo 'import sys'
			[[ "$m" == cinder.* ]] && echo "sys.path.insert(0, '$HERE')"
			[[ "$m" == masakari.* ]] && cat <<'PY'
# Masakari 14.0.2 with oslo.messaging 14.0.3-0+deb12u1 answers every create
# with 500 "read_deleted can only be one of 'no', 'yes' or 'only', not None":
# the notifier rebuilds the context with from_dict(), which reads back a
# read_deleted the sanitized dict no longer has. Default it to 'no' (the
# constructor's own default); nothing under /usr is changed.
import masakari.context as _mctx
_from_dict = _mctx.RequestContext.from_dict.__func__
def _fixed_from_dict(cls, values, **kwargs):
    if values.get('read_deleted') is None:
        values = dict(values, read_deleted='no')
    return _from_dict(cls, values, **kwargs)
_mctx.RequestContext.from_dict = classmethod(_fixed_from_dict)
PY
			echo "from ${m} import main"
			echo 'sys.exit(main())'
		} >"$BIND/${m%%.*}-${m##*.}"
		chmod 755 "$BIND/${m%%.*}-${m##*.}"
	done
}

db_url() { echo "mysql+pymysql://hvg:hvg-db@localhost/$1?unix_socket=$MYSQL_SOCK&charset=utf8"; }

# ks_auth SECTION-less block of keystone password auth for service user $1.
ks_auth() {
	cat <<INI
auth_url = $KS_URL
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = $1
password = $SVC_PASS
region_name = $REGION
INI
}

# authtoken USER: [keystone_authtoken] of an API that honours service tokens
# only from users with the service role (OSSA-2023-003 setup).
authtoken() {
	printf '[keystone_authtoken]\nwww_authenticate_uri = http://127.0.0.1:5000\nservice_token_roles_required = true\n'
	ks_auth "$1"
}
# service_user USER: [service_user]: send USER's token as X-Service-Token.
service_user() {
	printf '[service_user]\nsend_service_user_token = true\n'
	ks_auth "$1"
}

# write_configs: (re)writes every config under etc/ (cheap; always done).
write_configs() {
	mkdir -p "$ETC"/{keystone,placement,glance,nova,cinder,masakari,rabbitmq} "$LOGD" "$RUND" \
		"$DATA"/{keystone,glance/images,glance/staging,glance/tasks,nova-node1,nova-node2,nova,locks,cinder}
	cat >"$ETC/keystone/keystone.conf" <<INI
[DEFAULT]
log_file = $LOGD/keystone.log
[database]
connection = $(db_url keystone)
[token]
provider = fernet
[fernet_tokens]
key_repository = $DATA/keystone/fernet-keys
[credential]
key_repository = $DATA/keystone/credential-keys
INI
	cat >"$ETC/placement/placement.conf" <<INI
[DEFAULT]
log_file = $LOGD/placement.log
[placement_database]
connection = $(db_url placement)
[api]
auth_strategy = keystone
[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:5000
$(ks_auth placement)
INI
	cat >"$ETC/glance/glance-api.conf" <<INI
[DEFAULT]
bind_host = 127.0.0.1
bind_port = 9292
workers = 1
log_file = $LOGD/glance.log
enabled_backends = file:file
[glance_store]
default_backend = file
[file]
filesystem_store_datadir = $DATA/glance/images
[os_glance_staging_store]
filesystem_store_datadir = $DATA/glance/staging
[os_glance_tasks_store]
filesystem_store_datadir = $DATA/glance/tasks
[database]
connection = $(db_url glance)
[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:5000
$(ks_auth glance)
[paste_deploy]
flavor = keystone
config_file = $DATA/debs/glance-common/usr/share/glance-common/glance-api-paste.ini
INI
	local common
	common="$(
		cat <<INI
[DEFAULT]
transport_url = $RABBIT_URL
graceful_shutdown_timeout = 5
my_ip = 127.0.0.1
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
[cinder]
os_region_name = $REGION
$(ks_auth nova)
$(service_user nova)
INI
	)"
	# control services: api, conductor, scheduler
	cat >"$ETC/nova/nova.conf" <<INI
$common
[DEFAULT]
state_path = $DATA/nova
enabled_apis = osapi_compute
osapi_compute_listen = 127.0.0.1
osapi_compute_listen_port = 8774
osapi_compute_workers = 1
[conductor]
workers = 1
[scheduler]
workers = 1
discover_hosts_in_cells_interval = -1
[api_database]
connection = $(db_url nova_api)
[database]
connection = $(db_url nova)
$(authtoken nova)
[wsgi]
api_paste_config = $DATA/debs/nova-common/usr/share/nova-common/api-paste.ini
INI
	# compute services: NO [api_database]/[database] (nova-compute refuses DB access)
	local n
	for n in node1 node2; do
		cat >"$ETC/nova/nova-compute-$n.conf" <<INI
$common
[DEFAULT]
host = $n
compute_driver = fake.FakeDriver
state_path = $DATA/nova-$n
instances_path = $DATA/nova-$n/instances
INI
	done
	# Cinder: two backends in one cinder-volume (host hvg-cinder, so volume
	# hosts do not depend on the machine's name): "fake" is python3-cinder's
	# FakeLoggingVolumeDriver; "fakeimg" is the same with an image copy that
	# writes nothing (hvg_cinder_driver.py), so volumes can be made from the
	# glance image (the fake driver's own copy runs qemu-img into /dev/mapper).
	local be
	cat >"$ETC/cinder/cinder.conf" <<INI
[DEFAULT]
transport_url = $RABBIT_URL
my_ip = 127.0.0.1
host = hvg-cinder
state_path = $DATA/cinder
auth_strategy = keystone
osapi_volume_listen = 127.0.0.1
osapi_volume_listen_port = 8776
osapi_volume_workers = 1
api_paste_config = $DATA/debs/cinder-common/usr/share/cinder-common/api-paste.ini
glance_api_servers = http://127.0.0.1:9292
enabled_backends = fake,fakeimg
graceful_shutdown_timeout = 5
[database]
connection = $(db_url cinder)
$(authtoken cinder)
$(service_user cinder)
[nova]
$(ks_auth cinder)
[oslo_concurrency]
lock_path = $DATA/locks
[oslo_messaging_rabbit]
heartbeat_timeout_threshold = 0
$(for be in fake fakeimg; do
		printf '[%s]\nvolume_backend_name = %s\ntarget_helper = fake\n' "$be" "$be"
		if [[ $be == fake ]]; then echo 'volume_driver = cinder.tests.fake_driver.FakeLoggingVolumeDriver'
		else echo 'volume_driver = hvg_cinder_driver.ImageFakeDriver'; fi
	done)
INI
	# Masakari: API on :15868, engine at upstream defaults (HVG_OS_MASAKARI_WAIT
	# overrides wait_period_after_service_update, default 180 s); no
	# [taskflow] connection (python3-taskflow 5.0.0 lacks its alembic files).
	cat >"$ETC/masakari/masakari.conf" <<INI
[DEFAULT]
transport_url = $RABBIT_URL
auth_strategy = keystone
masakari_api_listen = 127.0.0.1
masakari_api_listen_port = 15868
masakari_api_workers = 1
api_paste_config = $DATA/debs/masakari-api/etc/masakari/api-paste.ini
graceful_shutdown_timeout = 5
os_privileged_user_name = masakari
os_privileged_user_password = $SVC_PASS
os_privileged_user_tenant = service
os_privileged_user_auth_url = $KS_URL
os_region_name = $REGION
wait_period_after_service_update = ${HVG_OS_MASAKARI_WAIT:-180}
[database]
connection = $(db_url masakari)
[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:5000
$(ks_auth masakari)
[oslo_concurrency]
lock_path = $DATA/locks
[oslo_messaging_rabbit]
heartbeat_timeout_threshold = 0
INI
	cat >"$W/clouds.yaml" <<YAML
clouds:
  hvguard-e2e:
    auth:
      auth_url: $KS_URL
      username: admin
      password: $ADMIN_PASS
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: $REGION
    interface: public
    identity_api_version: 3
  $HVG_SVC_USER:
    auth:
      auth_url: $KS_URL
      username: $HVG_SVC_USER
      password: $SVC_PASS
      project_name: service
      user_domain_name: Default
      project_domain_name: Default
    region_name: $REGION
    interface: public
    identity_api_version: 3
YAML
}

# daemon CMD...: execs CMD in a new session with every fd above 2 closed.
# Callers hold `flock /tmp/hvg-e2e.lock` around up.sh/ctl.sh: a daemon that
# inherited that fd would keep the lock held for as long as the cloud runs,
# and the next user's flock would wait forever.
daemon() {
	local fd
	for fd in /proc/$BASHPID/fd/*; do
		fd="${fd##*/}"
		((fd > 2)) && eval "exec $fd>&-"
	done
	exec setsid "$@"
}

# spawn NAME CMD...: runs CMD in its own session (pgid = pid), log/NAME.log, run/NAME.pid.
spawn() {
	local name="$1"
	shift
	if pid_of "$name" >/dev/null; then
		log "$name already running (pid $(pid_of "$name"))"
		return 0
	fi
	(daemon "$@") </dev/null >>"$LOGD/$name.log" 2>&1 &
	echo "$! $(starttime $!)" >"$RUND/$name.pid"
	log "started $name (pid $!)"
}

rabbit_env() {
	export HOME="$DATA/rabbitmq" RABBITMQ_NODENAME=rabbit@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE="$DATA/rabbitmq/mnesia" \
		RABBITMQ_LOG_BASE="$LOGD/rabbitmq" RABBITMQ_ENABLED_PLUGINS_FILE="$ETC/rabbitmq/enabled_plugins" \
		RABBITMQ_PID_FILE="$RUND/rabbitmq-erl.pid"
}
# the /usr/sbin wrappers su to user rabbitmq (other cookie): call the real scripts as root
rabbitctl() { (rabbit_env && /usr/lib/rabbitmq/bin/rabbitmqctl -n rabbit@localhost "$@"); }

# spawn_uwsgi NAME PORT WSGI-FILE ENV=VAL
spawn_uwsgi() {
	spawn "$1" uwsgi --plugin python3 --http-socket "127.0.0.1:$2" --wsgi-file "$3" --env "$4" \
		--master --processes 1 --threads 4 --add-header "Connection: close" --die-on-term \
		--lazy-apps --buffer-size 65535
}

# start_service NAME: starts one service (does not wait).
start_service() {
	case "$1" in
	mariadb)
		pid_of mariadb >/dev/null && return 0
		mkdir -p "$MYSQL_RUN" && chown mysql:mysql "$MYSQL_RUN"
		(daemon mariadbd --no-defaults --user=mysql --datadir="$DATA/mysql" --socket="$MYSQL_SOCK" \
			--pid-file="$MYSQL_PID" --skip-networking \
			--innodb-buffer-pool-size=128M --max-connections=500) </dev/null >>"$LOGD/mariadb.log" 2>&1 &
		log "started mariadb (pid $!)"
		;;
	rabbitmq)
		if ! pid_of epmd >/dev/null && ! (exec 3<>/dev/tcp/127.0.0.1/4369) 2>/dev/null; then
			spawn epmd epmd -address 127.0.0.1
		fi
		mkdir -p "$DATA/rabbitmq" "$LOGD/rabbitmq"
		echo '[].' >"$ETC/rabbitmq/enabled_plugins"
		(rabbit_env && spawn rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
		;;
	keystone)
		spawn_uwsgi keystone 5000 /usr/bin/keystone-wsgi-public "OS_KEYSTONE_CONFIG_DIR=$ETC/keystone"
		;;
	placement)
		spawn_uwsgi placement 8778 /usr/bin/placement-api "OS_PLACEMENT_CONFIG_DIR=$ETC/placement"
		;;
	glance) spawn glance "$BIND/glance-api" --config-file "$ETC/glance/glance-api.conf" ;;
	neutron-standin) spawn neutron-standin /usr/bin/python3 "$HERE/neutron_standin.py" 127.0.0.1 9696 ;;
	nova-api | nova-conductor | nova-scheduler)
		spawn "$1" "$BIND/nova-${1#nova-}" --config-file "$ETC/nova/nova.conf" --log-file "$LOGD/$1.log"
		;;
	nova-compute-node1 | nova-compute-node2)
		spawn "$1" "$BIND/nova-compute" --config-file "$ETC/nova/$1.conf" --log-file "$LOGD/$1.log"
		;;
	cinder-api | cinder-scheduler | cinder-volume)
		spawn "$1" "$BIND/cinder-${1#cinder-}" --config-file "$ETC/cinder/cinder.conf" --log-file "$LOGD/$1.log"
		;;
	masakari-api | masakari-engine)
		spawn "$1" "$BIND/masakari-${1#masakari-}" --config-file "$ETC/masakari/masakari.conf" --log-file "$LOGD/$1.log"
		;;
	*) die "unknown service $1" ;;
	esac
}

# stop_service NAME [TIMEOUT]: SIGTERM to its process group, SIGKILL after TIMEOUT s.
stop_service() {
	local name="$1" t="${2:-20}" pid i
	if [[ "$name" == rabbitmq ]]; then
		if pid_of rabbitmq >/dev/null; then rabbitctl stop >/dev/null 2>&1 || true; fi
	fi
	pid="$(pid_of "$name")" || { rm -f "$RUND/$name.pid"; return 0; }
	if [[ "$name" == mariadb ]]; then kill -TERM "$pid" 2>/dev/null || true; else kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; fi
	for ((i = 0; i < t * 5; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "$name (pid $pid) ignored SIGTERM for ${t}s: SIGKILL"
		kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
	fi
	[[ "$name" == mariadb ]] || rm -f "$RUND/$name.pid"
	log "stopped $name"
}

http_up() { curl -s -o /dev/null -m 5 -w '%{http_code}' "$1" | grep -qE '^[2-4][0-9][0-9]$'; }

# wait_service NAME [SECS]: bounded wait until the service answers.
wait_service() {
	local s="${2:-120}"
	FAIL_LOGS=("$LOGD/$1.log")
	case "$1" in
	mariadb) wait_for "$s" mariadb mariadb-admin --socket="$MYSQL_SOCK" ping ;;
	rabbitmq) FAIL_LOGS=("$LOGD/rabbitmq.log" "$LOGD/rabbitmq/*.log"); wait_for "$s" rabbitmq rabbitctl await_startup ;;
	keystone) wait_for "$s" keystone http_up http://127.0.0.1:5000/v3 ;;
	placement) wait_for "$s" placement http_up http://127.0.0.1:8778/ ;;
	glance) wait_for "$s" glance http_up http://127.0.0.1:9292/ ;;
	neutron-standin) wait_for "$s" neutron-standin http_up http://127.0.0.1:9696/ ;;
	nova-api) wait_for "$s" nova-api http_up http://127.0.0.1:8774/ ;;
	nova-conductor) wait_for "$s" "conductor queue" rabbit_has_queue conductor ;;
	nova-scheduler) wait_for "$s" "scheduler queue" rabbit_has_queue scheduler ;;
	nova-compute-node1 | nova-compute-node2) wait_for "$s" "$1 up in nova" osctl compute-up "${1#nova-compute-}" ;;
	cinder-api) wait_for "$s" cinder-api http_up http://127.0.0.1:8776/ ;;
	cinder-scheduler | cinder-volume) wait_for "$s" "$1 up in cinder" osctl volume-service-up "$1" ;;
	masakari-api) wait_for "$s" masakari-api http_up http://127.0.0.1:15868/ ;;
	masakari-engine) wait_for "$s" "masakari-engine queue" rabbit_has_queue ha_engine ;;
	esac
}
rabbit_has_queue() { rabbitctl list_queues -q name 2>/dev/null | grep -qx "$1"; }
osctl() { /usr/bin/python3 "$HERE/osctl.py" --clouds "$W/clouds.yaml" "$@"; }

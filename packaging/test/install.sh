#!/bin/bash
# Install test of the .deb in a clean Debian 12 root (debootstrap, chroot):
# first install without and with systemd "running", config and state
# directory, --version/--check-config, upgrade to a newer build keeps an
# edited config and restarts, remove keeps config and state, purge removes
# them; with both packages, that they coexist (purging one keeps the other's
# files). Usage: packaging/test/install.sh NAME... (make package-test)
#
# systemctl and deb-systemd-invoke are replaced in the root by shims that log
# their arguments, so the test sees exactly what the maintainer scripts ask
# of systemd; "systemd running" is simulated by creating /run/systemd/system.
set -euo pipefail
# Output is captured before grep -q sees it (grep <<<"$(cmd)"): in a
# pipeline an early-exiting grep -q can fail `cmd` with SIGPIPE (pipefail).

cd "$(dirname "$0")/../.."
readonly DIST=${DIST:-dist}
readonly ROOT=$DIST/test/root
# shellcheck source=packaging/test/lib.sh
source packaging/test/lib.sh
# shellcheck source=packaging/packages.sh
source packaging/packages.sh

mkdir -p "$DIST/test"
version=$(cat "$DIST/VERSION") # written by build.sh
arch=$(dpkg --print-architecture)
upversion=$version+up1 # sorts after $version for dpkg and rpm

in_root() { chroot "$ROOT" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C "$@"; }
# pkg_field FIELD: dpkg's FIELD of package $name in the root.
pkg_field() { in_root dpkg-query -W -f="\${$1}\n" "$name"; }
calls() { cat "$ROOT/tmp/systemd-calls"; }
reset_calls() { : >"$ROOT/tmp/systemd-calls"; }
systemd_running() {
	if [[ "$1" == yes ]]; then mkdir -p "$ROOT/run/systemd/system"; else rm -rf "$ROOT/run/systemd"; fi
}

for name in "$@"; do
	pkg_facts "$name"
	deb=$DIST/${name}_${version}_${arch}.deb
	[[ -f "$deb" ]] || fail "$deb missing: run make package"

	step "$name: building the upgrade package ($upversion)"
	updeb=$(upgrade_deb "$name" "$version")

	step "$name: fresh root (debootstrap $SUITE, cached)"
	fresh_root "$ROOT"
	cp "$deb" "$ROOT/tmp/v1.deb"
	cp "$updeb" "$ROOT/tmp/v2.deb"
	# Offline calls (systemctl --root=/ …, which deb-systemd-helper makes to
	# apply presets) work without systemd: they go to the real systemctl.
	# Every other call needs a running systemd and is only logged.
	cat >"$ROOT/usr/local/sbin/systemctl" <<-'SH'
		#!/bin/sh
		case "$1" in --root=*) exec /bin/systemctl "$@" ;; esac
		echo "systemctl $*" >>/tmp/systemd-calls
	SH
	printf '#!/bin/sh\necho "deb-systemd-invoke $*" >>/tmp/systemd-calls\n' >"$ROOT/usr/local/sbin/deb-systemd-invoke"
	chmod +x "$ROOT/usr/local/sbin/systemctl" "$ROOT/usr/local/sbin/deb-systemd-invoke"
	conf=/etc/hvguard/$PKG_CONF
	state=$PKG_STATE_DIR # "" = none
	# has_state: the package has a state directory to create, keep and purge.
	has_state() { [[ -n "$state" ]]; }
	wants=/etc/systemd/system/multi-user.target.wants/$name.service

	step "$name: install (no systemd running: a container or chroot)"
	systemd_running no
	reset_calls
	in_root dpkg -i /tmp/v1.deb
	[[ -z "$(calls)" ]] || fail "maintainer scripts called systemd without systemd: $(calls)"
	[[ -f "$ROOT$conf" ]] || fail "$conf missing"
	grep -q " $conf " <<<"$(pkg_field Conffiles)" || fail "$conf is not a conffile"
	if has_state; then
		[[ "$(stat -c %a "$ROOT$state")" == 700 ]] || fail "$state is not 0700"
	elif [[ -e "$ROOT/var/lib/hvguard" ]]; then
		fail "$name created /var/lib/hvguard (it has no state)"
	fi
	[[ -L "$ROOT$wants" ]] || fail "unit not enabled ($wants missing)"
	got=$(in_root "$name" --version)
	echo "$got"
	[[ "$got" == "$name $version" ]] || fail "--version: want '$name $version'"
	in_root "$name" --config "$conf" --check-config
	grep -q -- --check-config <<<"$(in_root "$name" --help 2>&1)" || fail "--help"
	echo "installed: config, state (${state:-none}), enabled, --version, --check-config ok"

	step "$name: purge, then install with systemd running: enabled, not started"
	in_root dpkg --purge "$name"
	systemd_running yes
	reset_calls
	in_root dpkg -i /tmp/v1.deb
	calls
	grep -qx 'systemctl --system daemon-reload' <<<"$(calls)" || fail "no daemon-reload on install"
	grep -qE 'start|restart' <<<"$(calls)" && fail "first install must not start $name"
	[[ -L "$ROOT$wants" ]] || fail "unit not enabled"

	step "$name: edit config and state, upgrade to $upversion"
	sed -i 's/^#log:$/log:/; s/^#  level: info$/  level: debug/' "$ROOT$conf"
	grep -q '^  level: debug$' "$ROOT$conf" || fail "could not edit $conf"
	in_root "$name" --config "$conf" --check-config
	if has_state; then echo marker >"$ROOT$state/marker"; fi
	cp "$ROOT$conf" "$DIST/test/edited.yaml"
	reset_calls
	in_root dpkg -i /tmp/v2.deb
	calls
	grep -qx "$name $upversion" <<<"$(in_root "$name" --version)" || fail "upgrade did not replace the binary"
	cmp "$ROOT$conf" "$DIST/test/edited.yaml" || fail "upgrade changed the edited $conf"
	if has_state && [[ ! -f "$ROOT$state/marker" ]]; then fail "upgrade lost the state"; fi
	grep -qx "deb-systemd-invoke try-restart $name.service" <<<"$(calls)" || fail "no restart on upgrade"
	grep -qx 'systemctl --system daemon-reload' <<<"$(calls)" || fail "no daemon-reload on upgrade"

	step "$name: remove keeps config and state"
	reset_calls
	in_root dpkg --remove "$name"
	calls
	grep -qx "deb-systemd-invoke stop $name.service" <<<"$(calls)" || fail "remove did not stop $name"
	[[ ! -e "$ROOT/usr/bin/$name" ]] || fail "binary left after remove"
	cmp "$ROOT$conf" "$DIST/test/edited.yaml" || fail "remove changed/deleted $conf"
	if has_state && [[ ! -f "$ROOT$state/marker" ]]; then fail "remove deleted the state"; fi
	grep -qx 'deinstall ok config-files' <<<"$(pkg_field Status)" || fail "status after remove"

	step "$name: purge removes config, state and the enable link"
	in_root dpkg --purge "$name"
	[[ ! -e "$ROOT$conf" && ! -e "$ROOT/etc/hvguard" ]] || fail "purge left /etc/hvguard"
	if has_state && [[ -e "$ROOT$state" ]]; then fail "purge left $state"; fi
	[[ ! -e "$ROOT$wants" ]] || fail "purge left $wants"
	if grep -q installed <<<"$(pkg_field Status 2>/dev/null || true)"; then fail "still known to dpkg"; fi
	echo "purged: nothing left"
done

# Both packages on one machine (a lab, a small cloud): they share
# /etc/hvguard; purging the controller must leave the agent's conffile and
# state alone, and the agent's purge then removes /etc/hvguard.
if [[ " $* " == *" hvguard-agent "* && " $* " == *" hvguard-controller "* ]]; then
	step "hvguard-agent + hvguard-controller together: purge one, the other's files stay"
	fresh_root "$ROOT"
	cp "$DIST/hvguard-agent_${version}_${arch}.deb" "$ROOT/tmp/agent.deb"
	cp "$DIST/hvguard-controller_${version}_${arch}.deb" "$ROOT/tmp/controller.deb"
	systemd_running no
	in_root dpkg -i /tmp/agent.deb /tmp/controller.deb >/dev/null
	echo marker >"$ROOT/var/lib/hvguard/marker"
	in_root dpkg --purge hvguard-controller >/dev/null
	[[ -f "$ROOT/var/lib/hvguard/marker" ]] || fail "purging the controller deleted the agent's state"
	[[ -f "$ROOT/etc/hvguard/agent.yaml" ]] || fail "purging the controller deleted agent.yaml"
	[[ ! -e "$ROOT/etc/hvguard/controller.yaml" ]] || fail "controller.yaml left after its purge"
	in_root hvguard-agent --config /etc/hvguard/agent.yaml --check-config >/dev/null
	in_root dpkg --purge hvguard-agent >/dev/null
	[[ ! -e "$ROOT/etc/hvguard" && ! -e "$ROOT/var/lib/hvguard" ]] || fail "purging both left /etc/hvguard or /var/lib/hvguard"
	echo "coexist: controller purge kept the agent's state and config; both purged: nothing left"
fi
rm -rf "$ROOT"
echo "install: OK"

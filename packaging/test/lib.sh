#!/bin/bash
# Shared by install.sh and systemd.sh (sourced): the cached Debian 12 root.
# shellcheck disable=SC2034 # variables are used by the sourcing scripts

readonly SUITE=bookworm
readonly CACHE=.cache/debootstrap
# The mirror this machine's apt uses (deb822 URIs: or one-line deb form).
MIRROR=$(sed -nE 's/^URIs: *(http[^ ]*debian)\/?$/\1/p; s/^deb +(\[[^]]*\] +)?(http[^ ]*debian)\/? +bookworm +.*/\2/p' \
	/etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || true)
readonly MIRROR=${MIRROR:-http://deb.debian.org/debian}
# Preinstalled in the root so that `dpkg -i` of our package alone suffices
# (no apt, no network during the tests): the package's runtime dependency
# libvirt0; systemd to boot the root for systemd.sh; libvirt-daemon-system
# for a real libvirtd socket (/run/libvirt/libvirt-sock) in that boot, with
# dbus and libpam-systemd, which debootstrap does not pick for its
# alternative dependencies (dbus-system-bus, logind).
readonly INCLUDE=libvirt0,systemd,systemd-sysv,libvirt-daemon-system,dbus,libpam-systemd
# Cached: the debootstrap tarball (the .debs: rebuilds need no network) and
# the finished root (extracting it takes seconds, bootstrapping ~30 s).
readonly DEBS_TGZ=$CACHE/$SUITE-minbase-hvguard-test.tgz
readonly ROOT_TAR=$CACHE/$SUITE-minbase-hvguard-test.root.tar

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

# fresh_root DIR: DIR becomes a clean copy of the cached root.
fresh_root() {
	local dir=$1
	mkdir -p "$CACHE"
	if [[ ! -f "$ROOT_TAR" ]]; then
		if [[ ! -f "$DEBS_TGZ" ]]; then
			step "debootstrap: downloading $SUITE minbase + $INCLUDE from $MIRROR (cold cache)"
			rm -rf "$CACHE/mk"
			debootstrap --variant=minbase --include="$INCLUDE" --make-tarball="$DEBS_TGZ.tmp" \
				"$SUITE" "$CACHE/mk" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
				{ tail -n 20 "$CACHE/debootstrap.log"; fail "debootstrap --make-tarball"; }
			mv "$DEBS_TGZ.tmp" "$DEBS_TGZ"
			rm -rf "$CACHE/mk"
		fi
		step "debootstrap: building the root from $DEBS_TGZ"
		rm -rf "$CACHE/root"
		debootstrap --variant=minbase --include="$INCLUDE" --unpack-tarball="$PWD/$DEBS_TGZ" \
			"$SUITE" "$CACHE/root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$CACHE/debootstrap.log"; fail "debootstrap --unpack-tarball"; }
		tar -C "$CACHE/root" --numeric-owner -cf "$ROOT_TAR.tmp" .
		mv "$ROOT_TAR.tmp" "$ROOT_TAR"
		rm -rf "$CACHE/root"
	fi
	rm -rf "$dir"
	mkdir -p "$dir"
	tar -C "$dir" -xf "$ROOT_TAR"
}

# upgrade_deb NAME VERSION: path of a .deb of NAME with a version above
# VERSION (built once per version into dist/test/upgrade).
upgrade_deb() {
	local name=$1 upversion=$2+up1 # sorts after $2 for dpkg and rpm
	local deb
	deb=$DIST/test/upgrade/${name}_${upversion}_$(dpkg --print-architecture).deb
	if [[ ! -f "$deb" ]]; then
		env PKG_VERSION="$upversion" DIST="$DIST/test/upgrade" packaging/build.sh "$name" >/dev/null
	fi
	echo "$deb"
}

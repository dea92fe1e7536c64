#!/usr/bin/env bash
# build.sh — build the tiny hvguard test guest into test/guest/out/:
#
#   out/vmlinuz        Debian's cloud kernel, extracted from its .deb
#                      (apt-get download + dpkg-deb -x; nothing is installed
#                      into the host's /boot)
#   out/initrd.cpio.gz busybox-static initramfs whose /init is ./init
#   out/kernel.version the kernel package that was used
#
# Idempotent and cached: nothing is done if the outputs exist and were built
# from the current ./init (a stamp holds its checksum); HVG_GUEST_REBUILD=1
# forces a rebuild. Needs root only to install busybox-static/cpio if they
# are missing (apt-get).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly OUT="$HERE/out"
readonly STAMP="$OUT/stamp"
T0="$(date +%s%N)"
readonly T0
elapsed() { local now; now="$(date +%s%N)"; printf '%d.%d' $(((now - T0) / 1000000000)) $((((now - T0) / 100000000) % 10)); }
log() { printf '[build.sh +%ss] %s\n' "$(elapsed)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

want_stamp="init:$(sha256sum "$HERE/init" | cut -d' ' -f1) build:$(sha256sum "$HERE/build.sh" | cut -d' ' -f1)"
if [[ "${HVG_GUEST_REBUILD:-0}" != 1 && -s "$OUT/vmlinuz" && -s "$OUT/initrd.cpio.gz" &&
	-r "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
	log "up to date: $OUT ($(cat "$OUT/kernel.version"))"
	exit 0
fi

apt_updated=0
# apt_install PKG...: install with apt-get, running `apt-get update` once if
# the first attempt fails (stale or missing package lists).
apt_install() {
	[[ "$(id -u)" == 0 ]] || die "need root to install: $*"
	export DEBIAN_FRONTEND=noninteractive
	log "installing $*"
	if apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null; then
		return 0
	fi
	((apt_updated)) && die "apt-get install $* failed"
	apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update failed"
	apt_updated=1
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null ||
		die "apt-get install $* failed"
}

if ! [[ -x /bin/busybox ]] || ! /bin/busybox --list | grep -qx insmod; then
	apt_install busybox-static
fi
[[ -x /bin/busybox ]] || die "/bin/busybox missing after installing busybox-static"
# The static build is required: the initramfs has no libc.
if ldd /bin/busybox >/dev/null 2>&1; then
	die "/bin/busybox is dynamically linked: install busybox-static (not busybox)"
fi
command -v cpio >/dev/null || apt_install cpio

# The meta package linux-image-cloud-amd64 depends on the real, versioned
# package (e.g. linux-image-6.1.0-57-cloud-amd64): that one holds the kernel.
kpkg_of_meta() {
	apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9].*-cloud-amd64$/ {print $2; exit}'
}
kpkg="$(kpkg_of_meta)"
if [[ -z "$kpkg" ]]; then
	[[ "$(id -u)" == 0 ]] || die "linux-image-cloud-amd64 unknown to apt and not root to apt-get update"
	log "apt-get update (linux-image-cloud-amd64 unknown)"
	apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update failed"
	kpkg="$(kpkg_of_meta)"
	[[ -n "$kpkg" ]] || die "cannot resolve linux-image-cloud-amd64 to a versioned kernel package"
fi
log "kernel package: $kpkg"

work="$(mktemp -d "${TMPDIR:-/tmp}/hvguard-guest.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

(cd "$work" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" >/dev/null) ||
	die "apt-get download $kpkg failed"
deb="$(ls "$work"/*.deb)"
log "downloaded $(basename "$deb") ($(du -h "$deb" | cut -f1))"
dpkg-deb -x "$deb" "$work/kernel" || die "dpkg-deb -x failed"
vmlinuz="$(ls "$work"/kernel/boot/vmlinuz-*)"
kver="${vmlinuz##*/vmlinuz-}"
moddir="$work/kernel/lib/modules/$kver/kernel"

# Initramfs tree.
root="$work/initramfs"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,lib/modules}
cp /bin/busybox "$root/bin/busybox"
install -m 0755 "$HERE/init" "$root/init"
for m in drivers/input/evdev drivers/acpi/button drivers/misc/pvpanic/pvpanic drivers/misc/pvpanic/pvpanic-mmio; do
	src="$moddir/$m.ko"
	[[ -r "$src" ]] || die "module $m.ko not in $kpkg"
	cp "$src" "$root/lib/modules/"
done
# The kernel opens /dev/console for /init's stdio before /init can mount
# devtmpfs: ship the node (needs root; without it /init still logs to ttyS0).
if [[ "$(id -u)" == 0 ]]; then
	mknod -m 600 "$root/dev/console" c 5 1
fi
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initrd.cpio"
gzip -9 -n <"$work/initrd.cpio" >"$work/initrd.cpio.gz"

install -m 0644 "$vmlinuz" "$OUT/vmlinuz"
install -m 0644 "$work/initrd.cpio.gz" "$OUT/initrd.cpio.gz"
echo "$kpkg $kver" >"$OUT/kernel.version"
echo "$want_stamp" >"$STAMP"
log "built $OUT: vmlinuz $(du -h "$OUT/vmlinuz" | cut -f1), initrd $(du -h "$OUT/initrd.cpio.gz" | cut -f1), kernel $kver"

#!/bin/bash
# Static checks of the built packages (dist/): shellcheck, lintian, rpmlint,
# systemd-analyze verify/security, the shipped config, the man page and an
# inspection of the rpm. Usage: packaging/test/lint.sh NAME... (make package-test)
set -euo pipefail
# Output is captured before grep -q sees it (grep <<<"$(cmd)"): in a
# pipeline an early-exiting grep -q can fail `cmd` with SIGPIPE (pipefail).

cd "$(dirname "$0")/../.."
# shellcheck source=packaging/packages.sh
source packaging/packages.sh
readonly DIST=${DIST:-dist}
readonly WORK=$DIST/test/lint

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "shellcheck"
shellcheck packaging/*.sh packaging/test/*.sh
# Maintainer scripts run under /bin/sh (dash): POSIX sh, so `set -eu`
# (dash in Debian 12 has no pipefail; the scripts use no pipes).
shellcheck -s sh packaging/scripts/deb/* packaging/scripts/rpm/*

version=$(cat "$DIST/VERSION") # written by build.sh
arch=$(dpkg --print-architecture)
rpmarch=$(uname -m)

for name in "$@"; do
	pkg_facts "$name"
	deb=$DIST/${name}_${version}_${arch}.deb
	rpm=$DIST/${name}-${version}-1.${rpmarch}.rpm
	[[ -f "$deb" && -f "$rpm" ]] || fail "$deb or $rpm missing: run make package"
	root=$WORK/$name-root
	rm -rf "$root"
	mkdir -p "$root"
	dpkg-deb -x "$deb" "$root"
	bin=$root/usr/bin/$name

	step "$name: lintian --pedantic (errors and warnings fail; remaining tags: packaging/README.md)"
	rc=0
	out=$(lintian --fail-on error,warning --pedantic --info "$deb" 2>&1) || rc=$?
	# Lintian works as root but says so; the message is noise here.
	grep -v 'running with root privileges' <<<"$out" || true
	((rc == 0)) || fail "lintian (exit $rc): see above"

	step "$name: rpmlint (errors and warnings fail; filters in packaging/rpmlint.toml)"
	# nfpm writes the rpm payload with absolute names (/usr/bin/...) and
	# rpmlint unpacks it with a plain `cpio -id`, which would write into /
	# of this machine. The shim forces relative extraction.
	shim=$WORK/cpio-shim
	mkdir -p "$shim"
	printf '#!/bin/sh\nexec %s --no-absolute-filenames "$@"\n' "$(command -v cpio)" >"$shim/cpio"
	chmod +x "$shim/cpio"
	before=$(stat -c %Y "/usr/bin/$name" 2>/dev/null || echo absent)
	out=$(PATH=$PWD/$shim:$PATH rpmlint -c packaging/rpmlint.toml "$rpm" 2>&1) || true
	echo "$out"
	[[ "$(stat -c %Y "/usr/bin/$name" 2>/dev/null || echo absent)" == "$before" ]] ||
		fail "rpmlint extracted the rpm into / (check /usr/bin/$name, /etc/hvguard)"
	grep -qE ' 0 errors, 0 warnings' <<<"$out" || fail "rpmlint reported errors or warnings"

	step "$name: systemd-analyze verify (offline, --root on the unpacked .deb)"
	# Without a running systemd, verify works on a root directory: the
	# unpacked package plus the host's targets (for WantedBy=/After=).
	mkdir -p "$root/usr/lib/systemd/system"
	cp -n /usr/lib/systemd/system/*.target "$root/usr/lib/systemd/system/" 2>/dev/null || true
	for unit in "$root"/lib/systemd/system/*.service; do
		systemd-analyze --root="$root" verify --man=no "$unit"
		echo "verify ok: ${unit#"$root"}"
		# Exposure score (informational; 0 = fully sandboxed, 10 = none).
		systemd-analyze --root="$root" security --offline=yes --no-pager "$unit" | tail -n1
	done
	unit=$root/lib/systemd/system/$name.service
	wants=('Type=notify' 'NotifyAccess=main' 'WatchdogSec=30s' 'Restart=on-failure' 'RestartPreventExitStatus=78'
		'ProtectSystem=strict' 'ProtectHome=yes' 'NoNewPrivileges=yes' 'CapabilityBoundingSet='
		'PrivateTmp=yes' 'Wants=network-online.target' 'SyslogLevelPrefix=yes')
	[[ -z "$PKG_STATE_DIR" ]] || wants+=("ReadWritePaths=$PKG_STATE_DIR")
	# The agent's per-boot copy of fence.json (fence.runtime_dir): kept
	# across restarts within the boot.
	[[ "$name" != hvguard-agent ]] || wants+=('RuntimeDirectory=hvguard' 'RuntimeDirectoryPreserve=yes')
	for want in "${wants[@]}"; do
		grep -qx "$want" "$unit" || fail "$unit: missing $want"
	done
	if [[ "$PKG_LIBVIRT" == yes ]]; then
		grep -qE '^After=.*libvirtd\.service.*network-online\.target' "$unit" || fail "$unit: After="
	else
		grep -qE '^After=.*network-online\.target' "$unit" || fail "$unit: After="
		if grep -q libvirt "$unit"; then fail "$unit mentions libvirt"; fi
	fi
	grep -q ReadWritePaths "$unit" && [[ -z "$PKG_STATE_DIR" ]] && fail "$unit: ReadWritePaths= without a state directory"
	stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$unit")
	shutdown=$("$bin" --print-defaults | sed -n 's/^shutdown_timeout: \([0-9]*\)s$/\1/p')
	if [[ -n "$shutdown" ]]; then
		((stop > shutdown)) || fail "TimeoutStopSec=${stop}s must exceed shutdown_timeout ${shutdown}s"
	fi

	step "$name: binary, config, man page"
	grep -qx "$name $version" <<<"$("$bin" --version)" || fail "--version is not '$name $version'"
	conf=$root/etc/hvguard/$PKG_CONF
	"$bin" --config "$conf" --check-config
	# Every default is documented (as a commented-out line) in the conffile...
	while read -r key; do
		grep -qE "^# *${key}:" "$conf" || fail "$PKG_CONF does not document '$key'"
	done < <("$bin" --print-defaults | sed -nE 's/^ *([a-z_]+):.*/\1/p')
	# ...and uncommenting every setting still gives a valid configuration.
	sed -E 's/^#( *[a-z_]+:)/\1/' "$conf" >"$WORK/uncommented.yaml"
	"$bin" --config "$WORK/uncommented.yaml" --check-config
	man=$root/usr/share/man/man8/$name.8.gz
	for flag in $("$bin" --help 2>&1 | grep -oE -- '--[a-z-]+' | sort -u); do
		grep -qF -- "${flag//-/\\-}" <<<"$(zcat "$man")" || fail "man page lacks $flag"
	done
	echo "man page documents every --help flag"

	step "$name: license (Apache-2.0, every linked module's license: packaging/licenses)"
	license=$(rpm -qp --qf '%{LICENSE}' "$rpm")
	echo "rpm License: $license"
	[[ "$license" =~ ^Apache-2\.0( AND [A-Za-z0-9.-]+)*$ ]] || fail "rpm License is not Apache-2.0 AND …: $license"
	for f in copyright LICENSE NOTICE; do
		grep -qx "/usr/share/licenses/$name/$f" <<<"$(rpm -qp --licensefiles "$rpm")" || fail "rpm lacks %license $f"
	done
	copyright=$root/usr/share/doc/$name/copyright
	[[ "$(head -n1 "$copyright")" == 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ]] ||
		fail "$copyright is not a machine-readable copyright file"
	[[ "$(cat "$copyright")" == *$'\n\nFiles: *\nCopyright: 2026 the hvguard authors\nLicense: Apache-2.0\n'* ]] ||
		fail "$copyright does not license hvguard's files under Apache-2.0"
	echo "deb copyright: $(grep -c '^Files: ' "$copyright") Files paragraphs"

	step "$name: rpm inspection"
	rpm -qp --info "$rpm" | grep -E '^(Name|Version|Release|Architecture|License)'
	rpm -qpl -v "$rpm"
	rpm -qp --scripts "$rpm"
	rpm -qpR "$rpm"
	grep -qx "/etc/hvguard/$PKG_CONF" <<<"$(rpm -qp --configfiles "$rpm")" || fail "$PKG_CONF is not %config"
	grep -qx "cn /etc/hvguard/$PKG_CONF" <<<"$(rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$rpm")" ||
		fail "$PKG_CONF is not %config(noreplace)"
	if [[ -n "$PKG_STATE_DIR" ]]; then
		grep -qE "^drwx------ .* $PKG_STATE_DIR\$" <<<"$(rpm -qpl -v "$rpm")" || fail "$PKG_STATE_DIR is not 0700 in the rpm"
	else
		grep -q '^/var/lib' <<<"$(rpm -qpl "$rpm")" && fail "the rpm ships a state directory"
	fi
	grep -q '/libvirt' <<<"$(rpm -qpl "$rpm")" && fail "libvirt is bundled in the rpm"
	grep -q 'libvirt\.so' <<<"$(dpkg-deb -c "$deb")" && fail "libvirt is bundled in the deb"
	if [[ "$PKG_LIBVIRT" == yes ]]; then
		grep -q '^libvirt-libs >= ' <<<"$(rpm -qpR "$rpm")" || fail "rpm does not require libvirt-libs"
		grep -q 'libvirt0 (>= ' <<<"$(dpkg-deb -f "$deb" Depends)" || fail "deb does not depend on libvirt0"
	else
		grep -q libvirt <<<"$(rpm -qpR "$rpm")" && fail "rpm requires libvirt"
		grep -q libvirt <<<"$(dpkg-deb -f "$deb" Depends)" && fail "deb depends on libvirt"
	fi
	# The maintainer scripts were rendered for this package.
	scripts=$(rpm -qp --scripts "$rpm")$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO)
	grep -q '@NAME@\|@STATE_DIR@' <<<"$scripts" && fail "maintainer scripts not rendered"
	grep -q "UNIT=$name.service" <<<"$scripts" || fail "maintainer scripts not for $name"
done
echo "lint: OK"

#!/bin/bash
# Builds dist/<name>_<version>_<arch>.deb and dist/<name>-<version>-1.<arch>.rpm
# for each packaged command (hvguard-agent, hvguard-controller: PKG_NAMES in
# packaging/package.mk; what differs between them is in packaging/packages.sh).
#
# Usage: packaging/build.sh NAME...   (from the repository root; `make package`)
# Env:   PKG_VERSION  override the git-derived version (the upgrade test)
#        DIST         output directory (default dist)
#        NFPM         nfpm binary (default .cache/bin/nfpm)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=packaging/packages.sh
source packaging/packages.sh

readonly DIST=${DIST:-dist}
readonly NFPM=${NFPM:-.cache/bin/nfpm-v2.45.2} # pinned in package.mk (NFPM_VERSION)
readonly GO=${GO:-go}
# Maintainer of record in the package metadata.
readonly PKG_MAINTAINER_DEFAULT="hvguard maintainers <maintainers@users.noreply.a-seed-75cbc3ff.example>"

PKG_VERSION=$(packaging/version.sh)
PKG_ARCH=$("$GO" env GOARCH) # the host's: cgo (+ libvirt for the agent), no cross build
PKG_MAINTAINER=${PKG_MAINTAINER:-$PKG_MAINTAINER_DEFAULT}
# Reproducible timestamps (binary mtimes, changelog, man page): the commit's.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export PKG_VERSION PKG_ARCH PKG_MAINTAINER SOURCE_DATE_EPOCH

# Hardened cgo build with Debian's own flags (fortify, stack protector,
# relro, bindnow) so that lintian's hardening checks pass; PIE; stripped
# (-s -w) as Debian policy requires; -trimpath so no build path leaks.
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
CGO_CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
CGO_LDFLAGS=$(dpkg-buildflags --get LDFLAGS)
export CGO_ENABLED=1 CGO_CFLAGS CGO_LDFLAGS

# min_symbol_version BINARY PREFIX: the highest versioned symbol the binary
# needs from a library (GLIBC_2.34 -> 2.34), i.e. the minimum library
# version. Used for both formats, so deb and rpm declare the same floor.
min_symbol_version() {
	objdump -T "$1" | grep -oE "\\b$2_[0-9][0-9.]*\\b" | sed "s/^$2_//" | sort -uV | tail -n1
}

for name in "$@"; do
	pkg_facts "$name"
	build="$DIST/build/$name-$PKG_ARCH"
	mkdir -p "$build"
	export PKG_BUILD=$build

	echo ">> $name $PKG_VERSION ($PKG_ARCH): go build"
	"$GO" build -trimpath -buildmode=pie \
		-ldflags "-s -w -X hvguard/agent.Version=$PKG_VERSION -X hvguard/controller/daemon.Version=$PKG_VERSION" \
		-o "$build/$name" "./cmd/$name"
	# gcc's .comment section is dead weight (dh_strip removes it too).
	objcopy --remove-section=.comment "$build/$name"

	PKG_LIBC_MIN=$(min_symbol_version "$build/$name" GLIBC)
	PKG_LIBVIRT_MIN=
	if [[ "$PKG_LIBVIRT" == yes ]]; then
		PKG_LIBVIRT_MIN=$(min_symbol_version "$build/$name" LIBVIRT)
	fi
	if [[ -z "$PKG_LIBC_MIN" || ("$PKG_LIBVIRT" == yes && -z "$PKG_LIBVIRT_MIN") ]]; then
		echo "build.sh: could not read the glibc/libvirt symbol versions of $build/$name" >&2
		exit 1
	fi
	export PKG_LIBC_MIN PKG_LIBVIRT_MIN

	echo ">> $name: copyright and License (packaging/licenses: every linked module, reviewed)"
	"$GO" run ./packaging/licenses -copyright "./cmd/$name" >"$build/copyright"
	PKG_LICENSE=$("$GO" run ./packaging/licenses -spdx "./cmd/$name")
	export PKG_LICENSE

	echo ">> $name: man page (help2man from --help)"
	help2man --no-info --no-discard-stderr --section=8 \
		--source="hvguard $PKG_VERSION" --manual="System Administration" \
		--include="packaging/man/$name.h2m" \
		--name="$(sed -n '/^\[NAME\]/{n;s/.*\\- //p}' "packaging/man/$name.h2m")" \
		"$build/$name" >"$build/$name.8"
	gzip -9nf "$build/$name.8"

	# Debian changelog (native package): one entry for this build. The
	# commit's subject, shortened on a word boundary: cut mid-word it made
	# lintian's spelling check fail the build ("skipped unles").
	subject=$(git log -1 --format=%s)
	if [ "${#subject}" -gt 50 ]; then
		subject="${subject:0:47}"
		subject="${subject% *}..."
	fi
	{
		printf '%s (%s) unstable; urgency=medium\n\n' "$name" "$PKG_VERSION"
		printf '  * Build of %s: %s\n\n' "$(git rev-parse --short=12 HEAD)" "$subject"
		printf ' -- %s  %s\n' "$PKG_MAINTAINER" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
	} >"$build/changelog"
	gzip -9nf "$build/changelog"

	# RPM changelog (%changelog), in nfpm's chglog format. Only the rpm
	# gets it: for the deb nfpm would add a changelog.Debian.gz, the name
	# for non-native packages.
	cat >"$build/changelog.yml" <<-YAML
		- semver: "$PKG_VERSION-1"  # nfpm's default rpm Release is 1
		  date: $(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
		  packager: "$PKG_MAINTAINER"
		  changes:
		    - commit: $(git rev-parse HEAD)
		      note: "Build of commit $(git rev-parse --short=12 HEAD)"
	YAML
	# Maintainer scripts: the templates in packaging/scripts rendered for
	# this package (its unit, its state directory), and the nfpm config
	# pointed at them.
	for script in packaging/scripts/deb/* packaging/scripts/rpm/*; do
		out=$build/${script#packaging/}
		mkdir -p "$(dirname "$out")"
		sed -e "s|@NAME@|$name|g" -e "s|@STATE_DIR@|$PKG_STATE_DIR|g" "$script" >"$out"
	done
	# (nfpm does not expand variables in license:, so this does.)
	sed -e "s|packaging/scripts/|$build/scripts/|" -e "s|\${PKG_LICENSE}|$PKG_LICENSE|" \
		"packaging/nfpm/$name.yaml" >"$build/nfpm-deb.yaml"
	{
		cat "$build/nfpm-deb.yaml"
		printf 'changelog: %s\n' "$build/changelog.yml"
	} >"$build/nfpm-rpm.yaml"

	echo ">> $name: nfpm deb, rpm"
	# dist/ holds exactly this build: drop packages of earlier versions.
	rm -f "$DIST/${name}"_*.deb "$DIST/${name}"-*.rpm
	"$NFPM" package --config "$build/nfpm-deb.yaml" --packager deb --target "$DIST/" >/dev/null
	"$NFPM" package --config "$build/nfpm-rpm.yaml" --packager rpm --target "$DIST/" >/dev/null
done
# The tests read the version of this build from here (the tree's git
# state, hence version.sh's answer, can change meanwhile).
echo "$PKG_VERSION" >"$DIST/VERSION"
ls -l "$DIST"/*.deb "$DIST"/*.rpm

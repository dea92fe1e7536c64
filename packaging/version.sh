#!/bin/bash
# Prints the package version derived from git, valid for both dpkg and rpm
# and ordered the same way by both (newer commit => higher version):
#
#   tag v1.2.3, clean, on the tag      -> 1.2.3
#   N commits after v1.2.3             -> 1.2.3+git<N>.<sha>
#   no v* tag at all                   -> 0.0.0+git<N>.<sha>  (N = commits in HEAD)
#   pre-release tag v1.3.0-rc1         -> 1.3.0~rc1           (~ sorts before 1.3.0 in dpkg and rpm >= 4.10)
#   uncommitted changes                -> ... .dirty appended (a dev build; never release one)
#
# <N> is numeric, so both dpkg and rpmvercmp order git5 < git12. Only
# [0-9A-Za-z.+~] can appear: valid as a Debian upstream version (starts with
# a digit, no '-' since the packages are native) and as an RPM Version (no '-').
# PKG_VERSION in the environment overrides everything (used by the upgrade test).
set -euo pipefail

if [[ -n "${PKG_VERSION:-}" ]]; then
	printf '%s\n' "$PKG_VERSION"
	exit 0
fi

cd "$(dirname "$0")/.."

# Base version: the nearest v<digit> tag, or 0.0.0 when there is none.
if tag=$(git describe --tags --abbrev=0 --match 'v[0-9]*' 2>/dev/null); then
	base=${tag#v}
	count=$(git rev-list --count "${tag}..HEAD")
else
	base=0.0.0
	count=$(git rev-list --count HEAD)
fi
base=${base//-/\~} # v1.3.0-rc1 -> 1.3.0~rc1

version=$base
if [[ "$count" != 0 ]]; then
	version+="+git${count}.$(git rev-parse --short=7 HEAD)"
fi
# Only tracked files count as dirty (build outputs are git-ignored).
if ! git diff --quiet HEAD -- 2>/dev/null; then
	version+=".dirty"
fi

if [[ ! "$version" =~ ^[0-9][0-9A-Za-z.+~]*$ ]]; then
	echo "version.sh: cannot map '$version' to a deb/rpm version" >&2
	exit 1
fi
printf '%s\n' "$version"

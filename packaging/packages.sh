#!/bin/bash
# What differs between the packaged commands (sourced by build.sh and the
# tests): pkg_facts NAME sets
#   PKG_CONF       the conffile's name under /etc/hvguard (packaging/$PKG_CONF)
#   PKG_STATE_DIR  the state directory the package creates and purges ("" = none)
#   PKG_LIBVIRT    yes when the binary links libvirt (cgo; a libvirt dependency)
#   PKG_PORT       the loopback port of /metrics and /healthz
# shellcheck disable=SC2034 # variables are used by the sourcing scripts

pkg_facts() {
	case $1 in
	hvguard-agent) PKG_CONF=agent.yaml PKG_STATE_DIR=/var/lib/hvguard PKG_LIBVIRT=yes PKG_PORT=9475 ;;
	hvguard-controller) PKG_CONF=controller.yaml PKG_STATE_DIR='' PKG_LIBVIRT=no PKG_PORT=9477 ;;
	*)
		echo "packages.sh: unknown package $1" >&2
		return 1
		;;
	esac
}

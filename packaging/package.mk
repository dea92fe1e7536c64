# Packaging targets (included by the top-level Makefile). See docs/packaging.md
# and packaging/README.md.

# Commands packaged as .deb and .rpm (what differs between them:
# packaging/packages.sh).
PKG_NAMES := hvguard-agent hvguard-controller
# nfpm is a build tool, not a dependency of the module: pinned here and
# installed into a project-local GOBIN, never added to go.mod.
NFPM_VERSION := v2.45.2
PKG_CACHE := .cache
NFPM := $(PKG_CACHE)/bin/nfpm-$(NFPM_VERSION)
# Debian 12 packages the targets need: build (help2man, dpkg-buildflags,
# objcopy/objdump) and test (lint, rpm inspection, debootstrap root).
PKG_APT_DEPS := help2man dpkg-dev binutils lintian rpmlint rpm cpio debootstrap shellcheck systemd util-linux iproute2

.PHONY: package package-deps package-test package-lint package-install-test package-systemd-test package-clean-cache

package-deps: ## install packaging tools: nfpm v2.45.2 into .cache/bin; lintian, rpmlint, rpm, debootstrap, help2man from apt
	@missing=$$(for p in $(PKG_APT_DEPS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing: $$missing"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing; fi
	@if [ ! -x $(NFPM) ]; then echo "installing nfpm $(NFPM_VERSION) into $(PKG_CACHE)/bin"; \
	  mkdir -p $(PKG_CACHE)/bin/nfpm-tmp && \
	  GOBIN=$(CURDIR)/$(PKG_CACHE)/bin/nfpm-tmp $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION) && \
	  mv $(PKG_CACHE)/bin/nfpm-tmp/nfpm $(NFPM) && rmdir $(PKG_CACHE)/bin/nfpm-tmp; fi

package: deps package-deps ## build dist/*.deb and dist/*.rpm (hvguard-agent, hvguard-controller; version from git describe)
	GO=$(GO) NFPM=$(NFPM) bash packaging/build.sh $(PKG_NAMES)

package-lint: ## lintian, rpmlint, shellcheck, systemd-analyze, config/man/rpm checks on dist/ (after make package)
	bash packaging/test/lint.sh $(PKG_NAMES)

package-install-test: ## .deb install/upgrade/remove/purge in a clean debootstrap Debian 12 root (after make package)
	GO=$(GO) NFPM=$(NFPM) bash packaging/test/install.sh $(PKG_NAMES)

package-systemd-test: ## the unit under a real systemd + libvirtd booted in that root: sandbox, notify, watchdog, upgrade
	GO=$(GO) NFPM=$(NFPM) bash packaging/test/systemd.sh $(PKG_NAMES)

# PKG_SKIP_SYSTEMD_TEST=1 skips the systemd boot test where namespaces and
# cgroup2 are not available (an unprivileged container); it says so.
package-test: package ## build the packages, then package-lint, package-install-test, package-systemd-test (CI; root)
	@$(MAKE) --no-print-directory package-lint package-install-test
	@if [ "$(PKG_SKIP_SYSTEMD_TEST)" = 1 ]; then echo "package-systemd-test: SKIPPED (PKG_SKIP_SYSTEMD_TEST=1)"; \
	else $(MAKE) --no-print-directory package-systemd-test; fi

package-clean-cache: ## forget the cached debootstrap root and nfpm (next package-test re-downloads them)
	rm -rf $(PKG_CACHE)/debootstrap $(NFPM) $(PKG_CACHE)/bin/nfpm

# nexus — build, run the demo, test, bench. Every target works on a fresh Debian 12 machine as root.
SHELL := /bin/bash
GO ?= go
BIN := bin
export NEXUS_HOME ?= $(HOME)/.local/share/nexus
# Tests run in temp homes but share one download cache (kernel, debs, images' inputs;
# internal/testutil.CacheDir), the stacks they start too.
export NEXUS_CACHE ?= $(NEXUS_HOME)/cache
export NEXUS_BIN_DIR := $(CURDIR)/bin
# apt packages the stack and its tests need; installed only when missing.
APT_PKGS := qemu-system-x86 qemu-utils debootstrap busybox-static cpio kmod e2fsprogs tmux \
	openssh-server openssh-client git curl ca-certificates socat systemd \
	python3 python3-pip python3-setuptools python3-wheel
# Peers that benchmarks compare against.
BENCH_PKGS := passt mitmproxy iperf3
# Packages whose tests boot QEMU, fetch the guest kernel or build images run one at a time
# without -race (test-vm): those under VM_DIRS, and any whose tests import VM_TEST_HELPER.
# Every other package runs in parallel with -race (test-unit). Both lists are one go list split
# in two, so no package is left out of both; make list-test-pkgs prints them.
MODULE := github.com/IniZio/nexus
VM_DIRS := e2e services/vmm/qemu services/vmm/image services/vmm/kernel services/vmm/initramfs
VM_TEST_HELPER := $(MODULE)/services/vmm/internal/vmtest
empty :=
LIST_TEST_IMPORTS = $(GO) list -f '{{.ImportPath}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}' ./...
IS_VM_PKG = $$1 ~ "^$(MODULE)/($(subst $(empty) $(empty),|,$(VM_DIRS)))(/|$$)" || index($$0 " ", " $(VM_TEST_HELPER) ")
VM_PKGS = $$($(LIST_TEST_IMPORTS) | awk '$(IS_VM_PKG) {print $$1}')
UNIT_PKGS = $$($(LIST_TEST_IMPORTS) | awk '!($(IS_VM_PKG)) {print $$1}')

.PHONY: all build build-e2e install deps apt run cluster-demo test test-unit test-vm list-test-pkgs bench clean

all: build

deps:
	@$(MAKE) --no-print-directory apt PKGS="$(APT_PKGS)"
	@# The Claude Code plugin test (e2e/mcp) runs the real claude CLI, installed with npm. A Node.js
	@# that brings its own npm (e.g. from NodeSource) is kept; otherwise Debian's.
	@command -v npm >/dev/null || $(MAKE) --no-print-directory apt PKGS="nodejs npm"

apt:
	@missing=""; for p in $(PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/nexus-agent ./services/vmm/agent/cmd/nexus-agent
	$(GO) build -o $(BIN)/nexus .

# install puts nexus and its guest agent (found beside it) in $(PREFIX)/bin, on PATH, so that
# `claude mcp add --transport stdio nexus -- nexus mcp` and the Claude Code plugin find it.
PREFIX ?= /usr/local
install: build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN)/nexus $(BIN)/nexus-agent $(DESTDIR)$(PREFIX)/bin/
	@echo "installed $(DESTDIR)$(PREFIX)/bin/nexus"

# build-e2e builds the crash tests' nexus into $(BIN)/failpoints: the same binary with the
# failpoints of pkg/failpoint armed (build tag nexus_failpoints). `make build` never sets it.
build-e2e: build
	@mkdir -p $(BIN)/failpoints
	cp $(BIN)/nexus-agent $(BIN)/failpoints/nexus-agent
	$(GO) build -tags nexus_failpoints -o $(BIN)/failpoints/nexus .

run: deps build
	./scripts/demo.sh

# cluster-demo: three hosts as network namespaces on a private bridge, one cluster; placement,
# exec across hosts, one host killed and brought back (needs root; cleans up after itself).
cluster-demo: deps build
	./scripts/cluster-demo.sh

# test runs test-unit beside test-vm: the unit half boots no VM, and at nice 10 it takes only the
# CPU the VM half leaves (its guests wait on I/O and timers much of the time), so on 2 cores it
# costs little wall time of its own and never slows a guest. Its output goes to $(UNIT_LOG) and is
# printed when both halves are done; make test fails when either failed.
UNIT_LOG ?= $(BIN)/test-unit.log
test: deps build build-e2e
	@nice -n 10 $(MAKE) --no-print-directory test-unit >$(UNIT_LOG) 2>&1 & unit=$$!; \
	$(MAKE) --no-print-directory test-vm; vm=$$?; \
	wait $$unit; u=$$?; \
	echo "==== test-unit (ran beside test-vm at nice 10): $(UNIT_LOG) ===="; cat $(UNIT_LOG); \
	echo "test-unit: exit $$u; test-vm: exit $$vm"; \
	[ $$u -eq 0 ] && [ $$vm -eq 0 ]

test-unit:
	$(GO) test -race -count=1 -timeout 15m $(UNIT_PKGS)

test-vm:
	$(GO) test -count=1 -p 1 -timeout 40m $(VM_PKGS)

# list-test-pkgs prints which packages test-unit and test-vm run.
list-test-pkgs:
	@echo "unit:" $(UNIT_PKGS)
	@echo "vm:" $(VM_PKGS)

bench: deps build
	@$(MAKE) --no-print-directory apt PKGS="$(BENCH_PKGS)"
	./scripts/bench.sh

clean:
	rm -rf $(BIN)

# lrec / lanalyze. The two commands that matter: `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
APT_PACKAGES := clang-19 llvm-19 libbpf-dev gcc make libc6-dev luajit2 libluajit2-5.1-dev nginx \
	libnginx-mod-http-lua wrk golang-go lua5.1 lua5.2 lua5.3 lua5.4 liblua5.4-dev liblua5.1-0-dbg liblua5.3-0-dbg \
	liblua5.4-0-dbg nodejs python3-venv redis-server redis-tools haproxy tshark debuginfod binutils patch tarantool
BENCH_PACKAGES := linux-perf strace time
DEMO_DIR := demo-out

.PHONY: setup setup-bench build dist fixtures test demo bench fuzz lint clean

## Installs what building and testing need (idempotent: installs only what is missing).
setup:
	@$(call apt_install,$(APT_PACKAGES))
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup"; exit 1; }

setup-bench:
	@$(call apt_install,$(BENCH_PACKAGES))

define apt_install
missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
if [ -n "$$missing" ]; then \
  echo "installing:$$missing"; \
  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; \
  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
fi
endef

build: setup
	$(CARGO) build --release --workspace --all-targets

## dist/lrec and dist/lanalyze: one static executable each (glibc linked in, no loader, no
## libgcc_s), without debug info, their --version naming the commit: copy lrec to a server.
DIST_TARGET := x86_64-unknown-linux-gnu
DIST_VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1) \
	($(shell git rev-parse --short=12 HEAD 2>/dev/null || echo "no git")$(shell \
	git diff --quiet HEAD 2>/dev/null || echo "+changes"), static $(DIST_TARGET))
dist: setup
	LREC_VERSION="$(DIST_VERSION)" RUSTFLAGS="-C target-feature=+crt-static" \
		$(CARGO) build --release --locked --target $(DIST_TARGET) --target-dir target/dist \
		-p lrec -p lanalyze --config 'profile.release.debug=false' \
		--config 'profile.release.strip="debuginfo"'
	@mkdir -p dist
	cp target/dist/$(DIST_TARGET)/release/lrec target/dist/$(DIST_TARGET)/release/lanalyze dist/
	@ls -l dist/lrec dist/lanalyze; file -b dist/lrec | cut -d, -f1-6; dist/lrec --version

fixtures: setup
	$(MAKE) -C fixtures

## Unit, snapshot, CLI and end-to-end tests (the e2e tests record with BPF: run as root;
## tests/dist.rs runs dist/lrec inside an empty root). The three builds run side by side:
## on two cores, the stretches where one of them keeps a single core busy (a big crate's
## last codegen unit, linking, LuaJIT's buildvm) leave the other core to the others.
test: setup
	$(MAKE) --no-print-directory -j3 build fixtures dist
	$(CARGO) test --release --workspace

## Records a bundled LuaJIT workload for 4 s and writes a C + Lua flamegraph.
demo: build fixtures
	@mkdir -p $(DEMO_DIR)
	./target/release/lrec -F 499 -o $(DEMO_DIR)/lua.lrec -- \
		fixtures/bin/luajit-gc64 fixtures/workloads/lua/chains.lua 4
	./target/release/lanalyze $(DEMO_DIR)/lua.lrec --flamegraph --force -o $(DEMO_DIR)/flamegraph.svg
	./target/release/lanalyze $(DEMO_DIR)/lua.lrec --top 12
	@echo "flamegraph: $(DEMO_DIR)/flamegraph.svg"

## lrec vs perf on the same process at the same time: bytes/sample and analysis speed.
bench: build fixtures setup-bench
	scripts/bench.sh

## A long run of the capture fuzz target (analyze/tests/fuzz.rs; `make test` runs 64 cases).
FUZZ_CASES ?= 20000
fuzz: build
	PROPTEST_CASES=$(FUZZ_CASES) $(CARGO) test --release -p lanalyze --test fuzz -- --nocapture

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
	$(MAKE) -C fixtures clean
	rm -rf $(DEMO_DIR) dist

# holdfast — build, run, test, package.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GOFLAGS_BUILD := -trimpath -ldflags '$(LDFLAGS)'
export CGO_ENABLED ?= 0

.PHONY: all help build man nats-cli run test test-short fmt-check vet staticcheck tidy-check docs clean

all: build

## help: this list: every target with what it does
help:
	@awk '/^## [a-z0-9-]+: / { sub(/^## /, ""); i = index($$0, ":"); printf "  %-16s %s\n", substr($$0, 1, i - 1), substr($$0, i + 2) }' $(MAKEFILE_LIST)

## build: the holdfast binary in bin/
build:
	$(GO) build $(GOFLAGS_BUILD) -o bin/holdfast ./cmd/holdfast

## man: the manual page in bin/holdfast.1, from the commands themselves (read it with man -l bin/holdfast.1)
man: build
	./bin/holdfast man >bin/holdfast.1
	@echo "man -l bin/holdfast.1"

## nats-cli: build the standard nats CLI (go tool nats) once, saying so: the first build takes about two minutes
nats-cli:
	@echo "nats CLI for 'go tool nats': building it if needed (the first time about 2 minutes)"
	@$(GO) tool nats --version >/dev/null

## run: build and run holdfast on the built-in defaults (store in ./holdfast-data)
run: build nats-cli
	./bin/holdfast run

# Tests run in parallel within a package up to TEST_PARALLEL at once, and
# up to TEST_PACKAGES packages at once. Most tests wait on subprocesses,
# elections and timers rather than on the CPU: 4 and 4 on 2 cores keep
# them well inside their deadlines. The longest packages are named first,
# so that they start first (go test starts packages in the order given)
# and no long one starts last; go vet and staticcheck run meanwhile, on
# the CPU the waiting tests leave. -trimpath keys the build cache by
# module path, not directory: a fresh clone compiles nothing new.
TEST_PARALLEL ?= 4
TEST_PACKAGES ?= 4
TEST_FIRST := ./cmd/holdfast/ ./packaging/ ./pipeline/ ./embedded/ ./ingest/ ./backup/

## test: gofmt check, go mod tidy check, go vet, staticcheck and go test -race (then every skipped test with its reason)
test: fmt-check tidy-check
	@set -o pipefail; checks=$$(mktemp); \
	{ $(MAKE) --no-print-directory vet staticcheck >"$$checks" 2>&1; echo $$? >"$$checks.rc"; } & \
	CGO_ENABLED=1 $(GO) test -trimpath -race -count=1 -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) -timeout 20m -json $(TEST_FIRST) ./... | $(GO) run ./internal/testreport; \
	status=$$?; wait; cat "$$checks"; rc=$$(cat "$$checks.rc"); rm -f "$$checks" "$$checks.rc"; \
	if [ "$$rc" != 0 ]; then echo "make test: go vet or staticcheck failed (above)"; exit 1; fi; \
	exit $$status

test-short: 
	CGO_ENABLED=1 $(GO) test -race -short -count=1 ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# staticcheck is built from the module proxy at a pinned version, outside
# go.mod: a linter is not a dependency of the binary or of its tests.
STATICCHECK_VERSION ?= v0.8.2

## staticcheck: staticcheck $(STATICCHECK_VERSION) on every package (built once, then cached)
staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

tidy-check:
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit"; exit 1; }

## docs: write docs/configuration-reference.md from the default config file (a test fails when it is out of date)
docs:
	$(GO) run ./cmd/holdfast config --reference > docs/configuration-reference.md

clean:
	rm -rf bin dist holdfast-data

## ---------------------------------------------------------------------------
## Packaging: systemd unit, deb and rpm (see packaging/ and systemd/).
## Static checks of the unit and the packages run in `go test ./packaging/`,
## which `make test` runs; the real install under systemd is `install-test`.
## ---------------------------------------------------------------------------
PKG_ARCHES ?= amd64 arm64
# Empty: derived from VERSION by packaging/build.sh.
PKG_VERSION ?=

.PHONY: demo-cluster demo-edge demo-stop

## demo-cluster: start examples/cluster's three nodes in the background (logs in data/), print their status
demo-cluster: build
	examples/demo.sh cluster

## demo-edge: start examples/edge-hub's hub and edge in the background (logs in data/), print their status
demo-edge: build
	examples/demo.sh edge

## demo-stop: stop what demo-cluster or demo-edge started
demo-stop:
	examples/demo.sh stop

.PHONY: package release install-test

## package: deb and rpm for $(PKG_ARCHES) in dist/ (static, stripped, reproducible; about a minute per architecture)
package:
	GO=$(GO) packaging/build.sh '$(VERSION)' '$(COMMIT)' '$(PKG_VERSION)' $(PKG_ARCHES)

## release: package, then a tarball per architecture (binary, config, man page, licences) and dist/SHA256SUMS, checked
release: package
	packaging/release.sh

## install-test: install, restart, kill, upgrade (also from an older commit's packages) and purge the deb and rpm under a real systemd in a container (root; about 3 min once cached)
install-test:
	GO=$(GO) packaging/install-test.sh

## ---------------------------------------------------------------------------
## Durability: long runs of the power-loss and kill -9 harnesses, and every
## fuzz target. Short versions of all three run in `make test`. The power-loss
## harness mounts lazyfs (FUSE): it needs root and /dev/fuse (Debian: fuse3).
## Figures and what they mean: docs/durability.md.
## ---------------------------------------------------------------------------
POWERLOSS_CYCLES ?= 100
CHAOS_CYCLES ?= 300
FUZZTIME ?= 30s

.PHONY: powerloss chaos fuzz

## powerloss: $(POWERLOSS_CYCLES) simulated power cuts with sync "always" (0 lost), with group commit (0 lost), MQTT QoS 1 devices (0 lost) and "2m" (loss measured)
powerloss:
	set -o pipefail; CGO_ENABLED=1 HOLDFAST_POWERLOSS_CYCLES=$(POWERLOSS_CYCLES) \
	$(GO) test -count=1 -timeout 4h -run 'TestPowerLoss' -v ./cmd/holdfast/ 2>&1 | tee $${TMPDIR:-/tmp}/holdfast-powerloss.log | grep -E '^(powerloss:|--- |ok|FAIL|PASS)'

## chaos: $(CHAOS_CYCLES) kill -9 cycles under load, in bootstrap and in shutdown
chaos:
	set -o pipefail; CGO_ENABLED=1 HOLDFAST_CHAOS_CYCLES=$(CHAOS_CYCLES) \
	$(GO) test -count=1 -timeout 4h -run 'TestChaosKill9' -v ./cmd/holdfast/ 2>&1 | tee $${TMPDIR:-/tmp}/holdfast-chaos.log | grep -E '^(chaos:|--- |ok|FAIL|PASS)'

## fuzz: every Fuzz target of every package for $(FUZZTIME) each
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

## ---------------------------------------------------------------------------
## Benchmarks (see docs/performance.md). Not part of `make test`, which runs
## each Go benchmark once (TestBenchmarksRunOnce) and `holdfast bench --json`.
## ---------------------------------------------------------------------------
BENCH_MSGS ?= 20000
BENCH_SIZE ?= 128
BENCH_WORKERS ?= 4
BENCH_SYNC ?= always,2m
BENCH_RUNS ?= 3

.PHONY: bench bench-compare

## bench: Go benchmarks of the pipeline's hot paths, and holdfast bench
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./pipeline/
	./bin/holdfast bench --msgs $(BENCH_MSGS) --size $(BENCH_SIZE) --workers $(BENCH_WORKERS) --sync $(BENCH_SYNC)

## bench-compare: stock nats-server v2.15.2 + nats bench vs holdfast bench, with ratios (writes dist/bench-compare.md)
bench-compare:
	@mkdir -p dist
	$(GO) run ./bench/compare -msgs $(BENCH_MSGS) -size $(BENCH_SIZE) -workers $(BENCH_WORKERS) -sync $(BENCH_SYNC) -runs $(BENCH_RUNS) -out dist/bench-compare.md

# Messages in the edge's backlog for bench-edge: a run of 100,000 takes
# about 80 s here (publish, catch-up, steady state, the hub's own ingest).
EDGE_MSGS ?= 100000

.PHONY: bench-edge

## bench-edge: edge → hub catch-up of an EDGE_MSGS backlog after an outage (exactly once checked) against the hub's own atomic-batch and async ingest, peak RSS, steady forward latency; BENCH_RUNS runs (writes dist/bench-edge.md)
bench-edge: build nats-cli
	@mkdir -p dist
	$(GO) run ./bench/edge -holdfast bin/holdfast -msgs $(EDGE_MSGS) -size 128 -runs $(BENCH_RUNS) -out dist/bench-edge.md

# Messages kept in a stream for the stored half of bench-footprint: filled
# once per server (about 22 s each here with the fast sync modes).
FOOTPRINT_STORED ?= 1000000
# The jetstream.commit_window of the steady figures' holdfast+commit_window.
COMMIT_WINDOW ?= 40ms

.PHONY: bench-footprint

## bench-footprint: its goals' table first (each figure against stock or today, met or not), then idle CPU ticks and disk writes of stock nats-server (sync_interval always), the same with holdfast's default streams, and holdfast on defaults, empty and with FOOTPRINT_STORED messages, BENCH_RUNS runs of 30 s; then bytes and CPU per message at a steady 200 msg/s through the log, exec and forward handlers, also with COMMIT_WINDOW; the throughput and group-commit goals from bench-compare's sync always runs, run first (writes dist/bench-footprint.md and dist/bench-footprint-throughput.md)
bench-footprint: build
	@mkdir -p dist
	$(GO) run ./bench/compare -msgs $(BENCH_MSGS) -size $(BENCH_SIZE) -workers $(BENCH_WORKERS) -sync always -group-commit 1,16 -runs $(BENCH_RUNS) -goals dist/bench-footprint-throughput.json -out dist/bench-footprint-throughput.md
	$(GO) run ./bench/footprint -holdfast bin/holdfast -stored $(FOOTPRINT_STORED) -runs $(BENCH_RUNS) -commit-window $(COMMIT_WINDOW) -goals dist/bench-footprint-throughput.json -out dist/bench-footprint.md

.PHONY: screenshots

## screenshots: the status page at 360 and 1280 px, from its browser test (writes docs/img/status-*.png)
screenshots:
	@mkdir -p docs/img
	HOLDFAST_SCREENSHOTS=$(CURDIR)/docs/img HOLDFAST_REQUIRE_BROWSER=1 $(GO) test -count=1 -run '^TestStatusPage$$' ./cmd/holdfast/

.PHONY: bench-mqtt

## bench-mqtt: MQTT QoS 1 throughput and PUBACK latency, 1 and 16 devices, into holdfast [mqtt], stock nats-server MQTT and Mosquitto (installed if missing); BENCH_RUNS runs (writes dist/bench-mqtt.md)
bench-mqtt: build
	@command -v mosquitto >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq mosquitto; }
	@mkdir -p dist
	$(GO) run ./bench/mqtt -holdfast bin/holdfast -runs $(BENCH_RUNS) -out dist/bench-mqtt.md

.PHONY: bench-cluster

## bench-cluster: publish throughput of an R1 and an R3 stream on a 3-node holdfast cluster on 127.0.0.1, alternately, per sync mode (about 3 minutes)
bench-cluster: build nats-cli
	bench/cluster/r1-r3.sh bin/holdfast 3 $(BENCH_MSGS)

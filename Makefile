# fastroute — make targets. CI runs `bash .ci/run`, which runs `make lint test`.
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s
BENCHTIME ?= 200ms
# go-nvml's binding calls NVML functions marked deprecated; their warnings
# would flood every cgo build's output.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: build test test-race test-nonvml bench bench-e2e bench-routing bench-streams fuzz demo demo-cluster lint

build:
	$(GO) build -buildvcs=auto -o bin/fastroute ./cmd/fastroute
	CGO_ENABLED=0 $(GO) build -tags nonvml -o bin/fastroute-nonvml ./cmd/fastroute

## test: race-enabled tests, then the CPU-only build and tests without cgo.
test: test-race test-nonvml

test-race:
	$(GO) test -race -count=1 $(PKGS)

test-nonvml:
	CGO_ENABLED=0 $(GO) test -tags nonvml -count=1 $(PKGS)

## bench: the micro-benchmarks of pickers, the selection core, the GPU refresh,
## the parse of an engine's metrics page, the check of a client's API key,
## a model alias's and mirror's draw, a traced request's span, and the
## check of a client's certificate chain against the revocation lists.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./pickers ./dataplane ./affinity ./lora ./telemetry/nvml ./telemetry/engine ./dataplane/loops/weights ./dataplane/apikeys ./dataplane/aliases ./dataplane/mirrors ./dataplane/tracing ./internal/tlsfiles

## bench-e2e: fastroute, nginx (least_conn), HAProxy (leastconn), direct and
## the three floor proxies (the least a Go proxy costs: bench/floor),
## one after the other, same mock workers and load, five rounds interleaved
## (each row the median round, its ratios the medians of each round's);
## table and plot in bench/out.
## Installs nginx, haproxy and wrk from Debian packages when missing.
E2E_FLAGS ?= --duration 3s --connections 64 --rounds 5
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
bench-e2e: build
	@command -v nginx >/dev/null && command -v haproxy >/dev/null && command -v wrk >/dev/null || \
		{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nginx haproxy wrk; }
	PATH="$$PATH:/usr/sbin" ./bin/fastroute bench-e2e $(E2E_FLAGS)

## bench-routing: routing quality on a fleet of simulated engines (two
## GPU-like, one CPU-like at 1/6 speed): every fastroute mode, nginx
## least_conn and round-robin, open-loop Poisson load at 50/80/95% of the
## fleet's capacity; then prefill/decode disaggregation, prefix
## affinity on multi-turn conversations over prefix-caching engines, a
## fast and a slow engine joining the fleet under load, and the router
## restarted in front of busy engines.
## Table and TTFT p99 plot in bench/out. Installs nginx.
ROUTING_FLAGS ?=
bench-routing: build
	@command -v nginx >/dev/null || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nginx; }
	PATH="$$PATH:/usr/sbin" ./bin/fastroute bench-routing $(ROUTING_FLAGS)

## bench-streams: 1,000, 5,000 and 8,000 concurrent SSE streams (64 chunks
## 100 ms apart) direct, through fastroute and through nginx (one worker
## process): errors, RSS per stream, goroutines, chunk gaps. Installs nginx.
STREAMS_FLAGS ?=
bench-streams: build
	@command -v nginx >/dev/null || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nginx; }
	PATH="$$PATH:/usr/sbin" ./bin/fastroute bench-streams $(STREAMS_FLAGS)

## fuzz: each fuzz target for FUZZTIME (those of ./fuzz, and the front end's
## header handling and socket reads, which work on unexported state). A new
## input's minimization is bounded by FUZZMINIMIZE (Go's default, 60 s,
## outlasts FUZZTIME when each run opens sockets). A target that fails with
## only "context deadline exceeded" as its time ends, writing no failing
## input, met Go 1.26's coordinator race (go.dev/issue/75804, fixed in Go
## 1.27), not a bug: it runs once more.
FUZZ_PACKAGES = ./fuzz ./dataplane/http/frontend
FUZZMINIMIZE ?= 5s
fuzz:
	@out=$$(mktemp); trap 'rm -f $$out' EXIT; \
	for p in $(FUZZ_PACKAGES); do for t in $$($(GO) test -list '^Fuzz' $$p | grep '^Fuzz'); do \
		for try in 1 2; do \
			echo "== $$p $$t"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $$p > $$out 2>&1; rc=$$?; cat $$out; \
			[ $$rc = 0 ] && break; \
			if [ $$try = 1 ] && grep -q '^    context deadline exceeded$$' $$out && ! grep -q 'Failing input written' $$out; then \
				echo "(go.dev/issue/75804: the fuzzing coordinator's deadline race, no failing input: once more)"; continue; fi; \
			exit 1; \
		done; \
	done; done

## demo: mock workers plus the router on loopback, a few real requests.
demo:
	$(GO) run ./cmd/fastroute demo

## demo-cluster: a local etcd, two router replicas and three mock workers
## registered on it; one worker's registrar dies. Installs etcd-server.
demo-cluster:
	@command -v etcd >/dev/null || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq etcd-server; }
	$(GO) run ./cmd/fastroute demo-cluster

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet -tags nonvml $(PKGS)

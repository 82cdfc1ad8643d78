# fastroute — make targets. CI runs `bash .ci/run`, which runs `make lint test`.
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s
BENCHTIME ?= 200ms

.PHONY: build test test-race test-nonvml bench fuzz demo lint

build:
	$(GO) build -o bin/fastroute ./cmd/fastroute
	CGO_ENABLED=0 $(GO) build -tags nonvml -o bin/fastroute-nonvml ./cmd/fastroute

## test: race-enabled tests, then the CPU-only build and tests without cgo.
test: test-race test-nonvml

test-race:
	$(GO) test -race -count=1 $(PKGS)

test-nonvml:
	CGO_ENABLED=0 $(GO) test -tags nonvml -count=1 $(PKGS)

## bench: the micro-benchmarks of pickers, the selection core and the GPU refresh.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./pickers ./dataplane ./affinity ./lora ./telemetry/nvml ./telemetry/weights

## fuzz: each fuzz target for FUZZTIME.
fuzz:
	@for t in $$($(GO) test -list '^Fuzz' ./fuzz | grep '^Fuzz'); do \
		echo "== $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./fuzz || exit 1; \
	done

## demo: mock workers plus the router on loopback, a few real requests.
demo:
	$(GO) run ./cmd/fastroute demo

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet -tags nonvml $(PKGS)

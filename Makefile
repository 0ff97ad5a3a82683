# deptrace: build, regenerate BPF objects, test, benchmark.
GO ?= go

.PHONY: build deps generate check-generate vet test bench

build:
	$(GO) build -o deptrace ./cmd/deptrace

deps:
	scripts/deps.sh

# Rebuild the committed bpf2go outputs from bpf/*.c with Debian's clang.
generate: deps
	$(GO) generate ./...

check-generate: deps
	scripts/check-generate.sh

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi
	$(GO) vet ./...

# The whole suite. Privileged tests need root; under CI=true they fail
# rather than skip without it.
test: deps check-generate vet
	$(GO) test -count=1 -timeout 30m ./...

# Overhead benchmark (root): writes docs/performance.md numbers to stdout.
bench:
	$(GO) build -o deptrace-bench ./cmd/deptrace-bench
	./deptrace-bench overhead

# deptrace: build, regenerate BPF objects, test, benchmark, package.
GO ?= go
GOARCH ?= $(shell $(GO) env GOARCH)
# A release tag vX.Y.Z gives version X.Y.Z; otherwise 0.0.0~git<commit>
# (sorts before any release in dpkg).
VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo $${v\#v} || echo 0.0.0~git$$(git rev-parse --short HEAD 2>/dev/null || echo unknown))
# Static, reproducible: no cgo (pure Go BPF loader and SQLite), no local paths.
BUILDFLAGS = -trimpath -ldflags '-s -w -X main.version=$(VERSION)'
DIST ?= dist

.PHONY: build build-bench deps generate check-generate vet lint tidy tidy-check test test-unit bench package clean

# The committed BPF objects are made by Debian's clang of this major version
# (scripts/clang-version; Debian 12's clang). check-generate compares only
# with that clang and says so in one line otherwise.
CLANG_VERSION := $(shell cat scripts/clang-version)

# golangci-lint (staticcheck, errcheck, unused; .golangci.yml), built by
# `go install` from the Go module proxy at this version into a directory of
# its own. Not in go.mod's tool block: its module graph has over 200
# requirements, which go.mod/go.sum would then carry and which minimal
# version selection would share with the product's own dependencies.
GOLANGCI_LINT_VERSION = v2.15.0
GOLANGCI_LINT = $(shell $(GO) env GOPATH)/tools/golangci-lint@$(GOLANGCI_LINT_VERSION)/golangci-lint

# The binary: ./deptrace for GOARCH (the host's unless set: make build
# GOARCH=arm64 cross-compiles; linux/amd64 and linux/arm64 are supported).
BIN ?= deptrace
# Go for the tools that run here (nfpm, mkimage): GOARCH is the target's.
HOSTGO = GOOS= GOARCH= $(GO)
# make release: every architecture's binary, packages and image, and the
# multi-architecture image.
ARCHES ?= amd64 arm64

build:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH) $(GO) build $(BUILDFLAGS) -o $(BIN) ./cmd/deptrace

build-bench:
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o deptrace-bench ./bench/cmd/deptrace-bench

deps:
	scripts/deps.sh

# Rebuild the committed bpf2go outputs from bpf/*.c with Debian's clang
# $(CLANG_VERSION) (a one-line warning with another clang).
generate: deps
	@scripts/check-generate.sh --clang
	$(GO) generate ./...

check-generate: deps
	scripts/check-generate.sh

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi
	$(GO) vet ./...
	scripts/check-format.sh
	@$(MAKE) --no-print-directory lint

# Part of vet. The first run builds golangci-lint (about 1.5 min on 2
# cores); later runs reuse it.
lint:
	@test -x $(GOLANGCI_LINT) || { echo "lint: installing golangci-lint $(GOLANGCI_LINT_VERSION)" >&2; \
	  GOBIN=$(dir $(GOLANGCI_LINT)) GOFLAGS= $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); }
	$(GOLANGCI_LINT) run ./...

# -e: tolerate test-only packages of dependencies that the module proxy no
# longer serves (modernc.org/sqlite's tests import a pprof version it lacks);
# they never reach a deptrace binary.
tidy:
	$(GO) mod tidy -e

# Fails, printing the diff, when go.mod or go.sum are not tidy.
tidy-check:
	@$(GO) mod tidy -e -diff 2>/dev/null || { $(GO) mod tidy -e -diff 2>&1; echo "tidy-check: go.mod/go.sum are not tidy; run 'make tidy' and commit" >&2; exit 1; }

# The whole suite. Privileged tests need root; under CI=true they fail
# rather than skip without it.
test: deps check-generate vet tidy-check
	scripts/kernel-matrix/parse-test.sh
	$(GO) test -count=1 -timeout 30m ./...

# The unprivileged tests alone: no root, no apt, no kernel side loaded
# (privileged tests skip, DEPTRACE_TEST_UNIT=1). For a quick loop while
# editing; CI runs `make test`.
test-unit:
	DEPTRACE_TEST_UNIT=1 $(GO) test -count=1 ./...

# Overhead benchmark (root): writes docs/performance.md numbers to stdout.
bench: build-bench
	./deptrace-bench overhead

# $(DIST)/deptrace_$(VERSION)_$(GOARCH).deb and a tarball with the same
# files, from the static binary (nfpm is pinned in go.mod's tool block; it
# has no tarball packager, so tar makes the tarball from the .deb's tree).
# It replaces this architecture's packages in $(DIST), not the others'.
package: build
	mkdir -p $(DIST) && rm -f $(DIST)/deptrace_*_$(GOARCH).deb $(DIST)/deptrace_*_linux_$(GOARCH).tar.gz
	VERSION='$(VERSION)' DEPTRACE_ARCH='$(GOARCH)' DEPTRACE_BINARY='$(BIN)' $(HOSTGO) tool nfpm package --config packaging/nfpm.yaml --packager deb --target $(DIST)/
	packaging/tarball.sh $(DIST) '$(VERSION)' '$(GOARCH)'

# $(DIST)/deptrace_$(VERSION)_$(GOARCH).oci.tar: the container image (FROM
# scratch, the static binary at /usr/bin/deptrace), an OCI image layout that
# is also a Docker archive: `docker load -i` or `ctr images import` it. Built
# by packaging/mkimage (standard library only): no daemon, registry or
# network. docs/operations.md, "Run as a container".
.PHONY: image release
IMAGE_META = -version '$(VERSION)' -revision "$$(git rev-parse HEAD 2>/dev/null)" -created "$$(git log -1 --format=%ct 2>/dev/null || echo 0)"
image: build
	$(HOSTGO) run ./packaging/mkimage -binary $(BIN) -arch '$(GOARCH)' $(IMAGE_META) -out $(DIST)/deptrace_$(VERSION)_$(GOARCH).oci.tar

# For each of $(ARCHES): $(DIST)/linux_ARCH/deptrace, its .deb, tarball
# and image; then $(DIST)/deptrace_$(VERSION)_multiarch.oci.tar, one image
# whose index has a manifest per architecture (ctr images import
# --platform, or docker load: NAME:TAG-ARCH). docs/operations.md.
release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	set -e; for a in $(ARCHES); do \
	  $(MAKE) --no-print-directory package image GOARCH=$$a BIN=$(DIST)/linux_$$a/deptrace VERSION='$(VERSION)' DIST='$(DIST)'; \
	done
	$(HOSTGO) run ./packaging/mkimage $(foreach a,$(ARCHES),-platform $(a)=$(DIST)/linux_$(a)/deptrace) $(IMAGE_META) \
	  -out $(DIST)/deptrace_$(VERSION)_multiarch.oci.tar

clean:
	rm -rf deptrace deptrace-bench $(DIST)

# Kernel matrix (root; reaches Debian's package archive): boots Debian's own
# kernels (5.10 doctor only, 6.1, 6.12, newest 7.x) in qemu. test-kernels is
# the CI tier: deptrace doctor and the tests of scripts/kernel-matrix/tier
# (every hook path) on each kernel; test-kernels-full runs every privileged
# test binary on each kernel, before a change of the kernel side. See
# docs/install.md and, for times, docs/testing.md.
.PHONY: test-kernels test-kernels-full
test-kernels:
	scripts/kernel-matrix/matrix --tier
	$(MAKE) --no-print-directory test-kernels-arm64

# test-kernels-full: every test on the x86_64 kernels, then the tier on
# arm64 (scripts/kernel-matrix/arm64 --tier: 6.1 and 6.12 under TCG, the
# failures scripts/kernel-matrix/arm64-expected lists for 6.1 expected);
# both run, and either failing fails the target. The x86_64 guests boot
# one after the other unless KMATRIX_JOBS says otherwise: every test
# loads its own kernel side, and beside another guest on two host CPUs
# the 7.3 guest's ./internal/bundler passed 17 of its 27 tests in 25
# minutes (commit 369db79); alone it passed all 28 of commit 5d0f034 in
# 1,494 s (docs/testing.md).
test-kernels-full:
	rc=0; KMATRIX_JOBS=$${KMATRIX_JOBS:-1} scripts/kernel-matrix/matrix || rc=1; scripts/kernel-matrix/arm64 --tier || rc=1; exit $$rc

# arm64 (the end of the CI tier, test-kernels): Debian's cloud-arm64 kernels, newest 6.1
# (Debian 12) and 6.12 (Debian 13), in qemu-system-aarch64 under TCG with
# deptrace built for arm64, both guests at once: doctor, TestEveryHookLoads
# and one exact-count test on each; TestEveryHookLoads fails on 6.1 by
# design (no fexit on 6.1 arm64), as scripts/kernel-matrix/arm64-expected
# lists; about 2 minutes. docs/install.md, "arm64".
.PHONY: test-kernels-arm64
test-kernels-arm64:
	KMATRIX_TESTS='TestEveryHookLoads|TestFlowCacheCountsEveryConnection$$' scripts/kernel-matrix/arm64 6.1 6.12

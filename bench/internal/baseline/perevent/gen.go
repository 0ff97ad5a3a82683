// Package perevent loads bench/bpf/perevent.bpf.c: the per-call kernel side that
// deptrace bench compare measures bundling against. It counts every TCP/UDP
// send and receive as it happens, and its mode picks how it aggregates:
// bundled per call (deptrace's first bundler, kept as a reference), per
// 5-tuple, or streaming every event to user space. Only the benchmark
// uses it; deptrace itself runs internal/bundler.
package perevent

// The generated perevent_x86_bpfel.go/.o (amd64) and perevent_arm64_bpfel.go/.o
// (arm64) are committed so that a clone builds without clang, for either
// architecture; `make generate` rebuilds them and `make check-generate`
// fails when they differ from their sources. Each object is compiled with
// its __TARGET_ARCH_* (x86, arm64); this object has no architecture-specific C.
//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target amd64,arm64 -type flow_key -type flow_value -type port_key -type port_value -type listen_record -type stat_index -type stream_event perevent ../../../bpf/perevent.bpf.c -- -I../../../bpf -I../../../../bpf -I../../../../bpf/include

// Package bundler loads bpf/bundler.bpf.c, attaches its programs to the
// hooks this kernel offers, and drains the bundled flows: it harvests the
// counters of live sockets, switches programs to the other flow map and
// reads what the interval counted in the one they left. It is the only
// package that knows deptrace's kernel side.
package bundler

// The generated bundler_x86_bpfel.go/.o (amd64) and bundler_arm64_bpfel.go/.o
// (arm64) are committed so that a clone builds without clang, for either
// architecture; `make generate` rebuilds them and `make check-generate`
// fails when they differ from their sources. Each object is compiled with
// its __TARGET_ARCH_* (x86, arm64): on_connect_exit reads the system call's
// registers, which differ between them.
//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target amd64,arm64 -type flow_key -type port_key -type port_value -type listen_record -type listener_record -type stat_index -type direction -type flow_proto -type unix_path -type spill_state -type pid_naming bundler ../../bpf/bundler.bpf.c -- -I../../bpf -I../../bpf/include

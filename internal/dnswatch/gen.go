// Package dnswatch names the remote ends of flows after the DNS answers
// their namespace received, and counts every client's lookups per
// resolver. It loads bpf/dns.bpf.c (from 6.3 programs the tracer's send
// and receive programs hand DNS clients' calls to; before, cgroup_skb
// programs at the cgroup v2 root that see every packet), which copy DNS
// messages into a ring buffer, and parses them in user space with
// golang.org/x/net/dns/dnsmessage.
package dnswatch

// The generated dns_x86_bpfel.go/.o (amd64) and dns_arm64_bpfel.go/.o
// (arm64) are committed, as internal/bundler's are; `make generate`
// rebuilds them and `make check-generate` compares them.
//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target amd64,arm64 -type dns_event -type dns_stat -type dns_dir -type dns_variant dns ../../bpf/dns.bpf.c -- -I../../bpf -I../../bpf/include

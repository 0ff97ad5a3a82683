// Feature probes for scripts/kernel-matrix/probes: each program counts its
// runs in hits[N]; main.go loads and attaches every program on its own and
// reports which load, attach and fire on the running kernel.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} last SEC(".maps");

// tcp_sock counters seen by the probes (sum, to prove the reads work).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} vals SEC(".maps");

static __always_inline void hit(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&hits, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline void tcpvals(struct tcp_sock *tp)
{
	__u32 i = 0;
	__u64 *v;
	v = bpf_map_lookup_elem(&vals, &i); if (v) *v += BPF_CORE_READ(tp, bytes_received);
	i = 1; v = bpf_map_lookup_elem(&vals, &i); if (v) *v += BPF_CORE_READ(tp, bytes_acked);
	i = 2; v = bpf_map_lookup_elem(&vals, &i); if (v) *v += BPF_CORE_READ(tp, bytes_sent);
	i = 3; v = bpf_map_lookup_elem(&vals, &i); if (v) *v += BPF_CORE_READ(tp, total_retrans);
	i = 4; v = bpf_map_lookup_elem(&vals, &i); if (v) *v += BPF_CORE_READ(tp, srtt_us);
}

SEC("kprobe/tcp_sendmsg")
int kprobe_tcp_sendmsg(struct pt_regs *ctx) { hit(0); return 0; }

SEC("kretprobe/tcp_recvmsg")
int kretprobe_tcp_recvmsg(struct pt_regs *ctx) { hit(1); return 0; }

SEC("fentry/tcp_sendmsg")
int BPF_PROG(fentry_tcp_sendmsg, struct sock *sk, struct msghdr *msg, size_t size) { hit(2); return 0; }

SEC("fexit/tcp_recvmsg")
int BPF_PROG(fexit_tcp_recvmsg, struct sock *sk) { hit(3); return 0; }

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(tp_set_state, const struct sock *sk, int oldstate, int newstate)
{
	hit(4);
	if (newstate == 7 /* TCP_CLOSE */ && sk->sk_protocol == IPPROTO_TCP) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
		if (tp)
			tcpvals(tp);
	}
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tp_retransmit_skb, const struct sock *sk) { hit(5); return 0; }

SEC("tp_btf/tcp_send_reset")
int BPF_PROG(tp_send_reset, const struct sock *sk) { hit(6); return 0; }

SEC("tp_btf/tcp_receive_reset")
int BPF_PROG(tp_receive_reset, struct sock *sk) { hit(7); return 0; }

SEC("iter/tcp")
int iter_tcp_storage(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;
	__u64 *v;

	if (!skc)
		return 0;
	hit(8);
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	hit(16);
	v = bpf_sk_storage_get(&last, tp, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (v) {
		*v = tp->bytes_received;
		hit(15);
	}
	return 0;
}

SEC("iter/unix")
int iter_unix(struct bpf_iter__unix *ctx) { if (ctx->unix_sk) hit(9); return 0; }

SEC("cgroup/connect_unix")
int cg_connect_unix(struct bpf_sock_addr *ctx) { hit(10); return 1; }

SEC("tp_btf/sock_send_length")
int BPF_PROG(tp_sock_send_length, struct sock *sk, int ret, int flags) { hit(11); return 0; }

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(kfunc_rdonly_cast, const struct sock *sk, int oldstate, int newstate)
{
	struct tcp_sock *tp = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct tcp_sock));
	if (tp->bytes_received >= 0)
		hit(12);
	return 0;
}

SEC("lsm/socket_connect")
int BPF_PROG(lsm_socket_connect, struct socket *sock, struct sockaddr *address, int addrlen) { hit(13); return 0; }

SEC("fentry/unix_stream_connect")
int BPF_PROG(fentry_unix_stream_connect, struct socket *sock) { hit(14); return 0; }

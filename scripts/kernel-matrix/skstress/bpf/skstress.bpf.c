// Stress for the socket-storage map iterator (scripts/kernel-matrix/skstress):
// every new socket gets storage in `st` (cgroup/sock_create), and two
// iterators walk `st` while user space creates and closes sockets.
// `walk_empty` does nothing with the element (any sk_storage iterator);
// `walk_get` calls bpf_sk_storage_get on the socket it visits, as deptrace's
// harvest does. With -delete, `tcp_closed` and `udp_release` delete a
// socket's element before the socket can be freed (at TCP_CLOSE; at
// inet_release for UDP), so that the kernel's destroy path never unlinks an
// element the iterator may be visiting.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} st SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("cgroup/sock_create")
int tag(struct bpf_sock *ctx)
{
	__u64 *v = bpf_sk_storage_get(&st, ctx, 0, BPF_SK_STORAGE_GET_F_CREATE);
	count(v ? 0 : 1);
	return 1;
}

SEC("iter/bpf_sk_storage_map")
int walk_empty(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	if (ctx->sk)
		count(2);
	return 0;
}

SEC("iter/bpf_sk_storage_map")
int walk_get(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct sock *sk = ctx->sk;
	if (!sk || !ctx->value)
		return 0;
	if (bpf_sk_storage_get(&st, sk, 0, 0))
		count(3);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(tcp_closed, struct sock *sk, const int oldstate, const int newstate)
{
	if (newstate == TCP_CLOSE && oldstate != TCP_CLOSE)
		count(bpf_sk_storage_delete(&st, sk) == 0 ? 4 : 5);
	return 0;
}

SEC("fentry/inet_release")
int BPF_PROG(udp_release, struct socket *sock)
{
	struct sock *sk = sock->sk;
	if (sk && sk->sk_protocol == IPPROTO_UDP)
		count(bpf_sk_storage_delete(&st, sk) == 0 ? 4 : 5);
	return 0;
}

/* The socket iterators, for comparison: they walk the current namespace's
 * TCP and UDP tables (holding each socket) and look the element up. */
SEC("iter/tcp")
int walk_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	if (!skc)
		return 0;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (tp && bpf_sk_storage_get(&st, tp, 0, 0))
		count(3);
	return 0;
}

SEC("iter/udp")
int walk_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *udp = ctx->udp_sk;
	if (udp && bpf_sk_storage_get(&st, udp, 0, 0))
		count(3);
	return 0;
}

/* -prog misses: counts unix stream sends (process context only) and does a
 * little work per run; user space reads the kernel's recursion-miss count
 * of this program. Needs sock_send_length (6.3+). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} in_send SEC(".maps");

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send, struct sock *sk, int ret, int flags)
{
	if (sk->__sk_common.skc_family != 1 /* AF_UNIX */)
		return 0;
	__u32 z = 0;
	__u32 *busy = bpf_map_lookup_elem(&in_send, &z);
	if (busy)
		*busy = 1;
	count(6);
	for (int i = 0; i < 64; i++)
		count(7);
	if (busy)
		*busy = 0;
	return 0;
}

/* -prog misses2: a second copy, attached after on_send, that does the work
 * only when on_send is in the middle of a run on this CPU, i.e. when the
 * kernel skipped on_send for this event because a preempted (or
 * interrupted) run of it holds the CPU's recursion counter. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send_backup, struct sock *sk, int ret, int flags)
{
	if (sk->__sk_common.skc_family != 1 /* AF_UNIX */)
		return 0;
	__u32 z = 0;
	__u32 *busy = bpf_map_lookup_elem(&in_send, &z);
	if (!busy || !*busy)
		return 0;
	count(8);
	for (int i = 0; i < 64; i++)
		count(9);
	return 0;
}

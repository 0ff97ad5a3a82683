/* sock.bpf.h: socket helpers shared by deptrace's bundler and the
 * benchmark's per-call object (bench/bpf/perevent.bpf.c): the constants the
 * kernel headers would give, statistics, the namespace filter and a flow
 * key's addresses. The including file declares, before it, the stats map
 * (a per-CPU array indexed by enum stat_index) and target_netns. */
#ifndef SOCK_BPF_H
#define SOCK_BPF_H

/* clang-format off */
#define barrier() asm volatile("" ::: "memory")
/* clang-format on */

#define AF_UNIX 1
#define AF_INET 2
#define SOCK_DGRAM 2
#define AF_INET6 10
#define MSG_PEEK 2
#define MSG_ERRQUEUE 0x2000
#define SOCK_BINDPORT_LOCK 8
#define EPERM 1
#define ENOENT 2
#define EINTR 4
#define EAGAIN 11
#define EACCES 13
#define EEXIST 17
#define EPROTOTYPE 91
#define EINPROGRESS 115
#define SOCK_STREAM 1
#define SOCK_SEQPACKET 5
#define E2BIG 7
#define ENETUNREACH 101
#define ECONNRESET 104
#define ETIMEDOUT 110
#define ECONNREFUSED 111
#define EHOSTUNREACH 113

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&stats, &idx);
	if (c)
		__sync_fetch_and_add(c, 1);
}

static __always_inline __u32 sk_netns(const struct sock *sk)
{
	return sk->__sk_common.skc_net.net->ns.inum;
}

static __always_inline bool netns_wanted(__u32 netns)
{
	return target_netns == 0 || target_netns == netns;
}

static __always_inline void set_v4mapped(__u8 *dst, __u32 addr)
{
	__u32 *d = (__u32 *)dst;
	d[0] = 0;
	d[1] = 0;
	d[2] = bpf_htonl(0xffff);
	d[3] = addr;
}

static __always_inline bool is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline void copy16(__u8 *dst, const __u32 *src)
{
	__u32 *d = (__u32 *)dst;
	d[0] = src[0];
	d[1] = src[1];
	d[2] = src[2];
	d[3] = src[3];
}

/* Fill local and remote addresses, IPv4 as v4-mapped IPv6. A dual-stack
 * IPv6 socket talking IPv4 keeps its addresses in the IPv4 fields too
 * (the IPv6 copies are filled late during connect), so read those. */
static __always_inline void fill_addrs(const struct sock *sk, __u16 family, struct flow_key *k)
{
	if (family == AF_INET6) {
		__u32 daddr[4], saddr[4];
		daddr[0] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0];
		daddr[1] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1];
		daddr[2] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2];
		daddr[3] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
		if (!is_v4mapped(daddr)) {
			saddr[0] = sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[0];
			saddr[1] = sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[1];
			saddr[2] = sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[2];
			saddr[3] = sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[3];
			copy16(k->local_addr, saddr);
			copy16(k->remote_addr, daddr);
			return;
		}
	}
	set_v4mapped(k->local_addr, sk->__sk_common.skc_rcv_saddr);
	set_v4mapped(k->remote_addr, sk->__sk_common.skc_daddr);
}

#endif /* SOCK_BPF_H */

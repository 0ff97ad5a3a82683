//go:build ignore
/* deptrace's DNS capture: cgroup_skb programs at the cgroup v2 root that
 * copy DNS packets (UDP and TCP, port 53) into a ring buffer for
 * internal/dnswatch, which parses them in user space.
 *
 * Every packet of every socket runs these programs, so the test that
 * leaves for non-DNS traffic comes first and reads only what it must: on
 * egress the socket's remote port (a connected client's resolver as it
 * addressed it, before any NAT rule rewrote the packet: Docker's
 * 127.0.0.11:53 goes to another port), then the packet's destination
 * port; on ingress the packet's source port (replies through such a NAT
 * rule have had their source translated back to :53 by then). A DNS
 * packet is copied with its socket's cookie, cgroup, namespace and, on
 * egress (which runs in the sending process), the process. The programs
 * come in three variants (at the end) by what the kernel lets them call.
 *
 * A query sent with sendto() from an unconnected socket to an address a
 * NAT rule redirects (musl's resolver behind Docker's embedded DNS) has
 * lost its port 53 by egress: the cgroup sendmsg hooks note such sends
 * (dns_dests). IPv6 extension headers before the transport header are
 * not walked.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "dns.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

const struct dns_event *_btf_dns_event __attribute__((unused));
const enum dns_stat *_btf_dns_stat __attribute__((unused));
const enum dns_dir *_btf_dns_dir __attribute__((unused));
const enum dns_variant *_btf_dns_variant __attribute__((unused));

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define DNS_PORT 53
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04

extern void *bpf_cast_to_kern_ctx(void *) __ksym;

_Static_assert((DNS_MAX_PAYLOAD & (DNS_MAX_PAYLOAD - 1)) == 0, "DNS_MAX_PAYLOAD must be a power of 2");

#define DNS_RING_BYTES (4 << 20)
#define DNS_WAKE_BYTES (DNS_RING_BYTES / 4)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, DNS_RING_BYTES);
} dns_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dns_event);
} dns_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DNS_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} dns_stats SEC(".maps");

static __always_inline void dns_stat_inc(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&dns_stats, &idx);
	if (c)
		*c += 1; /* per-CPU: no other writer */
}

/* l4 finds the transport header: its protocol and offset from the network
 * header; false for anything but UDP and TCP. */
static __always_inline bool l4(struct __sk_buff *ctx, __u8 *proto, __u32 *off, __u8 *family)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (ctx->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data;
		if ((void *)(ip + 1) > end)
			return false;
		*proto = ip->protocol;
		*off = ip->ihl * 4;
		*family = 4;
	} else if (ctx->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data;
		if ((void *)(ip6 + 1) > end)
			return false;
		*proto = ip6->nexthdr;
		*off = sizeof(*ip6);
		*family = 6;
	} else {
		return false;
	}
	return *proto == IPPROTO_UDP || *proto == IPPROTO_TCP;
}

/* sk_netns reads the namespace of the packet's socket without
 * bpf_cast_to_kern_ctx (6.2 and later): ctx->sk points at the socket's
 * struct sock_common, but the verifier forbids arithmetic on it. Copying
 * the pointer's value through bpf_probe_read_kernel makes it a plain
 * number (allowed to a loader with CAP_PERFMON, which may read kernel
 * memory anyway), which BPF_CORE_READ then follows. */
static __always_inline __u32 sk_netns(struct __sk_buff *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	__u64 addr = 0;
	if (bpf_probe_read_kernel(&addr, sizeof(addr), &sk) || !addr)
		return 0;
	struct sock_common *skc = (void *)addr;
	return BPF_CORE_READ(skc, skc_net.net, ns.inum);
}

/* The resolver of a datagram sent with sendto() to port 53 from an
 * unconnected socket, for the egress program of the same datagram: that
 * one sees the packet after NAT (musl's resolver sends to 127.0.0.11:53
 * this way, and Docker's rule changes the port), the socket-address hook
 * before it. */
struct dns_dest {
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
	__u32 pending; /* set by the hook, taken by the egress program */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct dns_dest);
} dns_dests SEC(".maps");

/* dest_slot returns where to note a sendto()'s resolver: a socket's
 * storage when the datagram goes to port 53, NULL (and any earlier note
 * forgotten) when it goes elsewhere. Only datagrams sent with an address
 * run this hook; a connected socket's remote port tells egress itself. */
static __always_inline struct dns_dest *dest_slot(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_UDP || !ctx->sk)
		return NULL;
	if (ctx->user_port != bpf_htons(DNS_PORT)) {
		struct dns_dest *d = bpf_sk_storage_get(&dns_dests, ctx->sk, 0, 0);
		if (d)
			d->pending = 0;
		return NULL;
	}
	struct dns_dest *d = bpf_sk_storage_get(&dns_dests, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (d)
		d->pending = 1;
	return d;
}

SEC("cgroup/sendmsg4")
int dns_sendmsg4(struct bpf_sock_addr *ctx)
{
	struct dns_dest *d = dest_slot(ctx);
	if (d) {
		__builtin_memset(d->addr, 0, sizeof(d->addr));
		*(__u32 *)d->addr = ctx->user_ip4;
	}
	return 1;
}

SEC("cgroup/sendmsg6")
int dns_sendmsg6(struct bpf_sock_addr *ctx)
{
	struct dns_dest *d = dest_slot(ctx);
	if (d) {
		__u32 *a = (__u32 *)d->addr;
		a[0] = ctx->user_ip6[0];
		a[1] = ctx->user_ip6[1];
		a[2] = ctx->user_ip6[2];
		a[3] = ctx->user_ip6[3];
	}
	return 1;
}

/* sent_to_dns returns the note of a datagram from an unconnected UDP
 * socket whose sendto() addressed port 53, taking it. */
static __always_inline struct dns_dest *sent_to_dns(struct __sk_buff *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return NULL;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return NULL;
	struct dns_dest *d = bpf_sk_storage_get(&dns_dests, sk, 0, 0);
	if (!d || !d->pending)
		return NULL;
	d->pending = 0;
	return d;
}

static __always_inline int capture(struct __sk_buff *ctx, __u8 dir, __u8 proto, __u32 off, __u8 family, int variant,
        const struct dns_dest *dest)
{
	__u32 zero = 0;
	struct dns_event *ev = bpf_map_lookup_elem(&dns_scratch, &zero);
	if (!ev)
		return 1;
	__u32 hdr = 8;
	ev->tcp_flags = 0;
	ev->tcp_seq = 0;
	if (proto == IPPROTO_TCP) {
		struct tcphdr th;
		if (bpf_skb_load_bytes(ctx, off, &th, sizeof(th)))
			return 1;
		hdr = th.doff * 4;
		ev->tcp_seq = bpf_ntohl(th.seq);
		ev->tcp_flags = ((__u8 *)&th)[13];
		if (hdr < sizeof(th))
			return 1;
	}
	__u32 poff = off + hdr;
	if (ctx->len < poff)
		return 1;
	__u32 plen = ctx->len - poff;
	if (proto == IPPROTO_TCP && plen == 0 && !(ev->tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST)))
		return 1; /* a pure ACK */
	__u32 n = plen;
	if (n > DNS_MAX_PAYLOAD) {
		n = DNS_MAX_PAYLOAD;
		dns_stat_inc(DNS_STAT_CUT);
	}
	ev->ts_ns = bpf_ktime_get_ns();
	ev->cgroup_id = bpf_skb_cgroup_id(ctx);
	ev->cookie = bpf_get_socket_cookie(ctx);
	ev->dir = dir;
	ev->proto = proto;
	ev->family = family;
	ev->payload_len = plen;
	ev->pid = 0;
	__builtin_memset(ev->comm, 0, sizeof(ev->comm));
	ev->netns = 0;
	if (variant == DNS_VARIANT_KCTX) {
		if (dir == DNS_EGRESS) {
			ev->pid = bpf_get_current_pid_tgid() >> 32;
			/* The process's name (its thread-group leader's),
			 * not the sending thread's. */
			struct task_struct *task = bpf_get_current_task_btf();
			bpf_probe_read_kernel_str(ev->comm, sizeof(ev->comm), task->group_leader->comm);
		}
		struct sk_buff *kskb = bpf_cast_to_kern_ctx(ctx);
		struct sock *sk = kskb->sk;
		if (sk)
			ev->netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	} else {
		if (variant == DNS_VARIANT_TASK && dir == DNS_EGRESS) {
			struct task_struct *task = (void *)bpf_get_current_task();
			ev->pid = BPF_CORE_READ(task, tgid);
			bpf_probe_read_kernel_str(ev->comm, sizeof(ev->comm), BPF_CORE_READ(task, group_leader, comm));
		}
		ev->netns = sk_netns(ctx);
	}
	__builtin_memset(ev->saddr, 0, sizeof(ev->saddr));
	__builtin_memset(ev->daddr, 0, sizeof(ev->daddr));
	__builtin_memset(ev->sk_raddr, 0, sizeof(ev->sk_raddr));
	if (family == 4) {
		bpf_skb_load_bytes(ctx, 12, ev->saddr, 4);
		bpf_skb_load_bytes(ctx, 16, ev->daddr, 4);
		*(__u32 *)ev->sk_raddr = ctx->remote_ip4;
	} else {
		bpf_skb_load_bytes(ctx, 8, ev->saddr, 16);
		bpf_skb_load_bytes(ctx, 24, ev->daddr, 16);
		__u32 *r = (__u32 *)ev->sk_raddr;
		r[0] = ctx->remote_ip6[0];
		r[1] = ctx->remote_ip6[1];
		r[2] = ctx->remote_ip6[2];
		r[3] = ctx->remote_ip6[3];
	}
	ev->sk_rport = bpf_ntohs(ctx->remote_port >> 16);
	if (dest) {
		/* sendto() named the resolver before NAT: the socket's "remote
		 * end" for this datagram. */
		__builtin_memcpy(ev->sk_raddr, dest->addr, sizeof(ev->sk_raddr));
		ev->sk_rport = DNS_PORT;
	}
	__u16 ports[2];
	if (bpf_skb_load_bytes(ctx, off, ports, sizeof(ports)))
		return 1;
	ev->sport = bpf_ntohs(ports[0]);
	ev->dport = bpf_ntohs(ports[1]);
	/* n is 0 to DNS_MAX_PAYLOAD; the copy's size must be proven 1 to
	 * DNS_MAX_PAYLOAD to the verifier, and 6.1's loses a bound the
	 * compiler's code keeps on another register: the mask, hidden from
	 * the compiler, gives it one on the register passed. */
	__u64 m = n;
	if (m > 0) {
		m -= 1;
		asm volatile("%0 &= %1"
		             : "+r"(m)
		             : "i"(DNS_MAX_PAYLOAD - 1));
		m += 1;
		if (bpf_skb_load_bytes(ctx, poff, ev->payload, m))
			m = 0;
	}
	ev->cap_len = m;
	/* The reader is woken only once a quarter of the ring waits: it
	 * reads otherwise when each interval flushes the ring
	 * (internal/dnswatch). A wakeup per record costs the machine tens of
	 * microseconds, most of a lookup's cost. */
	__u64 wake = bpf_ringbuf_query(&dns_events, BPF_RB_AVAIL_DATA) >= DNS_WAKE_BYTES ? BPF_RB_FORCE_WAKEUP
	                                                                                 : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&dns_events, ev, offsetof(struct dns_event, payload) + m, wake))
		dns_stat_inc(DNS_STAT_RINGBUF_FULL);
	else
		dns_stat_inc(DNS_STAT_EVENTS);
	return 1;
}

/* ports reads the transport header's two ports (network order). */
static __always_inline bool ports(struct __sk_buff *ctx, __u32 off, __u16 *sport, __u16 *dport)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (off > 60)
		return false;
	__u16 *p = data + off;
	if ((void *)(p + 2) > end)
		return false;
	*sport = p[0];
	*dport = p[1];
	return true;
}

static __always_inline int egress(struct __sk_buff *ctx, int variant)
{
	__u8 proto, family;
	__u32 off;
	/* A connected socket's remote port: no packet read. */
	bool connected_dns = ctx->remote_port == (__u32)bpf_htons(DNS_PORT) << 16;
	if (!l4(ctx, &proto, &off, &family))
		return 1;
	if (connected_dns)
		return capture(ctx, DNS_EGRESS, proto, off, family, variant, NULL);
	__u16 sport, dport;
	if (!ports(ctx, off, &sport, &dport))
		return 1;
	if (dport == bpf_htons(DNS_PORT))
		return capture(ctx, DNS_EGRESS, proto, off, family, variant, NULL);
	/* An unconnected UDP socket's datagram whose port a NAT rule changed:
	 * only these pay the storage lookup. */
	if (proto != IPPROTO_UDP || ctx->remote_port)
		return 1;
	struct dns_dest *dest = sent_to_dns(ctx);
	if (!dest)
		return 1;
	return capture(ctx, DNS_EGRESS, proto, off, family, variant, dest);
}

static __always_inline int ingress(struct __sk_buff *ctx, int variant)
{
	__u8 proto, family;
	__u32 off;
	if (!l4(ctx, &proto, &off, &family))
		return 1;
	__u16 sport, dport;
	if (!ports(ctx, off, &sport, &dport) || sport != bpf_htons(DNS_PORT))
		return 1;
	return capture(ctx, DNS_INGRESS, proto, off, family, variant, NULL);
}

/* Three variants of the pair, the first that loads is attached (see
 * internal/dnswatch): the names they give are the same. */

/* 6.2 and later: the socket through bpf_cast_to_kern_ctx, the process
 * through bpf_get_current_pid_tgid. */
SEC("cgroup_skb/egress")
int dns_egress(struct __sk_buff *ctx)
{
	return egress(ctx, DNS_VARIANT_KCTX);
}

SEC("cgroup_skb/ingress")
int dns_ingress(struct __sk_buff *ctx)
{
	return ingress(ctx, DNS_VARIANT_KCTX);
}

/* Kernels whose cgroup_skb refuses both (6.1): the socket through
 * sk_netns, the process through bpf_get_current_task. */
SEC("cgroup_skb/egress")
int dns_egress_task(struct __sk_buff *ctx)
{
	return egress(ctx, DNS_VARIANT_TASK);
}

SEC("cgroup_skb/ingress")
int dns_ingress_task(struct __sk_buff *ctx)
{
	return ingress(ctx, DNS_VARIANT_TASK);
}

/* Kernels that refuse bpf_get_current_task too: no process (pid 0). */
SEC("cgroup_skb/egress")
int dns_egress_bare(struct __sk_buff *ctx)
{
	return egress(ctx, DNS_VARIANT_BARE);
}

SEC("cgroup_skb/ingress")
int dns_ingress_bare(struct __sk_buff *ctx)
{
	return ingress(ctx, DNS_VARIANT_BARE);
}

//go:build ignore
/* deptrace's DNS capture, in two ways that internal/dnswatch parses alike:
 *
 * Per call (6.3 and later; what trace and agent load there): tp_btf
 * programs for sock_send_length and sock_recv_length, which the tracer's
 * own programs on those tracepoints tail-call (bpf/bundler.bpf.c,
 * dns_hand_off) for a socket connected to port 53 or an unconnected UDP
 * socket whose last sendto() went to port 53; without a tracer, attached
 * on their own, they run once per send or receive call on any socket.
 * The test that leaves for non-DNS sockets comes first: the socket's
 * remote port (53: a connected resolver socket), or for an unconnected
 * UDP socket the note the sendmsg hooks left when it sent to port 53. A
 * DNS call's payload is read where the system call left it, in the
 * caller's memory: the call's registers
 * (bpf_task_pt_regs) give its buffer, iovec array, msghdr or mmsghdr
 * array. A call made another way (io_uring, splice) is counted
 * unreadable. Calls, not packets: a non-DNS connection pays the tracer's
 * port test per call instead of a cgroup_skb dispatch per packet at each
 * end (attached on their own, as a second program on tracepoints the
 * tracer's programs already use, the kernel's dispatch to them costs more
 * than the test saves on persistent TCP and UDP: docs/performance.md,
 * "DNS watching").
 *
 * Per packet (before 6.3): cgroup_skb programs at the cgroup v2 root
 * that copy DNS packets (UDP and TCP, port 53). Every packet of every
 * socket runs them, so the test that leaves for non-DNS traffic comes
 * first and reads only what it must: on egress the socket's remote port
 * (a connected client's resolver as it addressed it, before any NAT rule
 * rewrote the packet: Docker's 127.0.0.11:53 goes to another port), then
 * the packet's destination port; on ingress the packet's source port
 * (replies through such a NAT rule have had their source translated back
 * to :53 by then). A DNS packet is copied with its socket's cookie,
 * cgroup, namespace and, on egress (which runs in the sending process),
 * the process. These programs come in three variants (at the end) by
 * what the kernel lets them call.
 *
 * A query sent with sendto() from an unconnected socket to an address a
 * NAT rule redirects (musl's resolver behind Docker's embedded DNS) has
 * lost its port 53 by egress: the cgroup sendmsg hooks note such sends
 * (dns_dests, bpf/dnsnote.bpf.h), for both ways: the tracer's
 * (bpf/udp.bpf.h) when the watcher runs with a tracer, else the two
 * below. IPv6 extension headers before the transport header are not
 * walked.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
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

/* The resolver notes (dns_dests, struct dns_dest). With a tracer whose
 * sendmsg programs run, every variant is loaded with the tracer's map in
 * its place, which those programs write (bpf/udp.bpf.h, note_dns), and
 * the two below are not loaded. Only datagrams sent with an address run
 * these hooks; a connected socket's remote port tells the others itself. */
#include "dnsnote.bpf.h"

SEC("cgroup/sendmsg4")
int dns_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol == IPPROTO_UDP && ctx->sk)
		dns_note(ctx, false, true);
	return 1;
}

SEC("cgroup/sendmsg6")
int dns_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol == IPPROTO_UDP && ctx->sk)
		dns_note(ctx, true, true);
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

/* copy_bound returns m (1 to DNS_MAX_PAYLOAD) in a form the verifier can
 * prove is so: 6.1's loses a bound the compiler's code keeps on another
 * register; the mask, hidden from the compiler, gives the register passed
 * to the copy one. */
static __always_inline __u64 copy_bound(__u64 m)
{
	m -= 1;
	asm volatile("%0 &= %1"
	             : "+r"(m)
	             : "i"(DNS_MAX_PAYLOAD - 1));
	return m + 1;
}

/* hand_over writes ev with its first m payload bytes to the ring buffer.
 * The reader is woken only once a quarter of the ring waits: it reads
 * otherwise when each interval flushes the ring (internal/dnswatch). A
 * wakeup per record costs the machine tens of microseconds, most of a
 * lookup's cost. */
static __always_inline void hand_over(struct dns_event *ev, __u64 m)
{
	ev->cap_len = m;
	__u64 wake = bpf_ringbuf_query(&dns_events, BPF_RB_AVAIL_DATA) >= DNS_WAKE_BYTES ? BPF_RB_FORCE_WAKEUP
	                                                                                 : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&dns_events, ev, offsetof(struct dns_event, payload) + m, wake))
		dns_stat_inc(DNS_STAT_RINGBUF_FULL);
	else
		dns_stat_inc(DNS_STAT_EVENTS);
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
	/* n is 0 to DNS_MAX_PAYLOAD; the copy's size must be 1 or more */
	__u64 m = n;
	if (m > 0) {
		m = copy_bound(m);
		if (bpf_skb_load_bytes(ctx, poff, ev->payload, m))
			m = 0;
	}
	hand_over(ev, m);
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

/* ---- Per call (6.3 and later) ---- */

#define AF_INET 2
#define AF_INET6 10
#define MSG_PEEK 0x2
#define MSG_ERRQUEUE 0x2000

/* The system calls that reach sock_sendmsg or sock_recvmsg with a buffer
 * of the caller's: x86-64's numbers, or arm64's (the generic table). A
 * 32-bit task's calls have numbers of their own, none of which is one of
 * these for a call that can reach a socket: its payload is not read
 * (counted unreadable), never misread. */
#if defined(__TARGET_ARCH_arm64)
#define NR_read 63
#define NR_write 64
#define NR_readv 65
#define NR_writev 66
#define NR_sendto 206
#define NR_recvfrom 207
#define NR_sendmsg 211
#define NR_recvmsg 212
#define NR_recvmmsg 243
#define NR_sendmmsg 269
/* The part of arm64's struct pt_regs read here (vmlinux.h is x86-64's;
 * CO-RE finds the fields in the running kernel's BTF, regs[] inside its
 * anonymous union). */
struct pt_regs___dns_arm64 {
	__u64 regs[31];
	__u64 orig_x0;
	__s32 syscallno;
} __attribute__((preserve_access_index));
#else
#define NR_read 0
#define NR_write 1
#define NR_readv 19
#define NR_writev 20
#define NR_sendto 44
#define NR_recvfrom 45
#define NR_sendmsg 46
#define NR_recvmsg 47
#define NR_recvmmsg 299
#define NR_sendmmsg 307
#endif

/* The user-space layouts read from the caller's memory (LP64: the same on
 * x86-64 and arm64). */
struct user_iov {
	__u64 base;
	__u64 len;
};

struct user_msg {
	__u64 name;
	__u32 namelen;
	__u32 _pad;
	__u64 iov;
	__u64 iovlen;
	__u64 control;
	__u64 controllen;
	__u32 flags;
	__u32 _pad2;
};

#define USER_MMSG_SIZE 64 /* struct mmsghdr: a msghdr and its msg_len */
_Static_assert(sizeof(struct user_msg) == 56, "struct user_msghdr is 56 bytes on LP64");

/* Buffers of one call copied at most: glibc writes a TCP query as two
 * (its length, then the message); a call with more is cut. */
#define CALL_IOVS 4

/* Where a thread's sendmmsg() or recvmmsg() is: the tracepoints run once
 * per message and say nothing of which, so the thread counts them (on
 * DNS sockets only). A call's messages run in order, and one that fails
 * ends the call. A count can still go wrong: an unconnected socket's
 * sendmmsg() to port 53 and other ports at once, a message that fails
 * before the socket sees it, recvmmsg()'s timeout between messages; the
 * next call on the same array then reads another slot. A datagram sent
 * is checked against its slot's length (a mismatch is counted
 * unreadable; glibc's A and AAAA queries have one length, and a swap of
 * the two loses neither); a stale slot of a receive can hold an older
 * answer, read again (counted as an answer whose query was not seen). */
struct dns_mcall {
	__u64 vec;  /* the mmsghdr array */
	__u32 next; /* index of the message the next hit is */
	__u32 vlen;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct dns_mcall);
} dns_mcalls SEC(".maps");

/* A per-CPU record to build in: the tracepoints run in process context,
 * where a preemptible kernel may switch to another task on this CPU
 * mid-record; busy (taken with a compare-and-swap) keeps the second one
 * out, counted (DNS_STAT_BUSY). */
struct call_scratch {
	__u64 busy;
	struct dns_event ev;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct call_scratch);
} dns_call_scratch SEC(".maps");

/* dns_socket says whether a call on sk is a DNS client's: a TCP or UDP
 * socket connected to port 53, or an unconnected UDP socket whose last
 * sendto() went to port 53 (*dest: the resolver it named). Attached on
 * their own, every call on every socket pays it, so cheapest first;
 * tail-called by the tracer, only calls that passed its own test
 * (udp_datagram's answer) do. */
static __always_inline bool dns_socket(struct sock *sk, bool send, struct dns_dest **dest)
{
	__u16 dport = sk->__sk_common.skc_dport;
	if (dport && dport != bpf_htons(DNS_PORT))
		return false;
	__u16 family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return false;
	__u16 proto = sk->sk_protocol;
	if (dport)
		return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
	if (proto != IPPROTO_UDP || !sk->sk_bpf_storage)
		return false;
	struct dns_dest *d = bpf_sk_storage_get(&dns_dests, sk, 0, 0);
	if (!d)
		return false;
	if (send) {
		/* The sendmsg hook ran for this datagram just before. */
		if (!d->pending)
			return false;
		d->pending = 0;
		d->asked = 1;
	} else if (!d->asked) {
		return false;
	}
	*dest = d;
	return true;
}

/* The call's number and its first three arguments, from the registers
 * the system call was entered with. */
static __always_inline void call_regs(struct task_struct *t, __u64 *nr, __u64 *a0, __u64 *a1, __u64 *a2)
{
#if defined(__TARGET_ARCH_arm64)
	struct pt_regs___dns_arm64 *regs = (struct pt_regs___dns_arm64 *)bpf_task_pt_regs(t);
	*nr = (__u64)(__s64)BPF_CORE_READ(regs, syscallno);
	*a0 = BPF_CORE_READ(regs, orig_x0); /* x0 may hold a return value */
	*a1 = BPF_CORE_READ(regs, regs[1]);
	*a2 = BPF_CORE_READ(regs, regs[2]);
#else
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	*nr = BPF_CORE_READ(regs, orig_ax);
	*a0 = BPF_CORE_READ(regs, di);
	*a1 = BPF_CORE_READ(regs, si);
	*a2 = BPF_CORE_READ(regs, dx);
#endif
}

/* fd_is reports whether the task's descriptor fd is sk's socket: the
 * registers are this call's only if the call's descriptor is (io_uring
 * runs a retried send or receive in task work, on the task's way back
 * from whatever system call it was in). */
static __always_inline bool fd_is(struct task_struct *t, __u64 fd, struct sock *sk)
{
	struct fdtable *fdt = BPF_CORE_READ(t, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return false;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return false;
	struct socket *so = BPF_CORE_READ(f, private_data);
	return so && BPF_CORE_READ(so, sk) == sk;
}

/* mmsg_slot returns the msghdr of the message this hit of a sendmmsg()
 * or recvmmsg() on vec is (0 when the thread's count cannot be kept). */
static __always_inline __u64 mmsg_slot(__u64 nr, __u64 vec, __u64 vlen, int ret)
{
	struct dns_mcall *m = bpf_task_storage_get(&dns_mcalls, bpf_get_current_task_btf(), 0,
	        BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!m)
		return 0;
	vlen = (__u32)vlen; /* an unsigned int argument */
	if (nr == NR_sendmmsg && vlen > 1024)
		vlen = 1024; /* UIO_MAXIOV: sendmmsg() sends no more */
	if (m->vec != vec || m->vlen != (__u32)vlen || m->next >= m->vlen) {
		m->vec = vec;
		m->vlen = vlen;
		m->next = 0;
	}
	__u32 i = m->next++;
	if (ret < 0)
		m->vec = 0; /* a failed message ends the call */
	return vec + (__u64)(i & 1023) * USER_MMSG_SIZE;
}

#define PF_IO_WORKER 0x00000010
#define PF_KTHREAD 0x00200000

/* call_buffers finds the call's buffers on sk: one (*one) or an iovec
 * array in the caller's memory (*iov, *cnt). False for a call made
 * otherwise: a kernel thread's or an io_uring worker's (registers that
 * are not the call's: zeroed, or copied from the task that made the
 * worker), a system call not listed above, or registers of a call on
 * another descriptor (io_uring's task work). */
static __always_inline bool call_buffers(struct sock *sk, int ret, struct user_iov *one, __u64 *iov, __u64 *cnt)
{
	struct task_struct *t = bpf_get_current_task_btf();
	if (t->flags & (PF_KTHREAD | PF_IO_WORKER))
		return false;
	__u64 nr, a0, a1, a2;
	call_regs(t, &nr, &a0, &a1, &a2);
	switch (nr) {
	case NR_read:
	case NR_write:
	case NR_sendto:
	case NR_recvfrom:
	case NR_readv:
	case NR_writev:
	case NR_sendmsg:
	case NR_recvmsg:
	case NR_sendmmsg:
	case NR_recvmmsg:
		if (!fd_is(t, a0, sk)) /* every one of them takes the descriptor first */
			return false;
		break;
	default:
		return false;
	}
	__u64 msg;
	switch (nr) {
	case NR_read:
	case NR_write:
	case NR_sendto:
	case NR_recvfrom:
		one->base = a1;
		one->len = a2;
		*iov = 0;
		*cnt = 1;
		return true;
	case NR_readv:
	case NR_writev:
		*iov = a1;
		*cnt = a2;
		return true;
	case NR_sendmsg:
	case NR_recvmsg:
		msg = a1;
		break;
	case NR_sendmmsg:
	case NR_recvmmsg:
		msg = mmsg_slot(nr, a1, a2, ret);
		if (!msg)
			return false;
		break;
	default:
		return false;
	}
	if (ret <= 0)
		return false; /* nothing to read (the count above moved on) */
	struct user_msg h;
	if (bpf_probe_read_user(&h, sizeof(h), (const void *)msg))
		return false;
	*iov = h.iov;
	*cnt = h.iovlen;
	return true;
}

/* sock_addrs fills the record's addresses from the socket: the local end
 * and the remote one (dest's resolver for an unconnected socket), source
 * and destination as a packet of this direction would carry them. */
static __always_inline void sock_addrs(struct sock *sk, struct dns_event *ev, bool send, const struct dns_dest *dest)
{
	__u8 *local = send ? ev->saddr : ev->daddr;
	__u8 *remote = send ? ev->daddr : ev->saddr;
	__builtin_memset(ev->saddr, 0, sizeof(ev->saddr));
	__builtin_memset(ev->daddr, 0, sizeof(ev->daddr));
	__u16 lport = sk->__sk_common.skc_num;
	__u16 rport = DNS_PORT;
	if (ev->family == 4) {
		*(__u32 *)local = sk->__sk_common.skc_rcv_saddr;
		*(__u32 *)remote = sk->__sk_common.skc_daddr;
	} else {
		BPF_CORE_READ_INTO(local, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(remote, sk, __sk_common.skc_v6_daddr);
	}
	if (dest && dest->family == 4 && ev->family == 6) {
		/* a v6 socket's sendto() to a v4-mapped address ran sendmsg4 */
		__builtin_memset(remote, 0, 10);
		remote[10] = 0xff;
		remote[11] = 0xff;
		__builtin_memcpy(remote + 12, dest->addr, 4);
	} else if (dest) {
		__builtin_memcpy(remote, dest->addr, sizeof(ev->saddr));
	}
	ev->sport = send ? lport : rport;
	ev->dport = send ? rport : lport;
	__builtin_memcpy(ev->sk_raddr, remote, sizeof(ev->sk_raddr));
	ev->sk_rport = DNS_PORT;
}

/* emit hands ev to the ring buffer with up to n bytes read from buf (0:
 * none) as the payload, at most DNS_MAX_PAYLOAD of them; len is the
 * payload's length in the call, which a shorter copy leaves cut. */
static __always_inline void emit(struct dns_event *ev, __u64 buf, __u32 n, __u32 len)
{
	ev->payload_len = len;
	__u64 m = buf ? n : 0;
	if (m > DNS_MAX_PAYLOAD)
		m = DNS_MAX_PAYLOAD;
	if (m < len)
		dns_stat_inc(DNS_STAT_CUT);
	if (m > 0) {
		m = copy_bound(m);
		if (bpf_probe_read_user(ev->payload, m, (const void *)buf))
			m = 0;
	}
	hand_over(ev, m);
}

static __always_inline void call(struct sock *sk, int ret, int flags, bool send)
{
	struct dns_dest *dest = NULL;
	if (!dns_socket(sk, send, &dest))
		return;
	struct user_iov one = {};
	__u64 iov = 0, cnt = 0;
	/* before the test of ret: an mmsg call's failed message counts */
	bool found = call_buffers(sk, ret, &one, &iov, &cnt);
	if (ret <= 0 || (!send && (flags & (MSG_PEEK | MSG_ERRQUEUE))))
		return;
	if (!found)
		dns_stat_inc(DNS_STAT_UNREADABLE);
	__u32 zero = 0;
	struct call_scratch *s = bpf_map_lookup_elem(&dns_call_scratch, &zero);
	if (!s)
		return;
	if (__sync_val_compare_and_swap(&s->busy, 0, 1) != 0) {
		dns_stat_inc(DNS_STAT_BUSY);
		return;
	}
	struct dns_event *ev = &s->ev;
	bool tcp = sk->sk_protocol == IPPROTO_TCP;
	ev->ts_ns = bpf_ktime_get_ns();
	struct cgroup *cg = BPF_CORE_READ(sk, sk_cgrp_data.cgroup);
	ev->cgroup_id = cg ? BPF_CORE_READ(cg, kn, id) : 1;
	ev->cookie = bpf_get_socket_cookie(sk);
	ev->netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	struct task_struct *task = bpf_get_current_task_btf();
	ev->pid = task->tgid;
	/* The process's name (its thread-group leader's), not the thread's. */
	bpf_probe_read_kernel_str(ev->comm, sizeof(ev->comm), task->group_leader->comm);
	ev->dir = send ? DNS_EGRESS : DNS_INGRESS;
	ev->proto = tcp ? IPPROTO_TCP : IPPROTO_UDP;
	ev->family = sk->__sk_common.skc_family == AF_INET ? 4 : 6;
	ev->tcp_flags = 0;
	ev->pad = 0;
	sock_addrs(sk, ev, send, dest);
	/* A TCP call's bytes end at the socket's sequence number now (the
	 * next byte to send or to read), so the stream is reassembled as
	 * packets' would be. */
	__u32 seq = 0;
	if (tcp) {
		struct tcp_sock *tp = (struct tcp_sock *)sk;
		seq = (send ? BPF_CORE_READ(tp, write_seq) : BPF_CORE_READ(tp, copied_seq)) - (__u32)ret;
	}
	ev->tcp_seq = seq;
	__u32 left = ret;
	if (!found) {
		emit(ev, 0, 0, left); /* counted unparsed in user space */
		goto out;
	}
	for (int i = 0; i < CALL_IOVS && left > 0; i++) {
		struct user_iov b = one;
		if (iov) {
			if (i >= cnt)
				break;
			if (bpf_probe_read_user(&b, sizeof(b), (const void *)(iov + i * sizeof(b))))
				break;
		} else if (i > 0) {
			break;
		}
		__u32 n = b.len < left ? b.len : left;
		if (n == 0)
			continue;
		if (!tcp) {
			/* A datagram is one message: what the first buffer holds
			 * of it (all of it, from every resolver seen). A datagram
			 * sent from one buffer is that buffer: another length
			 * means the buffer found is not the call's (a miscounted
			 * sendmmsg slot). */
			if (send && b.len != (__u32)ret && (!iov || cnt == 1)) {
				dns_stat_inc(DNS_STAT_UNREADABLE);
				emit(ev, 0, 0, ret);
			} else {
				emit(ev, b.base, n, ret);
			}
			goto out;
		}
		emit(ev, b.base, n, n);
		ev->tcp_seq += n;
		left -= n;
	}
	if (left > 0) {
		/* bytes in buffers not copied: a gap the stream notices */
		emit(ev, 0, 0, left);
	}
out:
	s->busy = 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(dns_send, struct sock *sk, int ret, int flags)
{
	call(sk, ret, flags, true);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(dns_recv, struct sock *sk, int ret, int flags)
{
	call(sk, ret, flags, false);
	return 0;
}

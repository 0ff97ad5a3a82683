//go:build ignore
/* deptrace's in-kernel flow bundler.
 *
 * Every TCP connect/accept and every TCP/UDP send/receive is added into one
 * bundled-flow entry keyed by {netns, local address, remote address, server
 * port, direction, protocol}: the client's ephemeral port is dropped, so the
 * number of entries follows the number of dependencies, not the connection
 * rate. User space swaps the active map every interval (see flows below) and
 * drains the idle one.
 *
 * Hooks (all stable interfaces; no kprobes):
 *   tp_btf/inet_sock_set_state  TCP opens, failures, listen/close
 *   tp_btf/sock_send_length     bytes sent, per call, every protocol
 *   tp_btf/sock_recv_length     bytes received, per call
 *   cgroup/sendmsg4|6, recvmsg4|6  peer address of unconnected UDP datagrams
 *   cgroup/bind4|6, post_bind4|6, sock_release  UDP bound-port table
 *   iter/tcp, iter/udp          seed the port table with existing sockets
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "perevent.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Referenced here so the shared types land in BTF for bpf2go. */
const struct flow_key *_btf_flow_key __attribute__((unused));
const struct stream_event *_btf_stream_event __attribute__((unused));
const struct flow_value *_btf_flow_value __attribute__((unused));
const struct port_key *_btf_port_key __attribute__((unused));
const struct port_value *_btf_port_value __attribute__((unused));
const struct listen_record *_btf_listen_record __attribute__((unused));
const enum stat_index *_btf_stat_index __attribute__((unused));

/* Set by the loader before load. 0 traces every network namespace. */
const volatile __u32 target_netns = 0;

/* MODE_BUNDLE for deptrace. The other modes exist only as the baselines of
 * deptrace bench compare: same hooks, same key, only the aggregation
 * differs. The verifier removes the branches of the other modes. */
const volatile __u8 mode = MODE_BUNDLE;
#define with_ports (mode != MODE_BUNDLE)

/* Stream mode's ring buffer; the loader gives it one page otherwise. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

/* The bundled-flow map template. Two maps of this shape exist; the outer
 * array holds the one programs write to. Swapping the slot from user space
 * waits for an RCU grace period (the kernel does this for map-in-map
 * updates), so once the swap returns no program still writes to the old map
 * and it can be drained with no race and no lost increment. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	/* clang-format off */
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__uint(max_entries, 65536);
		__type(key, struct flow_key);
		__type(value, struct flow_value);
	});
	/* clang-format on */
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct port_key);
	__type(value, struct port_value);
} ports SEC(".maps");

/* Listeners per protocol and port summed over every namespace: an inlined
 * array lookup that lets the common case (a client's ephemeral port that
 * nothing listens on anywhere) skip the hash lookup in ports. Index:
 * port, plus 65536 for UDP. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * 65536);
	__type(key, __u32);
	__type(value, __u32);
} listen_any SEC(".maps");

/* Per-socket state of UDP sockets, freed with the socket:
 * - bind: whether the socket was bound to a port the program chose, and
 *   whether it was counted in the port table (see UDP bound ports below);
 * - the peer of the datagram being sent or received on an unconnected
 *   socket, learnt by the cgroup sendmsg/recvmsg hook and consumed by the
 *   byte-count tracepoint of the same syscall. tid tells which thread's
 *   syscall it belongs to: two threads sending on one socket at once must
 *   not swap peers (a mismatch is counted as udp_peer_unknown). */
struct udp_state {
	__u32 bind;
	__u32 tid; /* thread whose syscall set peer; 0: none pending */
	__u8 peer[16];
	__u16 peer_port; /* network byte order */
	__u16 _pad;
	__u32 _pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct udp_state);
} udp_sock SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* bpf_rdonly_cast (Linux 6.2+) lets the cgroup socket programs read struct
 * sock fields that struct bpf_sock does not expose (sk_userlocks, netns). */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;
#define as_sock(ctx_sk) ((struct sock *)bpf_rdonly_cast((ctx_sk), bpf_core_type_id_kernel(struct sock)))

#include "sock.bpf.h"

static __always_inline void stream(const struct flow_key *k, __u8 kind, __u32 bytes)
{
	struct stream_event e = {.key = *k, .kind = kind, .bytes = bytes};
	/* Waking the reader per event costs a self-IPI (microseconds in a
	 * VM): wake it only once 64 KiB wait; it also polls every 50 ms. */
	__u64 flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > (64 << 10) ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&events, &e, sizeof(e), flags))
		stat_inc(STAT_STREAM_DROPPED);
}

static __always_inline __u32 *listen_any_slot(__u8 proto, __u16 port)
{
	__u32 idx = (proto == IPPROTO_UDP ? 65536 : 0) + (__u32)port;
	return bpf_map_lookup_elem(&listen_any, &idx);
}

static __always_inline struct port_value *port_lookup(__u32 netns, __u8 proto, __u16 port)
{
	struct port_key pk = {.netns = netns, .port = port, .proto = proto};
	return bpf_map_lookup_elem(&ports, &pk);
}

/* Record the current process in v when it changed: comm is read only then,
 * which keeps the helper call off the common path. */
static __always_inline void set_process(struct flow_value *v)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (v->pid != tgid) {
		v->pid = tgid;
		bpf_get_current_comm(v->comm, sizeof(v->comm));
		v->cgroup_id = bpf_get_current_cgroup_id();
	}
}

/* Find or create the bundled entry of k in the active map. A failed insert
 * (map full) is counted, never silent. */
static __always_inline struct flow_value *flow_entry(const struct flow_key *k)
{
	__u32 zero = 0;
	void *active = bpf_map_lookup_elem(&flows, &zero);
	if (!active)
		return NULL;
	struct flow_value *v = bpf_map_lookup_elem(active, k);
	if (!v) {
		struct flow_value init = {};
		long err = bpf_map_update_elem(active, k, &init, BPF_NOEXIST);
		if (err && err != -17 /* EEXIST: another CPU inserted it */) {
			stat_inc(STAT_FLOW_INSERT_FAILED);
			return NULL;
		}
		v = bpf_map_lookup_elem(active, k);
		if (!v) {
			stat_inc(STAT_FLOW_INSERT_FAILED);
			return NULL;
		}
	}
	/* Reading the clock costs about 50 ns on some VMs (rdtsc), more than
	 * the rest of the update: read it at most once per jiffy per flow and
	 * CPU. last_seen is then exact to one jiffy (1-10 ms). */
	__u64 j = bpf_jiffies64();
	if (v->last_jiffies != j) {
		__u64 now = bpf_ktime_get_boot_ns();
		v->last_jiffies = j;
		if (!v->first_seen_ns)
			v->first_seen_ns = now;
		v->last_seen_ns = now;
	}
	return v;
}

static __always_inline void port_ref(__u32 netns, __u8 proto, __u16 port, int delta, bool with_process)
{
	struct port_key pk = {.netns = netns, .port = port, .proto = proto};
	struct port_value *pv = bpf_map_lookup_elem(&ports, &pk);
	if (delta > 0) {
		if (!pv) {
			struct port_value init = {};
			long err = bpf_map_update_elem(&ports, &pk, &init, BPF_NOEXIST);
			if (err && err != -17) {
				stat_inc(STAT_PORT_INSERT_FAILED);
				return;
			}
			pv = bpf_map_lookup_elem(&ports, &pk);
			if (!pv)
				return;
		}
		__sync_fetch_and_add(&pv->refs, 1);
		__u32 *any = listen_any_slot(proto, port);
		if (any)
			__sync_fetch_and_add(any, 1);
		if (with_process) {
			pv->pid = bpf_get_current_pid_tgid() >> 32;
			pv->cgroup_id = bpf_get_current_cgroup_id();
			bpf_get_current_comm(pv->comm, sizeof(pv->comm));
		}
		return;
	}
	if (!pv)
		return;
	__u32 *any = listen_any_slot(proto, port);
	if (any && *any > 0)
		__sync_fetch_and_add(any, -1);
	/* The last socket on the port is gone: forget the port. */
	if (__sync_fetch_and_add(&pv->refs, -1) <= 1)
		bpf_map_delete_elem(&ports, &pk);
}

/* ---- TCP: opens, failures and listeners from socket state changes ---- */

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_tcp_state, const struct sock *sk, const int oldstate, const int newstate)
{
	/* Most transitions (FIN_WAIT, CLOSE_WAIT, TIME_WAIT...) are irrelevant:
	 * leave before touching the socket. */
	bool listen = newstate == TCP_LISTEN || (oldstate == TCP_LISTEN && newstate == TCP_CLOSE);
	bool active = oldstate == TCP_SYN_SENT || (oldstate == TCP_CLOSE && newstate == TCP_SYN_SENT);
	bool passive = oldstate == TCP_SYN_RECV && (newstate == TCP_ESTABLISHED || newstate == TCP_CLOSE);
	if (!listen && !active && !passive)
		return 0;
	if (sk->sk_protocol != IPPROTO_TCP)
		return 0;
	__u16 family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return 0;
	__u32 netns = sk_netns(sk);
	if (!netns_wanted(netns))
		return 0;
	__u16 lport = sk->__sk_common.skc_num;

	if (listen) {
		/* listen() runs in the listening process: remember it. */
		port_ref(netns, IPPROTO_TCP, lport, newstate == TCP_LISTEN ? 1 : -1, newstate == TCP_LISTEN);
		return 0;
	}

	struct flow_key k = {};
	k.netns = netns;
	k.proto = IPPROTO_TCP;
	fill_addrs(sk, family, &k);

	if (active) {
		k.direction = DIR_OUTBOUND;
		k.port = bpf_ntohs(sk->__sk_common.skc_dport);
		if (with_ports) {
			/* The ephemeral port is chosen after SYN_SENT is set. */
			if (newstate == TCP_SYN_SENT)
				return 0;
			k.client_port = lport;
			if (mode == MODE_STREAM) {
				stream(&k, newstate == TCP_ESTABLISHED ? EV_OPEN : EV_FAILED, 0);
				return 0;
			}
		}
		struct flow_value *v = flow_entry(&k);
		if (!v)
			return 0;
		if (newstate == TCP_SYN_SENT) {
			/* connect() runs in the client process; the handshake's end
			 * runs in softirq where "current" is arbitrary. Name the
			 * process now, count the outcome later. */
			set_process(v);
		} else if (newstate == TCP_ESTABLISHED) {
			__sync_fetch_and_add(&v->connections, 1);
		} else if (newstate == TCP_CLOSE) {
			__sync_fetch_and_add(&v->failed_connections, 1);
		}
		return 0;
	}

	/* Passive open: the handshake completes in softirq; the listening
	 * process recorded at listen() names the server. */
	k.direction = DIR_INBOUND;
	k.port = lport;
	if (with_ports)
		k.client_port = bpf_ntohs(sk->__sk_common.skc_dport);
	if (mode == MODE_STREAM) {
		stream(&k, newstate == TCP_ESTABLISHED ? EV_OPEN : EV_FAILED, 0);
		return 0;
	}
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return 0;
	if (newstate == TCP_ESTABLISHED)
		__sync_fetch_and_add(&v->connections, 1);
	else
		__sync_fetch_and_add(&v->failed_connections, 1);
	if (!v->pid) {
		struct port_value *pv = port_lookup(netns, IPPROTO_TCP, lport);
		if (pv && pv->pid) {
			v->pid = pv->pid;
			v->cgroup_id = pv->cgroup_id;
			__builtin_memcpy(v->comm, pv->comm, sizeof(v->comm));
		}
	}
	return 0;
}

/* ---- bytes, per send/receive call ---- */

/* Direction rule for bytes: the local end is the server when its local
 * port is in the listening-port table of its namespace and protocol;
 * otherwise it is the client and the remote port is the server port. */
static __always_inline void count_bytes(struct sock *sk, int ret, int flags, bool send)
{
	if (ret <= 0 || (flags & MSG_PEEK))
		return;
	__u16 proto = sk->sk_protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return;
	if (mode == MODE_STREAM && proto == IPPROTO_TCP)
		return; /* streaming sends connect/accept and UDP only */
	__u16 family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return;
	__u32 netns = sk_netns(sk);
	if (!netns_wanted(netns))
		return;

	struct flow_key k = {};
	k.netns = netns;
	k.proto = proto;
	__u16 lport = sk->__sk_common.skc_num;
	__u16 rport = bpf_ntohs(sk->__sk_common.skc_dport);
	fill_addrs(sk, family, &k);

	if (proto == IPPROTO_UDP) {
		/* An explicit destination (sendto) or a recvfrom source was
		 * seen by the cgroup hook of this same syscall. */
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		struct udp_state *st = bpf_sk_storage_get(&udp_sock, sk, 0, 0);
		if (st && st->tid == tid) {
			__builtin_memcpy(k.remote_addr, st->peer, sizeof(k.remote_addr));
			rport = bpf_ntohs(st->peer_port);
			st->tid = 0;
		} else if (rport == 0) {
			stat_inc(STAT_UDP_PEER_UNKNOWN);
			return;
		}
	}

	__u32 *any = listen_any_slot(proto, lport);
	if (any && *any && port_lookup(netns, proto, lport)) {
		k.direction = DIR_INBOUND;
		k.port = lport;
		if (with_ports)
			k.client_port = rport;
	} else {
		k.direction = DIR_OUTBOUND;
		k.port = rport;
		if (with_ports)
			k.client_port = lport;
	}
	if (mode == MODE_STREAM) {
		stream(&k, send ? EV_UDP_SEND : EV_UDP_RECV, ret);
		return;
	}

	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	if (send)
		__sync_fetch_and_add(&v->bytes_sent, ret);
	else
		__sync_fetch_and_add(&v->bytes_received, ret);
	set_process(v);
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send, struct sock *sk, int ret, int flags)
{
	count_bytes(sk, ret, flags, true);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv, struct sock *sk, int ret, int flags)
{
	count_bytes(sk, ret, flags, false);
	return 0;
}

/* ---- UDP peers of unconnected sockets (socket-address layer) ---- */

static __always_inline struct udp_state *udp_state_of(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_UDP || !ctx->sk)
		return NULL;
	struct udp_state *st = bpf_sk_storage_get(&udp_sock, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		stat_inc(STAT_PENDING_INSERT_FAILED);
	return st;
}

static __always_inline void remember_peer4(struct bpf_sock_addr *ctx)
{
	struct udp_state *st = udp_state_of(ctx);
	if (!st)
		return;
	set_v4mapped(st->peer, ctx->user_ip4);
	st->peer_port = (__u16)ctx->user_port;
	st->tid = (__u32)bpf_get_current_pid_tgid();
}

static __always_inline void remember_peer6(struct bpf_sock_addr *ctx)
{
	struct udp_state *st = udp_state_of(ctx);
	if (!st)
		return;
	__u32 *a = (__u32 *)st->peer;
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	st->peer_port = (__u16)ctx->user_port;
	st->tid = (__u32)bpf_get_current_pid_tgid();
}

SEC("cgroup/sendmsg4")
int udp_sendmsg4(struct bpf_sock_addr *ctx)
{
	remember_peer4(ctx);
	return 1;
}

SEC("cgroup/sendmsg6")
int udp_sendmsg6(struct bpf_sock_addr *ctx)
{
	remember_peer6(ctx);
	return 1;
}

SEC("cgroup/recvmsg4")
int udp_recvmsg4(struct bpf_sock_addr *ctx)
{
	remember_peer4(ctx);
	return 1;
}

SEC("cgroup/recvmsg6")
int udp_recvmsg6(struct bpf_sock_addr *ctx)
{
	remember_peer6(ctx);
	return 1;
}

/* ---- UDP bound ports ---- */

/* A UDP socket bound to a port the program chose (not port 0) is a
 * server. The pre-bind hook sees the requested port, the post-bind hook
 * sees the bind succeed; per-socket storage carries the fact between them
 * and to release, so the table counts each bound socket exactly once and
 * frees itself with the socket. */
#define UDP_BIND_REQUESTED 1
#define UDP_BIND_COUNTED 2

static __always_inline void udp_bind_request(struct bpf_sock_addr *ctx)
{
	if (ctx->user_port == 0)
		return;
	struct udp_state *st = udp_state_of(ctx);
	if (st)
		st->bind = UDP_BIND_REQUESTED;
}

SEC("cgroup/bind4")
int udp_prebind4(struct bpf_sock_addr *ctx)
{
	udp_bind_request(ctx);
	return 1;
}

SEC("cgroup/bind6")
int udp_prebind6(struct bpf_sock_addr *ctx)
{
	udp_bind_request(ctx);
	return 1;
}

static __always_inline void udp_bind_ref(struct bpf_sock *ctx, bool bound)
{
	if (ctx->protocol != IPPROTO_UDP)
		return;
	struct udp_state *st = bpf_sk_storage_get(&udp_sock, ctx, 0, 0);
	if (!st)
		return;
	struct sock *sk = as_sock(ctx);
	__u32 netns = sk_netns(sk);
	if (!netns_wanted(netns))
		return;
	__u16 port = sk->__sk_common.skc_num;
	if (bound && st->bind == UDP_BIND_REQUESTED) {
		st->bind = UDP_BIND_COUNTED;
		port_ref(netns, IPPROTO_UDP, port, 1, true);
	} else if (!bound && st->bind == UDP_BIND_COUNTED) {
		st->bind = 0;
		port_ref(netns, IPPROTO_UDP, port, -1, false);
	}
}

SEC("cgroup/post_bind4")
int udp_bind4(struct bpf_sock *ctx)
{
	udp_bind_ref(ctx, true);
	return 1;
}

SEC("cgroup/post_bind6")
int udp_bind6(struct bpf_sock *ctx)
{
	udp_bind_ref(ctx, true);
	return 1;
}

SEC("cgroup/sock_release")
int udp_release(struct bpf_sock *ctx)
{
	udp_bind_ref(ctx, false);
	return 1;
}

/* ---- seeding: sockets that existed before deptrace started ---- */

SEC("iter/tcp")
int seed_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	if (!skc || skc->skc_state != TCP_LISTEN)
		return 0;
	if (skc->skc_family != AF_INET && skc->skc_family != AF_INET6)
		return 0;
	struct listen_record r = {};
	r.netns = skc->skc_net.net->ns.inum;
	r.port = skc->skc_num;
	r.proto = IPPROTO_TCP;
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}

SEC("iter/udp")
int seed_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *udp = ctx->udp_sk;
	if (!udp)
		return 0;
	struct sock *sk = &udp->inet.sk;
	if (!(sk->sk_userlocks & SOCK_BINDPORT_LOCK))
		return 0;
	struct listen_record r = {};
	r.netns = sk->__sk_common.skc_net.net->ns.inum;
	r.port = sk->__sk_common.skc_num;
	r.proto = IPPROTO_UDP;
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}

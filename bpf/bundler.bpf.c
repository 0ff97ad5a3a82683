//go:build ignore
/* deptrace's in-kernel flow bundler.
 *
 * Every connection and datagram is added into one bundled-flow entry keyed
 * by {netns, local address, remote address, server port, direction,
 * protocol}: the client's ephemeral port is dropped, so the number of
 * entries follows the number of dependencies, not the connection rate.
 *
 * TCP is counted from the socket, not per call. The kernel already keeps
 * exact byte and retransmission counters on every tcp_sock; deptrace tags
 * each connection with socket-local storage when it is established
 * (identity, process, the counters' values at that moment) and folds the
 * counters' growth into the bundled flow twice: at every drain (an
 * iterator over deptrace's own socket storage, so the walk touches only
 * the live connections deptrace tagged, never the host's TIME_WAIT or
 * request sockets, whatever the number of namespaces) and once at close.
 * Sends and receives run no deptrace code for TCP.
 *
 * Hooks (stable interfaces; the fexit fallbacks only where a tracepoint is
 * missing, before 6.3):
 *   tp_btf/inet_sock_set_state   TCP connect/accept/close/listen
 *   tp_btf/tcp_send_reset, tcp_receive_reset   resets, per flow
 *   tp_btf/sock_send_length, sock_recv_length  UDP datagrams and unix
 *                                socket data (TCP calls leave at the
 *                                first test)
 *   cgroup/sendmsg4|6, recvmsg4|6  peers of unconnected UDP datagrams
 *   cgroup/sock_release          last counts of a connected UDP socket
 *   cgroup/getsockopt            a connect error the application read itself
 *   fexit/inet_sendmsg, ...      fallbacks for sock_send/recv_length
 *   iter/tcp                     listeners and connections that existed
 *                                before deptrace started
 *   iter/bpf_sk_storage_map      the drain-time harvest
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "bundler.h"

#define barrier() asm volatile("" ::: "memory")

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

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Referenced here so the shared types land in BTF for bpf2go. */
const struct flow_key *_btf_flow_key __attribute__((unused));
const struct flow_value *_btf_flow_value __attribute__((unused));
const struct port_key *_btf_port_key __attribute__((unused));
const struct port_value *_btf_port_value __attribute__((unused));
const struct listen_record *_btf_listen_record __attribute__((unused));
const struct listener_record *_btf_listener_record __attribute__((unused));
const enum stat_index *_btf_stat_index __attribute__((unused));
const enum direction *_btf_direction __attribute__((unused));
const enum flow_proto *_btf_flow_proto __attribute__((unused));
const struct unix_path *_btf_unix_path __attribute__((unused));

/* Set by the loader before load. 0 traces every network namespace. */
const volatile __u32 target_netns = 0;

/* Set by the loader (tests): every connect() goes to the connecting hash,
 * the path that otherwise runs only when a connect slot is taken. */
const volatile __u32 connect_slots_off = 0;

/* Set by the loader when sock_send_length runs: the unix datagram send
 * fexit then only counts what that tracepoint cannot, a datagram sent to
 * a path on an unconnected socket (kernels with the tracepoint but
 * without cgroup/sendmsg_unix, 6.3 to 6.6). */
volatile __u32 send_tracepoint_on = 0;

/* Set by the loader: the connect fexits that run (CONNECT_FEXIT_*). The
 * connect system call's tracepoint, loaded where any of them is missing,
 * leaves the families they count alone. */
#define CONNECT_FEXIT_UNIX_STREAM 1
#define CONNECT_FEXIT_UNIX_DGRAM 2
#define CONNECT_FEXIT_INET 4
volatile __u32 connect_fexits = 0;

/* Set by the loader before each harvest: the first listener of a port the
 * harvest visits takes the port's deepest queue for all of them. */
volatile __u32 harvest_gen = 0;

extern void *bpf_cast_to_kern_ctx(void *) __ksym;

/* A new flow's first value, kept off the 512-byte stack. */
const volatile struct flow_value zero_flow = {};

/* The bundled-flow map template. Two maps of this shape exist; the outer
 * array holds the one programs write to. Swapping the slot from user space
 * waits for an RCU grace period (the kernel does this for map-in-map
 * updates), so once the swap returns no program still writes to the old map
 * and it can be drained with no race and no lost increment. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__uint(max_entries, 65536);
		__type(key, struct flow_key);
		__type(value, struct flow_value);
	});
} flows SEC(".maps");

/* The spill: where a new flow goes when its insert into the active flow
 * map fails. A per-CPU hash without preallocation takes each new entry
 * from a small per-CPU cache that the kernel refills asynchronously, so
 * two inserts in a row on one CPU (both ends of a loopback handshake in
 * one softirq) can find it empty (-ENOMEM); an insert nested in an update
 * of the same map on one CPU fails too (-EBUSY), and a full map (-E2BIG).
 * The spill is preallocated and never fails that way: its slots are
 * claimed by compare-and-swap and shared by every CPU (programs add to
 * them atomically). Half i goes with inner flow map i: spill_half says
 * which half programs write to, and the drain sets it to the next half
 * before it swaps the flow maps, so the swap's RCU grace period also
 * quiesces the old half, which the drain then reads and frees with its
 * map. Two programs racing to claim one key may take two slots: the drain
 * sums every slot and map entry of a key. Only when a key finds no slot
 * is the count lost, and counted. */
#define SPILL_SLOTS 256 /* per half, a power of two */
#define SPILL_PROBES 8  /* slots tried from the key's hash */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * SPILL_SLOTS);
	__type(key, __u32);
	__type(value, struct spill_slot);
} spill SEC(".maps");

/* The active half (0 or 1), written by user space only. A map rather than
 * a global variable: it is pinned with the flow maps, so that a process
 * adopting a pinned side steers the programs it adopts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} spill_half SEC(".maps");

/* Slots claimed per half: the drain reads a half only when it has some. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} spill_used SEC(".maps");

/* Set by the loader (tests): flow_entry leaves new flows out of the flow
 * map and puts them in the spill, the path that otherwise runs only when
 * an insert fails (a flow finding no slot then counts as an allocation
 * failure). */
const volatile __u32 spill_only = 0;

const enum spill_state *_btf_spill_state __attribute__((unused)); /* for bpf2go */

/* In front of the flow map, a small direct-mapped cache per CPU: a flow
 * found there costs a hash of its key and a compare, where a lookup in the
 * per-CPU hash costs a hash, a walk of a bucket in a large table (a cache
 * and TLB miss once the table outgrows the cache), and the value's per-CPU
 * pointer: about 160 ns of each of a short connection's four flow updates in
 * this VM's profile. A slot goes to the first flow of the interval that
 * hashes to it, on that CPU; flows that find it taken use the map as
 * before. Slots use the spill's states and halves: half i goes with inner
 * flow map i (spill_half), so the drain's swap quiesces the old half, which
 * the drain reads (every CPU's slots) and frees with the map; a key in
 * cache slots and in the map is summed. Only this CPU's programs write its
 * slots: a claim is a compare-and-swap against a program nested on the
 * same CPU (an interrupt, or from 6.19 a task that preempted the claimer),
 * which meanwhile finds the slot CLAIMING and uses the map. */
#define CACHE_SLOTS 64 /* per CPU and half, a power of two */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct spill_slot);
} flow_cache SEC(".maps");

/* Set by the loader (tests): every flow goes to the map, as before the
 * cache. spill_only implies it. */
const volatile __u32 cache_off = 0;

/* TCP listening ports per namespace, with the process that listens. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct port_key);
	__type(value, struct port_value);
} ports SEC(".maps");

/* Unix socket paths by the hash in flow keys; user space reads them at
 * drain. LRU: paths of long-gone sockets make room for new ones. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct unix_path);
} unix_paths SEC(".maps");


enum sock_kind {
	SK_TCP = 1,      /* a TCP connection */
	SK_UDP = 2,      /* a UDP socket */
	SK_LISTENER = 3, /* a listening TCP socket */
	SK_UNIX = 4,     /* a unix-domain socket */
};

/* What deptrace keeps with a socket; freed by the kernel with the socket.
 * The reported values only advance, by compare-and-swap, so the drain and
 * the close path can race on one socket without counting a byte twice:
 * each adds only what it advanced. */
struct sock_state {
	struct flow_key key; /* the socket's bundled flow */
	__u32 kind;          /* enum sock_kind */
	__u32 pid;           /* thread-group id of the owning process */
	char comm[16];       /* its name */
	__u64 cgroup_id;
	__u64 syn_ns;        /* TCP: connect() time, for the connect latency */
	/* TCP: the counters when deptrace started counting this connection */
	__u64 base_acked;
	__u64 base_received;
	__u32 base_una;
	__u32 counting;      /* TCP: 1 from ESTABLISHED (or the start-up tag) until close */
	/* TCP: what was folded into flows so far */
	__u64 rep_sent;
	__u64 rep_received;
	__u64 last_raw_received; /* bytes_received at the previous drain */
	__u32 rep_retrans;
	__u32 open_pending;  /* 1 while the open is not counted yet */
	__u32 latency_us;    /* connect latency of the pending open */
	__u32 connect_err;   /* TCP: an error the application read with SO_ERROR while connecting */
	__u64 tagged_ns;     /* TCP: when a connection already counting was tagged (0: at its start) */
	/* connected UDP: per-datagram counters, taken by exchange */
	__u64 udp_bytes_sent;
	__u64 udp_bytes_received;
	__u64 udp_dgrams_sent;
	__u64 udp_dgrams_received;
	__u8 udp_daddr[16];  /* the peer the key was built for */
	__u16 udp_dport;
	/* unconnected UDP: the peer of the datagram in flight, learnt by the
	 * cgroup sendmsg/recvmsg hook and consumed by the byte tracepoint of
	 * the same syscall. tid tells whose syscall it belongs to: two threads
	 * sending on one socket at once must not swap peers. */
	__u16 peer_port;     /* network byte order */
	__u32 tid;
	__u8 peer[16];
	/* unconnected unix datagram socket: the destination path's hash of
	 * the send in flight (thread tid), from cgroup/sendmsg_unix */
	__u64 unix_dest;
	/* listeners: the drop counter already reported (32-bit, as the
	 * kernel's counter is, so a wrap is followed) */
	__u32 rep_drops;
	/* unconnected UDP bound to a port the kernel chose: enum udp_role */
	__u32 udp_role;
};

/* Which end an unconnected UDP socket bound to a port the kernel chose is
 * (see udp_count_unconnected). */
enum udp_role {
	UDP_ROLE_UNDECIDED = 0, /* one peer so far: counted in storage, as a client */
	UDP_ROLE_CLIENT = 1,    /* sent first to its second peer */
	UDP_ROLE_SERVER = 2,    /* heard first from its second peer: it answers */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_state);
} socks SEC(".maps");

/* A connect() in flight: what the open needs when it completes, usually in
 * softirq, where the connecting process is not at hand. Far cheaper than
 * socket storage, whose allocation (memcg-charged, freed by RCU) costs
 * microseconds: most connections never get any (see tcp_established).
 * A plain preallocated hash (an LRU hash costs twice as much here): an
 * entry whose completion was missed (a skipped program run) is overwritten
 * when its socket's memory serves a new connect, and were the map ever
 * full, a connect falls back to socket storage: nothing is lost. */
struct connect_info {
	__u64 syn_ns;
	__u64 cgroup_id;
	__u32 pid;
	char comm[16];
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* the socket's address */
	__type(value, struct connect_info);
} connecting SEC(".maps");

/* In front of that hash, a direct-mapped array of slots indexed by the low
 * bits of the socket's cookie: claiming a free slot is one compare-and-swap,
 * where a hash insert and delete take a bucket lock with interrupts off
 * (a third of a short connection's cost in a profile). The kernel hands
 * out cookies in sequence (per-CPU batches of 4096, each offset in the
 * index so that two CPUs connecting at once walk different slots), so
 * consecutive connects take consecutive slots: a small array that stays
 * in cache. A hash of the
 * cookie spread them over a large one, and the claim then missed the
 * cache and the TLB: 0.7 us per connection in a profile, the largest
 * single cost of a short connection. A connect whose slot is taken (a
 * connect still in flight CONNECT_SLOTS cookies later) goes to the hash.
 * A slot whose completion was missed is taken back after
 * CONNECT_SLOT_STALE_NS; meanwhile its connects go to the hash: slower,
 * never wrong. */
#define CONNECT_SLOTS 1024
struct connect_slot {
	__u64 owner; /* the connecting socket's cookie; 0: free */
	struct connect_info ci;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CONNECT_SLOTS);
	__type(key, __u32);
	__type(value, struct connect_slot);
} connect_slots SEC(".maps");

/* Connected UDP sends seen lately, per CPU, by ports and peer: a socket
 * that sends a second time is worth socket storage (a DNS client's
 * one-query socket is not). */
#define SENDERS_SLOTS 256
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SENDERS_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} recent_senders SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&stats, &idx);
	if (c)
		__sync_fetch_and_add(c, 1);
}

/* Insert-or-find, as bcc's bpf_map_lookup_or_try_init: another CPU may
 * insert the same key between our lookup and insert (-EEXIST is fine). A
 * full map and a failed allocation are counted apart. */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *init, __u32 full_stat)
{
	void *v = bpf_map_lookup_elem(map, key);
	if (v)
		return v;
	long err = bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		stat_inc(err == -E2BIG ? full_stat : STAT_FLOW_ALLOC_FAILED);
		return NULL;
	}
	return bpf_map_lookup_elem(map, key);
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
static __always_inline void fill_addrs(const struct sock *sk, struct flow_key *k)
{
	if (sk->__sk_common.skc_family == AF_INET6) {
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

static __always_inline bool inet_family(const struct sock *sk)
{
	__u16 f = sk->__sk_common.skc_family;
	return f == AF_INET || f == AF_INET6;
}

static __always_inline struct port_value *port_lookup(__u32 netns, __u16 port)
{
	struct port_key pk = {.netns = netns, .port = port, .proto = IPPROTO_TCP};
	return bpf_map_lookup_elem(&ports, &pk);
}

/* The current process: its thread-group id and the thread-group leader's
 * name (a worker thread's own name, such as memcached's "mc-worker", is
 * not the process's). Tracing programs only. */
static __always_inline void current_process(__u32 *pid, char *comm, __u64 *cgroup)
{
	struct task_struct *t = bpf_get_current_task_btf();
	*pid = t->tgid;
	/* Two direct loads (the verifier makes them fault-safe), not a helper
	 * call: this runs at every connect. */
	const __u32 *leader_comm = (const __u32 *)t->group_leader->comm;
	__u32 *dst = (__u32 *)comm; /* every comm deptrace keeps is 4-aligned */
	dst[0] = leader_comm[0];
	dst[1] = leader_comm[1];
	dst[2] = leader_comm[2];
	dst[3] = leader_comm[3];
	*cgroup = bpf_get_current_cgroup_id();
}

static __always_inline bool same_key(const struct flow_key *a, const struct flow_key *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	for (int i = 0; i < sizeof(*a) / 4; i++)
		if (x[i] != y[i])
			return false;
	return true;
}

/* The spill's and the cache's slot of a key: each word times its own odd
 * constant, summed, folded. The products are independent (they pipeline),
 * where FNV's chain of ten multiplies was 5 % of a connection's time. */
static __always_inline __u32 key_hash(const struct flow_key *key)
{
	const __u32 *w = (const __u32 *)key;
	__u32 h = 0;
	for (int i = 0; i < sizeof(*key) / 4; i++)
		h += w[i] * (0x9E3779B1u + 2 * i * 0x85EBCA6Bu);
	return h ^ (h >> 15) ^ (h >> 23);
}

/* The flow's slot in this CPU's cache, found or claimed; NULL when the
 * slot holds another flow or is being claimed (see flow_cache). */
static __always_inline struct flow_value *cache_entry(const struct flow_key *key)
{
	__u32 zero = 0;
	__u32 *half = bpf_map_lookup_elem(&spill_half, &zero);
	if (!half)
		return NULL;
	__u32 idx = (*half & 1) * CACHE_SLOTS + (key_hash(key) & (CACHE_SLOTS - 1));
	struct spill_slot *s = bpf_map_lookup_elem(&flow_cache, &idx);
	if (!s)
		return NULL;
	__u32 st = *(volatile __u32 *)&s->state;
	if (st == SPILL_READY)
		return same_key(&s->key, key) ? &s->value : NULL;
	if (st != SPILL_FREE || __sync_val_compare_and_swap(&s->state, SPILL_FREE, SPILL_CLAIMING) != SPILL_FREE)
		return NULL;
	/* A free slot is all zeroes: only the key to write. */
	s->key = *key;
	__sync_lock_test_and_set(&s->state, SPILL_READY);
	return &s->value;
}

/* Find or claim the spill slot of key in the active half. err is the
 * failed insert's error, for the loss counter when no slot is free. Not
 * inlined: only a failed insert comes here. */
static __noinline struct flow_value *spill_entry(const struct flow_key *key, long err)
{
	__u32 zero = 0;
	__u32 *half = bpf_map_lookup_elem(&spill_half, &zero);
	if (!half)
		return NULL;
	__u32 base = (*half & 1) * SPILL_SLOTS;
	__u32 h = key_hash(key);
	for (int i = 0; i < SPILL_PROBES; i++) {
		__u32 idx = base + ((h + i) & (SPILL_SLOTS - 1));
		struct spill_slot *s = bpf_map_lookup_elem(&spill, &idx);
		if (!s)
			return NULL;
		/* Atomic reads: a fully ordered load of the state, so the
		 * key is read after it. */
		__u32 st = __sync_fetch_and_or(&s->state, 0);
		if (st == SPILL_FREE) {
			st = __sync_val_compare_and_swap(&s->state, SPILL_FREE, SPILL_CLAIMING);
			if (st == SPILL_FREE) {
				/* A free slot is all zeroes: only the key to write. */
				s->key = *key;
				__sync_lock_test_and_set(&s->state, SPILL_READY);
				__u32 hi = base ? 1 : 0;
				__u64 *used = bpf_map_lookup_elem(&spill_used, &hi);
				if (used)
					__sync_fetch_and_add(used, 1);
				return &s->value;
			}
		}
		if (st == SPILL_READY && same_key(&s->key, key))
			return &s->value;
	}
	stat_inc(err == -E2BIG ? STAT_FLOW_MAP_FULL : STAT_FLOW_ALLOC_FAILED);
	return NULL;
}

/* Find or create the bundled entry of k in the active map, or where its
 * insert fails, in the spill. The lookup that finds an existing flow, by
 * far the common case, is all it costs. */
static __always_inline struct flow_value *flow_entry(const struct flow_key *key)
{
	__u32 zero = 0;
	struct flow_value *v = cache_off || spill_only ? NULL : cache_entry(key);
	if (v)
		goto found;
	void *active = bpf_map_lookup_elem(&flows, &zero);
	if (!active)
		return NULL;
	v = bpf_map_lookup_elem(active, key);
	if (!v) {
		long err = 0;
		if (!spill_only) {
			/* -EEXIST: another CPU inserted it meanwhile. */
			err = bpf_map_update_elem(active, key, (const void *)&zero_flow, BPF_NOEXIST);
			if (!err || err == -EEXIST)
				v = bpf_map_lookup_elem(active, key);
		}
		if (!v)
			v = spill_entry(key, err);
		if (!v)
			return NULL;
	}
found:;
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

/* Name the flow's process from the socket's, or for a server without one
 * (the handshake completes in softirq) from the listening process. */
static __always_inline void name_flow(struct flow_value *v, const struct sock_state *st)
{
	if (st->pid) {
		if (v->pid != st->pid) {
			v->pid = st->pid;
			v->cgroup_id = st->cgroup_id;
			__builtin_memcpy(v->comm, st->comm, sizeof(v->comm));
		}
		return;
	}
	if (v->pid || st->key.direction != DIR_INBOUND || st->key.proto != IPPROTO_TCP)
		return;
	struct port_value *pv = port_lookup(st->key.netns, st->key.port);
	if (pv && pv->pid) {
		v->pid = pv->pid;
		v->cgroup_id = pv->cgroup_id;
		__builtin_memcpy(v->comm, pv->comm, sizeof(v->comm));
	}
}

/* Advance *rep to now if now is ahead; return by how much. Bounded retries:
 * only the drain and the close path ever race on one socket. */
static __always_inline __u64 advance64(__u64 *rep, __u64 now)
{
	for (int i = 0; i < 4; i++) {
		__u64 prev = *(volatile __u64 *)rep;
		if ((__s64)(now - prev) <= 0)
			return 0;
		if (__sync_val_compare_and_swap(rep, prev, now) == prev)
			return now - prev;
	}
	return 0;
}

static __always_inline __u32 advance32(__u32 *rep, __u32 now)
{
	for (int i = 0; i < 4; i++) {
		__u32 prev = *(volatile __u32 *)rep;
		if ((__s32)(now - prev) <= 0)
			return 0;
		if (__sync_val_compare_and_swap(rep, prev, now) == prev)
			return now - prev;
	}
	return 0;
}

static __always_inline void remember_listener(struct port_value *pv, struct sock *sk)
{
	if (sk->__sk_common.skc_family == AF_INET6)
		pv->listener6 = (__u64)sk;
	else
		pv->listener4 = (__u64)sk;
}

static __always_inline void port_ref(struct sock *sk, __u32 netns, __u16 port, int delta)
{
	struct port_key pk = {.netns = netns, .port = port, .proto = IPPROTO_TCP};
	if (delta > 0) {
		struct port_value init = {};
		struct port_value *pv = lookup_or_init(&ports, &pk, &init, STAT_PORT_MAP_FULL);
		if (!pv)
			return;
		__sync_fetch_and_add(&pv->refs, 1);
		/* listen() runs in the listening process: remember it. */
		current_process(&pv->pid, pv->comm, &pv->cgroup_id);
		remember_listener(pv, sk);
		return;
	}
	struct port_value *pv = bpf_map_lookup_elem(&ports, &pk);
	if (!pv)
		return;
	/* never read a freed listener */
	if (pv->listener4 == (__u64)sk)
		pv->listener4 = 0;
	if (pv->listener6 == (__u64)sk)
		pv->listener6 = 0;
	/* The last socket on the port is gone: forget the port. */
	if (__sync_fetch_and_add(&pv->refs, -1) <= 1)
		bpf_map_delete_elem(&ports, &pk);
}

/* ---- TCP ---- */

/* A socket whose port its program chose (bind to a port other than 0) is
 * the server end (UDP's rule). */
static __always_inline __u8 bound_direction(const struct sock *sk)
{
	/* sk_userlocks is a 4-bit bitfield before 6.x's rework (6.1 has it so):
	 * read it through CO-RE's bitfield relocations on every kernel. */
	__u8 locks = BPF_CORE_READ_BITFIELD(sk, sk_userlocks);
	return (locks & SOCK_BINDPORT_LOCK) ? DIR_INBOUND : DIR_OUTBOUND;
}

/* The direction of a TCP connection deptrace keeps no storage for: a
 * server's connection is a copy of its listener and keeps the listen
 * backlog, which a connect()ing socket never has, and no connected socket
 * can change. A connection the rule gets wrong (a listener with backlog
 * 0) is tagged at its start, with its true direction (tcp_established). */
static __always_inline __u8 tcp_direction(const struct sock *sk)
{
	return sk->sk_max_ack_backlog ? DIR_INBOUND : DIR_OUTBOUND;
}

static __always_inline void tcp_key(const struct sock *sk, struct flow_key *k, __u8 direction)
{
	k->netns = sk_netns(sk);
	k->proto = IPPROTO_TCP;
	k->direction = direction;
	k->port = direction == DIR_INBOUND ? sk->__sk_common.skc_num : bpf_ntohs(sk->__sk_common.skc_dport);
	if (!k->port) {
		/* Closing: the kernel released the local port number before the
		 * tracepoint; the source port the connection used is still set. */
		struct tcp_sock *tp = bpf_skc_to_tcp_sock((struct sock *)sk);
		if (tp)
			k->port = bpf_ntohs(tp->inet_conn.icsk_inet.inet_sport);
	}
	fill_addrs(sk, k);
}

/* Start counting a connection from the socket's counters as they are now. */
static __always_inline void tcp_start_counting(struct sock_state *st, struct tcp_sock *tp, bool count_handshake)
{
	st->base_acked = tp->bytes_acked;
	st->base_received = tp->bytes_received;
	st->base_una = tp->snd_una;
	st->last_raw_received = st->base_received;
	st->rep_sent = 0;
	st->rep_received = 0;
	/* SYN (and SYN-ACK) retransmissions belong to the new connection;
	 * a connection found at start counts from now. */
	st->rep_retrans = count_handshake ? 0 : tp->total_retrans;
	st->counting = 1;
}

#define TCPF_FIN_SENT (TCPF_FIN_WAIT1 | TCPF_FIN_WAIT2 | TCPF_CLOSING | TCPF_LAST_ACK)

/* Fold a connection's counter growth into its bundled flow.
 *
 * bytes_acked counts the SYN (active side) and our FIN once acked;
 * bytes_received counts the peer's FIN. The baseline taken at ESTABLISHED
 * removes the SYN. Our FIN is acked when every sequence number written,
 * FIN included, is acked: bytes_acked is read before the state, so a race
 * with the ACK can only under-read, never over-read. The peer's FIN is
 * flagged (SOCK_DONE) only after bytes_received grew: at close, in the
 * socket's own context, the flag is exact; a drain cannot tell a FIN from
 * a data byte that just arrived, so it holds back one received byte while
 * bytes are arriving and releases it at the next drain or at close.
 * Whatever a drain under-reads, a later drain or the close reports: the
 * total is exact, byte for byte. */
static __always_inline void tcp_fold(struct sock *sk, struct sock_state *st, bool at_close, int state)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	__u64 acked = tp->bytes_acked;
	__u64 raw_received = tp->bytes_received;
	__u32 retrans = tp->total_retrans;
	if (!at_close) {
		barrier();
		state = sk->__sk_common.skc_state;
		if (state == TCP_CLOSE)
			return; /* the close path folded it */
	}
	bool fin_done = sk->__sk_common.skc_flags & (1UL << bpf_core_enum_value(enum sock_flags, SOCK_DONE));

	__u64 sent = acked - st->base_acked;
	if (((1 << state) & TCPF_FIN_SENT) && sent && (__u32)sent == tp->write_seq - st->base_una)
		sent--; /* our FIN, acked */
	__u64 received = raw_received - st->base_received;
	bool settled = at_close || raw_received == st->last_raw_received;
	if (!at_close)
		st->last_raw_received = raw_received;
	if (received && (!settled || fin_done))
		received--;

	__u64 d_sent = advance64(&st->rep_sent, sent);
	__u64 d_received = advance64(&st->rep_received, received);
	__u32 d_retrans = advance32(&st->rep_retrans, retrans);
	__u32 opened = 0;
	if (st->open_pending)
		opened = __sync_lock_test_and_set(&st->open_pending, 0);
	if (!d_sent && !d_received && !d_retrans && !opened)
		return;

	struct flow_value *v = flow_entry(&st->key);
	if (!v)
		return;
	if (opened) {
		__sync_fetch_and_add(&v->connections, 1);
		if (st->key.direction == DIR_OUTBOUND && st->syn_ns) {
			__u64 lat = st->latency_us;
			__sync_fetch_and_add(&v->latency_count, 1);
			__sync_fetch_and_add(&v->latency_sum_us, lat);
			if (lat > v->latency_max_us)
				v->latency_max_us = lat;
		}
	}
	if (d_sent)
		__sync_fetch_and_add(&v->bytes_sent, d_sent);
	if (d_received)
		__sync_fetch_and_add(&v->bytes_received, d_received);
	if (d_retrans)
		__sync_fetch_and_add(&v->retransmits, d_retrans);
	name_flow(v, st);
}

static __always_inline struct sock_state *new_state(struct sock *sk)
{
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		stat_inc(STAT_SOCK_STORAGE_FAILED);
	return st;
}

/* The connection's storage, if deptrace keeps any for it (most sockets
 * have none: reading the pointer is cheaper than a lookup). */
static __always_inline struct sock_state *tcp_state_of(struct sock *sk)
{
	if (!sk->sk_bpf_storage)
		return NULL;
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	return st && st->kind == SK_TCP ? st : NULL;
}

/* Socket storage for a connection, used when its direction is not the one
 * tcp_direction gives, and where the connect map is full. */
static __always_inline struct sock_state *tcp_tag(struct sock *sk, __u8 direction)
{
	struct sock_state *st = new_state(sk);
	if (!st)
		return NULL;
	/* New storage comes zeroed; only a socket reconnecting after a failed
	 * attempt needs clearing (a 200-byte store). */
	if (st->kind)
		__builtin_memset(st, 0, sizeof(*st));
	st->kind = SK_TCP;
	tcp_key(sk, &st->key, direction);
	return st;
}

/* A connect slot is owned by the socket's cookie: unique for the kernel's
 * uptime (a socket's address is reused, and the verifier forbids hashing a
 * pointer). Sockets that never connect never get one. */
static __always_inline struct connect_slot *connect_slot_of(__u64 cookie)
{
	/* Each CPU takes cookies in batches of 4096 (a multiple of the slot
	 * count): offset each batch, so that two CPUs connecting at once walk
	 * different slots. */
	__u32 idx = (__u32)(cookie + (cookie >> 12) * 337) & (CONNECT_SLOTS - 1);
	return bpf_map_lookup_elem(&connect_slots, &idx);
}

/* A slot held this long was left by a completion deptrace missed (a
 * connect gives up after about two minutes with the default SYN retries):
 * a new connect may take it. */
#define CONNECT_SLOT_STALE_NS (10 * 60 * 1000000000ULL)

/* The connect() in flight on sk, from its slot or the hash; *slot is set
 * when it is a slot, which connect_done frees. */
static __always_inline struct connect_info *connect_find(struct sock *sk, struct connect_slot **slot, __u64 *cookie)
{
	*cookie = bpf_get_socket_cookie(sk);
	struct connect_slot *s = connect_slot_of(*cookie);
	if (s && s->owner == *cookie) {
		*slot = s;
		return &s->ci;
	}
	*slot = NULL;
	__u64 key = (__u64)sk;
	return bpf_map_lookup_elem(&connecting, &key);
}

/* Forget a finished connect, after its info was read. */
static __always_inline void connect_done(struct sock *sk, struct connect_info *ci, struct connect_slot *slot, __u64 cookie)
{
	if (slot) {
		/* Only this socket's completion frees its slot (a completion so
		 * late that its slot was taken back frees nothing), and a claim
		 * only takes a free or stale one. The time is cleared first (a
		 * slot with time 0 is never stale); the compare-and-swap orders
		 * the two. */
		if (slot->owner == cookie) {
			*(volatile __u64 *)&slot->ci.syn_ns = 0;
			__sync_val_compare_and_swap(&slot->owner, cookie, 0);
		}
		return;
	}
	if (ci) {
		__u64 key = (__u64)sk;
		bpf_map_delete_elem(&connecting, &key);
	}
}

/* connect(): runs in the connecting process. The ephemeral port is not
 * chosen yet, but the key does not need it. */
static __always_inline void tcp_connecting(struct sock *sk)
{
	/* A socket reconnecting after a failed attempt: forget that one. */
	if (sk->sk_bpf_storage) {
		struct sock_state *old = bpf_sk_storage_get(&socks, sk, 0, 0);
		if (old) {
			old->kind = 0;
			old->connect_err = 0;
		}
	}
	__u64 now = bpf_ktime_get_ns();
	__u64 cookie = bpf_get_socket_cookie(sk);
	struct connect_slot *slot = connect_slots_off ? NULL : connect_slot_of(cookie);
	if (slot) {
		__u64 owner = __sync_val_compare_and_swap(&slot->owner, 0, cookie);
		if (owner && owner != cookie) {
			/* Taken: back from a missed completion? The claim is on
			 * the time first, so that two connects cannot both take
			 * it, and a slot being filled (time 0) is never stale. */
			__u64 since = slot->ci.syn_ns;
			if (since && now - since > CONNECT_SLOT_STALE_NS &&
			    __sync_val_compare_and_swap(&slot->ci.syn_ns, since, now) == since &&
			    __sync_val_compare_and_swap(&slot->owner, owner, cookie) == owner)
				owner = 0;
		}
		if (owner == 0 || owner == cookie) {
			/* Ours (owner == cookie: a reconnect whose first attempt's
			 * end was missed). Written before the SYN is sent, so
			 * before any completion reads it. */
			current_process(&slot->ci.pid, slot->ci.comm, &slot->ci.cgroup_id);
			slot->ci.syn_ns = now;
			return;
		}
	}
	__u64 key = (__u64)sk;
	struct connect_info ci = {};
	current_process(&ci.pid, ci.comm, &ci.cgroup_id);
	ci.syn_ns = now;
	if (bpf_map_update_elem(&connecting, &key, &ci, BPF_ANY) == 0)
		return;
	struct sock_state *st = tcp_tag(sk, DIR_OUTBOUND);
	if (!st)
		return;
	st->pid = ci.pid;
	st->cgroup_id = ci.cgroup_id;
	__builtin_memcpy(st->comm, ci.comm, sizeof(st->comm));
	st->syn_ns = ci.syn_ns;
}

static __always_inline void name_from_connect(struct flow_value *v, const struct connect_info *ci)
{
	if (v->pid != ci->pid) {
		v->pid = ci->pid;
		v->cgroup_id = ci->cgroup_id;
		__builtin_memcpy(v->comm, ci->comm, sizeof(v->comm));
	}
}

static __always_inline void name_from_listener(struct flow_value *v, __u32 netns, __u16 port)
{
	if (v->pid)
		return;
	struct port_value *pv = port_lookup(netns, port);
	if (pv && pv->pid) {
		v->pid = pv->pid;
		v->cgroup_id = pv->cgroup_id;
		__builtin_memcpy(v->comm, pv->comm, sizeof(v->comm));
	}
}

/* A server's connection opened: it has just joined its listener's accept
 * queue (the handshake put it there before this state change), so the
 * queue is read now for the interval's deepest; and the flow is named from
 * the listening process. The listener's address comes from the port table
 * and is read through probes: a listener of the port that closed since is
 * forgotten there first. */
static __always_inline void passive_open(struct flow_value *v, __u32 netns, __u16 port, __u16 family)
{
	struct port_value *pv = port_lookup(netns, port);
	if (!pv)
		return;
	if (v && !v->pid && pv->pid) {
		v->pid = pv->pid;
		v->cgroup_id = pv->cgroup_id;
		__builtin_memcpy(v->comm, pv->comm, sizeof(v->comm));
	}
	/* The listener of the connection's family (an IPv6 socket's children
	 * are IPv6, v4-mapped included), else the other one. */
	__u64 listener = family == AF_INET6 ? pv->listener6 : pv->listener4;
	if (!listener)
		listener = family == AF_INET6 ? pv->listener4 : pv->listener6;
	if (!listener)
		return;
	struct sock *ls = (struct sock *)listener;
	if (BPF_CORE_READ(ls, __sk_common.skc_state) != TCP_LISTEN || BPF_CORE_READ(ls, __sk_common.skc_num) != port)
		return; /* not that listener any more */
	__u32 q = BPF_CORE_READ(ls, sk_ack_backlog);
	for (int i = 0; i < 4; i++) {
		__u32 seen = *(volatile __u32 *)&pv->queue_max;
		if (q <= seen || __sync_val_compare_and_swap(&pv->queue_max, seen, q) == seen)
			break;
	}
}

/* A connection opened. Most get no storage: the open is counted now, the
 * bytes at close from the socket's counters (which start at known values),
 * and a connection that lives on is tagged later (tcp_tag_late) so that
 * drains report it while it lives. Storage is taken now only when the
 * direction at close would be guessed wrong, or a connect left some. */
static __always_inline void tcp_established(struct sock *sk, bool active)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	__u8 dir = active ? DIR_OUTBOUND : DIR_INBOUND;
	struct connect_slot *slot = NULL;
	__u64 cookie = 0;
	struct connect_info *ci = active ? connect_find(sk, &slot, &cookie) : NULL;
	__u64 syn_ns = ci ? ci->syn_ns : 0;
	struct sock_state *st = active ? tcp_state_of(sk) : NULL;
	if (!st && tcp_direction(sk) != dir) {
		st = tcp_tag(sk, dir);
		if (st && ci) {
			st->pid = ci->pid;
			st->cgroup_id = ci->cgroup_id;
			__builtin_memcpy(st->comm, ci->comm, sizeof(st->comm));
			st->syn_ns = ci->syn_ns;
		}
	}
	if (st) {
		if (active && st->syn_ns)
			st->latency_us = (bpf_ktime_get_ns() - st->syn_ns) / 1000;
		tcp_start_counting(st, tp, true);
		st->open_pending = 1;
		if (!active)
			passive_open(NULL, st->key.netns, st->key.port, sk->__sk_common.skc_family);
		connect_done(sk, ci, slot, cookie);
		return;
	}

	struct flow_key k = {};
	tcp_key(sk, &k, dir);
	struct flow_value *v = flow_entry(&k);
	if (v) {
		__sync_fetch_and_add(&v->connections, 1);
		if (syn_ns) {
			__u64 lat = (bpf_ktime_get_ns() - syn_ns) / 1000;
			__sync_fetch_and_add(&v->latency_count, 1);
			__sync_fetch_and_add(&v->latency_sum_us, lat);
			if (lat > v->latency_max_us)
				v->latency_max_us = lat;
		}
		if (ci)
			name_from_connect(v, ci);
	}
	if (!active)
		passive_open(v, k.netns, k.port, sk->__sk_common.skc_family);
	connect_done(sk, ci, slot, cookie);
}

/* What the socket's counters held when its connection opened: the SYN is
 * in the client's bytes_acked; a server's connection starts at zero. */
static __always_inline __u64 tcp_acked_at_open(__u8 direction)
{
	return direction == DIR_OUTBOUND ? 1 : 0;
}

/* The close of a connection deptrace kept nothing for: every byte since
 * its open, from the socket's own counters, in the close's own context
 * (exact, see tcp_fold). */
static __always_inline void tcp_close_untagged(struct sock *sk, int oldstate)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	__u8 dir = tcp_direction(sk);
	__u64 sent = tp->bytes_acked - tcp_acked_at_open(dir);
	if (((1 << oldstate) & TCPF_FIN_SENT) && sent && tp->snd_una == tp->write_seq)
		sent--; /* our FIN, acked */
	__u64 received = tp->bytes_received;
	bool fin_done = sk->__sk_common.skc_flags & (1UL << bpf_core_enum_value(enum sock_flags, SOCK_DONE));
	if (received && fin_done)
		received--; /* the peer's FIN */
	__u32 retrans = tp->total_retrans;
	if (!sent && !received && !retrans)
		return;
	struct flow_key k = {};
	tcp_key(sk, &k, dir);
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	if (sent)
		__sync_fetch_and_add(&v->bytes_sent, sent);
	if (received)
		__sync_fetch_and_add(&v->bytes_received, received);
	if (retrans)
		__sync_fetch_and_add(&v->retransmits, retrans);
	if (dir == DIR_INBOUND)
		name_from_listener(v, k.netns, k.port);
}

/* Tag a connection that lives on, so that every drain reports it: from a
 * send or a receive, once it has moved this many segments. A short
 * request/response connection moves fewer and never pays for storage; its
 * bytes come at close. */
#define TAG_AFTER_SEGS 16
#define TAG_SETTLE_NS (10 * 1000 * 1000ULL)

static __always_inline void tcp_tag_late(struct sock *sk)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	if (tp->segs_in + tp->segs_out < TAG_AFTER_SEGS)
		return;
	if (tcp_state_of(sk))
		return; /* tagged already (storage of another kind is no tag) */
	int state = sk->__sk_common.skc_state;
	if (state != TCP_ESTABLISHED && state != TCP_CLOSE_WAIT)
		return;
	if (!inet_family(sk) || !netns_wanted(sk_netns(sk)))
		return;
	struct sock_state *st = new_state(sk);
	if (!st || st->kind == SK_TCP)
		return;
	if (st->kind)
		__builtin_memset(st, 0, sizeof(*st));
	__u8 dir = tcp_direction(sk);
	st->kind = SK_TCP;
	tcp_key(sk, &st->key, dir);
	current_process(&st->pid, st->comm, &st->cgroup_id);
	/* Counting since the open, as the untagged close would have. */
	st->base_acked = tcp_acked_at_open(dir);
	st->base_received = 0;
	st->base_una = tp->snd_una - (__u32)(tp->bytes_acked - st->base_acked);
	/* A close racing with this tag (its tracepoint runs before the state
	 * changes) counts the connection untagged; no drain may count it too:
	 * the harvest leaves a connection tagged this late alone for a while,
	 * by which time the close has made its state CLOSE. */
	st->tagged_ns = bpf_ktime_get_ns();
	st->counting = 1;
}

/* Count one failed connection by the error that ended it. */
static __always_inline void count_failed_errno(struct flow_value *v, int err)
{
	__sync_fetch_and_add(&v->failed_connections, 1);
	switch (err) {
	case ECONNREFUSED:
	case ENOENT:     /* unix: no socket at that path */
	case EPROTOTYPE: /* unix: a socket of another type there */
		__sync_fetch_and_add(&v->failed_refused, 1);
		break;
	case ECONNRESET:
		__sync_fetch_and_add(&v->failed_reset, 1);
		break;
	case EHOSTUNREACH:
	case ENETUNREACH:
	case EACCES: /* a prohibit route, or a path the caller may not use */
	case EPERM:  /* refused by a policy (a cgroup connect hook) */
		__sync_fetch_and_add(&v->failed_unreachable, 1);
		break;
	default: /* ETIMEDOUT, a full unix backlog (EAGAIN), or abandoned while connecting */
		__sync_fetch_and_add(&v->failed_timeout, 1);
	}
}

/* Why an open failed, from the error the kernel gave the socket, or that
 * the application already read from it (an ICMP error that arrives while
 * connect() holds the socket lock is only a soft error, and SO_ERROR
 * clears it). */
static __always_inline void count_failure(struct flow_value *v, const struct sock *sk, const struct sock_state *st)
{
	int err = sk->sk_err;
	if (!err)
		err = sk->sk_err_soft;
	if (!err && st)
		err = st->connect_err;
	count_failed_errno(v, err);
}

static __always_inline void tcp_failed(struct sock *sk, bool active)
{
	/* A connect() is in the connect map (or tagged, where that was full);
	 * storage of another kind holds only an error the application read
	 * (connect_error). A server's half-open child has nothing. */
	struct sock_state *st = sk->sk_bpf_storage ? bpf_sk_storage_get(&socks, sk, 0, 0) : NULL;
	bool tagged = st && st->kind == SK_TCP;
	struct connect_slot *slot = NULL;
	__u64 cookie = 0;
	struct connect_info *ci = active ? connect_find(sk, &slot, &cookie) : NULL;
	struct flow_key k = {};
	if (tagged)
		k = st->key;
	else
		tcp_key(sk, &k, active ? DIR_OUTBOUND : DIR_INBOUND);
	struct flow_value *v = flow_entry(&k);
	if (v) {
		count_failure(v, sk, st);
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
		if (tp && tp->total_retrans)
			__sync_fetch_and_add(&v->retransmits, tp->total_retrans);
		if (tagged) {
			name_flow(v, st);
		} else if (ci) {
			name_from_connect(v, ci);
		} else if (!active) {
			name_from_listener(v, k.netns, k.port);
		}
	}
	connect_done(sk, ci, slot, cookie);
}

static __always_inline void listener_tag(struct sock *sk, __u32 pid, const char *comm, __u64 cgroup);

/* Runs the kernel skips. The kernel skips a run of a tracing program that
 * would nest in a run of the same program on the same CPU (a softirq's
 * state change inside a process's; from 6.19, where tracepoint programs are
 * preemptible, any task's run while another task is preempted inside the
 * program), and counts it as the program's recursion miss. So the hot
 * programs come in copies (separate programs: separate recursion guards),
 * attached in order to one tracepoint; one tracepoint call runs them in
 * that order, and a later copy does the work of a call only if no earlier
 * copy did. Two ways to know, chosen by the loader (rec_task_marks):
 * - before 6.19 (a tracepoint call runs its programs with preemption off):
 *   the first copy raises a per-CPU flag for the length of its run
 *   (before any filter: an unwanted transition of a process, such as
 *   close()'s FIN_WAIT1, can be interrupted by a wanted one in softirq).
 *   The kernel skips it only for a call nested in that run, on that CPU,
 *   so the last copy of a call that finds the flag raised knows the first
 *   was skipped, does the work and counts a rescue. Runs lost = the first
 *   copy's misses - rescues, exactly (the last copy reads the flag before
 *   any filter too); a call nested in the few instructions of the first
 *   copy's prologue, before the flag, is lost, and counted.
 *   Sends and receives run in process context only: nothing nests in
 *   them, they get no copies.
 * - from 6.19: the marks of recmarks.h (task-local, so preemption and
 *   migration between copies do not matter; proven in docs/install.md). A
 *   call is lost only if every copy was skipped (or the first could not
 *   mark): runs lost are at most the last copy's misses, and at most the
 *   first copy's misses and deferrals less the rescues (both count calls
 *   the filter drops too: an upper bound). */
const volatile __u32 rec_task_marks = 0;

#define REC_ON_STALE() do { } while (0)
#include "recmarks.h"

enum rec_family { REC_STATE = 0, REC_SEND = 1, REC_RECV = 2, REC_FAMILIES = 3 };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REC_FAMILIES);
	__type(key, __u32);
	__type(value, __u32);
} rec_busy SEC(".maps");

/* The first copy's flag, raised for its run (per-CPU flag mode). Only the
 * first copy writes it and the kernel never nests it in itself on one CPU:
 * plain increments. */
static __always_inline __u32 *rec_begin(__u32 family)
{
	if (rec_task_marks)
		return NULL;
	__u32 *busy = bpf_map_lookup_elem(&rec_busy, &family);
	if (busy)
		*busy += 1;
	return busy;
}

static __always_inline void rec_end(__u32 *busy)
{
	if (busy)
		*busy -= 1;
}

static __always_inline bool rec_first_copy(void *ctx, __u32 deferred)
{
	if (!rec_task_marks || rec_first(ctx) == REC_PROCESS)
		return true;
	/* No storage or every slot live: left to the later copies. */
	stat_inc(deferred);
	return false;
}

static __always_inline bool rec_mid_copy(void *ctx, __u32 rescued)
{
	if (!rec_task_marks || rec_mid(ctx) != REC_PROCESS)
		return false;
	stat_inc(rescued);
	return true;
}

static __always_inline bool rec_last_copy(void *ctx, __u32 family, __u32 rescued)
{
	if (rec_task_marks) {
		if (rec_last(ctx) != REC_PROCESS)
			return false;
	} else {
		__u32 *busy = bpf_map_lookup_elem(&rec_busy, &family);
		if (!busy || !*busy)
			return false;
	}
	stat_inc(rescued);
	return true;
}

/* Most transitions (FIN_WAIT, CLOSE_WAIT, the child's SYN_RECV...) are
 * irrelevant: the copies leave before touching the socket. */
static __always_inline bool tcp_transition_wanted(int oldstate, int newstate)
{
	bool connecting = oldstate == TCP_CLOSE && newstate == TCP_SYN_SENT;
	bool established = newstate == TCP_ESTABLISHED && (oldstate == TCP_SYN_SENT || oldstate == TCP_SYN_RECV);
	bool closed = newstate == TCP_CLOSE && oldstate != TCP_CLOSE;
	bool listen = newstate == TCP_LISTEN;
	return connecting || established || closed || listen;
}

static __always_inline bool tcp_state_wanted(struct sock *sk, int oldstate, int newstate)
{
	if (!tcp_transition_wanted(oldstate, newstate))
		return false;
	if (sk->sk_protocol != IPPROTO_TCP || !inet_family(sk))
		return false;
	return netns_wanted(sk_netns(sk));
}

/* A wanted TCP state change (tcp_state_wanted), done once per change
 * whichever copy of the program does it. */
static __always_inline void tcp_state_change(struct sock *sk, int oldstate, int newstate)
{
	bool connecting = oldstate == TCP_CLOSE && newstate == TCP_SYN_SENT;
	bool established = newstate == TCP_ESTABLISHED && (oldstate == TCP_SYN_SENT || oldstate == TCP_SYN_RECV);
	bool listen = newstate == TCP_LISTEN;

	if (connecting) {
		tcp_connecting(sk);
	} else if (established) {
		tcp_established(sk, oldstate == TCP_SYN_SENT);
	} else if (listen) {
		port_ref(sk, sk_netns(sk), sk->__sk_common.skc_num, 1);
		__u32 pid;
		char comm[16] __attribute__((aligned(4)));
		__u64 cgroup;
		current_process(&pid, comm, &cgroup);
		listener_tag(sk, pid, comm, cgroup);
	} else if (oldstate == TCP_LISTEN) {
		port_ref(sk, sk_netns(sk), sk->__sk_common.skc_num, -1);
	} else if (oldstate == TCP_SYN_SENT || oldstate == TCP_SYN_RECV) {
		tcp_failed(sk, oldstate == TCP_SYN_SENT);
	} else {
		struct sock_state *st = tcp_state_of(sk);
		if (!st) {
			tcp_close_untagged(sk, oldstate);
		} else if (st->counting) {
			tcp_fold(sk, st, true, oldstate);
			st->counting = 0;
		}
	}
}

/* The copies of on_tcp_state: see "Runs the kernel skips" above. */
SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_tcp_state, struct sock *sk, const int oldstate, const int newstate)
{
	__u32 *busy = rec_begin(REC_STATE);
	if (tcp_state_wanted(sk, oldstate, newstate) && rec_first_copy(ctx, STAT_REC_DEFERRED_STATE))
		tcp_state_change(sk, oldstate, newstate);
	rec_end(busy);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_tcp_state_mid, struct sock *sk, const int oldstate, const int newstate)
{
	if (tcp_state_wanted(sk, oldstate, newstate) && rec_mid_copy(ctx, STAT_REC_RESCUED_STATE))
		tcp_state_change(sk, oldstate, newstate);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_tcp_state_last, struct sock *sk, const int oldstate, const int newstate)
{
	/* The per-CPU flag is read before the filter (exact accounting), a
	 * mark after it (the first copy marks wanted changes only). */
	bool work = rec_task_marks ?
		tcp_state_wanted(sk, oldstate, newstate) && rec_last_copy(ctx, REC_STATE, STAT_REC_RESCUED_STATE) :
		rec_last_copy(ctx, REC_STATE, STAT_REC_RESCUED_STATE) && tcp_state_wanted(sk, oldstate, newstate);
	if (work)
		tcp_state_change(sk, oldstate, newstate);
	return 0;
}

/* Resets are rare: counted straight into the flow, whose identity the
 * socket's storage holds (the reset of an aborting close is sent after the
 * close was folded). */
static __always_inline void count_reset(struct sock *sk, bool sent)
{
	if (!sk)
		return;
	/* A RST in answer to a SYN is a refused connect, counted as such. */
	int state = sk->__sk_common.skc_state;
	if (state == TCP_SYN_SENT || state == TCP_SYN_RECV)
		return;
	/* Not a full socket (a time-wait or request socket answering), or a
	 * listener answering a stray segment: no connection of ours. */
	if (state == TCP_TIME_WAIT || state == TCP_NEW_SYN_RECV || state == TCP_LISTEN)
		return;
	if (!inet_family(sk) || !netns_wanted(sk_netns(sk)))
		return;
	struct sock_state *st = tcp_state_of(sk);
	struct flow_key k = {};
	if (st)
		k = st->key;
	else
		tcp_key(sk, &k, tcp_direction(sk));
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	if (sent)
		__sync_fetch_and_add(&v->resets_sent, 1);
	else
		__sync_fetch_and_add(&v->resets_received, 1);
	if (st)
		name_flow(v, st);
}

SEC("tp_btf/tcp_send_reset")
int BPF_PROG(on_send_reset, const struct sock *sk)
{
	count_reset((struct sock *)sk, true);
	return 0;
}

SEC("tp_btf/tcp_receive_reset")
int BPF_PROG(on_receive_reset, struct sock *sk)
{
	count_reset(sk, false);
	return 0;
}

/* The error a connecting application reads with getsockopt(SO_ERROR),
 * which clears it before the socket closes: kept for the close. */
#define SOL_SOCKET 1
#define SO_ERROR 4
SEC("cgroup/getsockopt")
int connect_error(struct bpf_sockopt *ctx)
{
	/* Kernels before 6.5 fail a getsockopt whose value exceeds a page
	 * unless the program gives the buffer back (optlen 0): runs for every
	 * getsockopt of every process, so never in the way. */
	if (ctx->optlen > 4096) {
		ctx->optlen = 0;
		return 1;
	}
	if (ctx->level != SOL_SOCKET || ctx->optname != SO_ERROR)
		return 1;
	struct bpf_sock *sk = ctx->sk;
	if (!sk || sk->protocol != IPPROTO_TCP || sk->state != TCP_SYN_SENT)
		return 1;
	int *val = ctx->optval;
	if ((void *)(val + 1) > ctx->optval_end || *val == 0)
		return 1;
	/* Most connects have no storage (see tcp_established): a failing one
	 * gets some, for this error only. */
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st)
		st->connect_err = *val;
	return 1;
}

/* ---- listeners ---- */

static __always_inline __u32 listen_drops(struct sock *sk)
{
	__u32 d = (__u32)sk->sk_drops.counter;
	if (bpf_core_field_exists(sk->sk_drop_counters)) {
		struct numa_drop_counters *c = BPF_CORE_READ(sk, sk_drop_counters);
		if (c)
			d += (__u32)BPF_CORE_READ(c, drops0.counter) + (__u32)BPF_CORE_READ(c, drops1.counter);
	}
	return d;
}

static __always_inline void listener_tag(struct sock *sk, __u32 pid, const char *comm, __u64 cgroup)
{
	struct sock_state *st = new_state(sk);
	if (!st || st->kind == SK_LISTENER)
		return;
	__builtin_memset(st, 0, sizeof(*st));
	st->kind = SK_LISTENER;
	st->key.netns = sk_netns(sk);
	st->key.proto = IPPROTO_TCP;
	st->key.direction = DIR_INBOUND;
	st->key.port = sk->__sk_common.skc_num;
	fill_addrs(sk, &st->key);
	st->pid = pid;
	if (comm)
		__builtin_memcpy(st->comm, comm, sizeof(st->comm));
	st->cgroup_id = cgroup;
	st->rep_drops = listen_drops(sk);
}

/* ---- UDP: datagrams, per call ---- */

/* A UDP socket bound to a port its program chose (not 0) is a server. */
static __always_inline __u8 udp_direction(const struct sock *sk)
{
	return bound_direction(sk);
}

static __always_inline void udp_key_dir(const struct sock *sk, struct flow_key *k, __u16 rport, __u8 dir)
{
	k->netns = sk_netns(sk);
	k->proto = IPPROTO_UDP;
	k->direction = dir;
	k->port = dir == DIR_INBOUND ? sk->__sk_common.skc_num : rport;
}

static __always_inline void udp_key(const struct sock *sk, struct flow_key *k, __u16 rport)
{
	udp_key_dir(sk, k, rport, udp_direction(sk));
}

/* Fold a connected UDP socket's counters into its flow. */
static __always_inline void udp_fold(struct sock_state *st)
{
	if (!st->udp_dport)
		return;
	__u64 bs = st->udp_bytes_sent ? __sync_lock_test_and_set(&st->udp_bytes_sent, 0) : 0;
	__u64 br = st->udp_bytes_received ? __sync_lock_test_and_set(&st->udp_bytes_received, 0) : 0;
	__u64 ds = st->udp_dgrams_sent ? __sync_lock_test_and_set(&st->udp_dgrams_sent, 0) : 0;
	__u64 dr = st->udp_dgrams_received ? __sync_lock_test_and_set(&st->udp_dgrams_received, 0) : 0;
	/* A datagram adds its bytes before its count: a fold between the two
	 * takes bytes without a datagram, which must not be dropped. */
	if (!bs && !br && !ds && !dr)
		return;
	struct flow_value *v = flow_entry(&st->key);
	if (!v)
		return;
	__sync_fetch_and_add(&v->bytes_sent, bs);
	__sync_fetch_and_add(&v->bytes_received, br);
	__sync_fetch_and_add(&v->datagrams_sent, ds);
	__sync_fetch_and_add(&v->datagrams_received, dr);
	name_flow(v, st);
}

static __always_inline bool same_peer(const struct sock *sk, const struct sock_state *st)
{
	const __u32 *a = (const __u32 *)st->udp_daddr;
	if (sk->__sk_common.skc_dport != st->udp_dport)
		return false;
	if (sk->__sk_common.skc_family == AF_INET6)
		return a[0] == sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0] &&
		       a[1] == sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1] &&
		       a[2] == sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2] &&
		       a[3] == sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
	return a[3] == sk->__sk_common.skc_daddr;
}

/* One datagram straight into a flow, named by the process at hand. */
static __always_inline void add_datagram(struct flow_value *v, int bytes, bool send)
{
	if (send) {
		__sync_fetch_and_add(&v->bytes_sent, bytes);
		__sync_fetch_and_add(&v->datagrams_sent, 1);
	} else {
		__sync_fetch_and_add(&v->bytes_received, bytes);
		__sync_fetch_and_add(&v->datagrams_received, 1);
	}
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (v->pid != tgid)
		current_process(&v->pid, v->comm, &v->cgroup_id);
}

/* Count one datagram of a connected socket straight into its flow. */
static __always_inline void udp_count_direct(struct sock *sk, int bytes, bool send)
{
	struct flow_key k = {};
	udp_key(sk, &k, bpf_ntohs(sk->__sk_common.skc_dport));
	fill_addrs(sk, &k);
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	add_datagram(v, bytes, send);
}

/* Whether a connected socket without storage has sent lately on this CPU
 * (and remember that it has now). */
static __always_inline bool udp_sent_before(struct sock *sk)
{
	/* The connection's ports and peer, not the socket's address (a new
	 * socket often gets the memory of the one just closed) nor its cookie
	 * (making one is a helper call and an atomic, a fifth of this
	 * program's time in a profile): a new socket's ephemeral port makes
	 * it new. One that reuses a recent sender's ports and peer is taken
	 * for it, and gets storage one datagram early: a cost, never a
	 * miscount. */
	__u64 tag = (__u64)sk->__sk_common.skc_portpair << 32;
	if (sk->__sk_common.skc_family == AF_INET6)
		tag ^= sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0] ^ sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1] ^
		       sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2] ^ sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
	else
		tag ^= sk->__sk_common.skc_daddr;
	__u32 slot = (__u32)((tag * 0x9E3779B97F4A7C15ULL) >> 56) & (SENDERS_SLOTS - 1);
	__u64 *seen = bpf_map_lookup_elem(&recent_senders, &slot);
	if (!seen)
		return false;
	if (*seen == tag)
		return true;
	*seen = tag;
	return false;
}

/* A connected socket: its first datagrams count straight into the flow (a
 * one-query socket, as a DNS client's, never pays for storage); a socket
 * that sends again gets storage, then counts there with no hash lookup.
 * Its identity is built once, and again only if it connects elsewhere. */
static __always_inline void udp_count_connected(struct sock *sk, struct sock_state *st, int bytes, bool send)
{
	if (!st) {
		if (!send || !udp_sent_before(sk)) {
			udp_count_direct(sk, bytes, send);
			return;
		}
		st = new_state(sk);
		if (!st)
			return;
	}
	if (st->kind != SK_UDP || !same_peer(sk, st)) {
		udp_fold(st); /* the previous peer's counts */
		__builtin_memset(st, 0, sizeof(*st));
		st->kind = SK_UDP;
		udp_key(sk, &st->key, bpf_ntohs(sk->__sk_common.skc_dport));
		fill_addrs(sk, &st->key);
		__builtin_memcpy(st->udp_daddr, st->key.remote_addr, sizeof(st->udp_daddr));
		if (sk->__sk_common.skc_family == AF_INET6)
			copy16(st->udp_daddr, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32);
		else
			((__u32 *)st->udp_daddr)[3] = sk->__sk_common.skc_daddr;
		st->udp_dport = sk->__sk_common.skc_dport;
	}
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (st->pid != tgid)
		current_process(&st->pid, st->comm, &st->cgroup_id);
	if (send) {
		__sync_fetch_and_add(&st->udp_bytes_sent, bytes);
		__sync_fetch_and_add(&st->udp_dgrams_sent, 1);
	} else {
		__sync_fetch_and_add(&st->udp_bytes_received, bytes);
		__sync_fetch_and_add(&st->udp_dgrams_received, 1);
	}
}

/* Whether the datagram in flight on an unconnected socket has the peer
 * its storage counts for. */
static __always_inline bool first_peer(const struct sock_state *st)
{
	const __u32 *a = (const __u32 *)st->udp_daddr, *b = (const __u32 *)st->peer;
	return st->peer_port == st->udp_dport && a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* An unconnected socket bound to a port the kernel chose, before it has
 * a role: a client (sendto from an ephemeral port) or a server bound to
 * port 0 behind a NAT rule (Docker's embedded DNS, whose NAT rule sends
 * 127.0.0.11:53 to the port dockerd's socket got). Who spoke first tells,
 * but only for a conversation that started while deptrace watched: the
 * first datagram deptrace sees may be the reply of one already under way
 * (a socket older than deptrace: a QUIC client's, a forwarder's answer to
 * a query received before the start). So the first peer's datagrams are
 * counted in the socket's storage (as a connected socket's, no hash
 * lookup; folded by the harvest and at release) under the client's key,
 * and the first datagram with another peer, which starts a conversation,
 * decides: received, the socket answers its peers and is the server, and
 * the first peer's counts move to the server's flow; sent, a client.
 * Returns whether the datagram was counted. */
static __always_inline bool udp_undecided(struct sock *sk, struct sock_state *st, int bytes, bool send)
{
	if (st->kind != SK_UDP || !st->udp_dport) {
		if (st->kind == SK_UDP)
			udp_fold(st); /* counts of an earlier connect() */
		st->kind = SK_UDP;
		st->udp_bytes_sent = 0;
		st->udp_bytes_received = 0;
		st->udp_dgrams_sent = 0;
		st->udp_dgrams_received = 0;
		udp_key_dir(sk, &st->key, bpf_ntohs(st->peer_port), DIR_OUTBOUND);
		fill_addrs(sk, &st->key);
		__builtin_memcpy(st->key.remote_addr, st->peer, sizeof(st->key.remote_addr));
		__builtin_memcpy(st->udp_daddr, st->peer, sizeof(st->udp_daddr));
		st->udp_dport = st->peer_port;
	} else if (!first_peer(st)) {
		if (send) {
			st->udp_role = UDP_ROLE_CLIENT;
			return false;
		}
		/* The key's port and direction share its first 8 bytes with
		 * netns and proto: one store changes them together, so a
		 * harvest folding meanwhile adds to one flow or the other. */
		struct flow_key head = {};
		head.netns = st->key.netns;
		head.port = sk->__sk_common.skc_num;
		head.proto = IPPROTO_UDP;
		head.direction = DIR_INBOUND;
		*(volatile __u64 *)&st->key = *(__u64 *)&head;
		st->udp_role = UDP_ROLE_SERVER;
		return false;
	}
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (st->pid != tgid)
		current_process(&st->pid, st->comm, &st->cgroup_id);
	if (send) {
		__sync_fetch_and_add(&st->udp_bytes_sent, bytes);
		__sync_fetch_and_add(&st->udp_dgrams_sent, 1);
	} else {
		__sync_fetch_and_add(&st->udp_bytes_received, bytes);
		__sync_fetch_and_add(&st->udp_dgrams_received, 1);
	}
	return true;
}

/* An unconnected socket: every datagram may have another peer, which the
 * cgroup hook of this same syscall saw. */
static __always_inline void udp_count_unconnected(struct sock *sk, struct sock_state *st, int bytes, bool send)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	if (!st || st->tid != tid) {
		stat_inc(STAT_UDP_PEER_UNKNOWN);
		return;
	}
	st->tid = 0;
	__u8 dir = udp_direction(sk);
	if (dir == DIR_OUTBOUND) {
		if (st->udp_role == UDP_ROLE_UNDECIDED && udp_undecided(sk, st, bytes, send))
			return;
		if (st->udp_role == UDP_ROLE_SERVER)
			dir = DIR_INBOUND;
	}
	struct flow_key k = {};
	udp_key_dir(sk, &k, bpf_ntohs(st->peer_port), dir);
	fill_addrs(sk, &k);
	__builtin_memcpy(k.remote_addr, st->peer, sizeof(k.remote_addr));
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	add_datagram(v, bytes, send);
}

static __always_inline void unix_count(struct sock *sk, int bytes, bool send);
static __always_inline __u64 unix_addr_hash(const void *addr, int addrlen, bool user);
/* A datagram sent to the unix path hashed h from an unconnected socket. */
static __always_inline void unix_count_sendto(struct sock *sk, __u64 h, int bytes);

static __always_inline void udp_datagram(struct sock *sk, int ret, int flags, bool send)
{
	/* TCP calls fire these tracepoints too: the socket counts its bytes
	 * itself; only a connection that lives on is tagged. */
	if (sk->sk_protocol == IPPROTO_TCP) {
		/* A connection with no storage may need tagging. One with some
		 * is tagged, or has another program's storage (another deptrace,
		 * say): look for ours during one jiffy in 32 (a random number
		 * per call costs several times more). */
		if (ret > 0 && (!sk->sk_bpf_storage || (bpf_jiffies64() & 31) == 0))
			tcp_tag_late(sk);
		return;
	}
	/* A peek is read again later; an error-queue read returns a sent
	 * datagram an ICMP error came back for (IP_RECVERR), not a new one. */
	if (ret < 0 || (flags & (MSG_PEEK | MSG_ERRQUEUE)))
		return;
	if (sk->__sk_common.skc_family == AF_UNIX) {
		if (netns_wanted(sk_netns(sk)))
			unix_count(sk, ret, send);
		return;
	}
	if (sk->sk_protocol != IPPROTO_UDP || !inet_family(sk))
		return;
	if (!netns_wanted(sk_netns(sk)))
		return;
	struct sock_state *st = sk->sk_bpf_storage ? bpf_sk_storage_get(&socks, sk, 0, 0) : NULL;
	if (sk->__sk_common.skc_dport)
		udp_count_connected(sk, st, ret, send);
	else
		udp_count_unconnected(sk, st, ret, send);
}

/* Sends and receives run in process context only: before 6.19 nothing
 * nests in them and they have no copies; from 6.19 they are preemptible
 * and the loader attaches copies (recmarks.h). */
SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send, struct sock *sk, int ret, int flags)
{
	if (rec_first_copy(ctx, STAT_REC_DEFERRED_SEND))
		udp_datagram(sk, ret, flags, true);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send_mid, struct sock *sk, int ret, int flags)
{
	if (rec_mid_copy(ctx, STAT_REC_RESCUED_SEND))
		udp_datagram(sk, ret, flags, true);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send_last, struct sock *sk, int ret, int flags)
{
	if (rec_last_copy(ctx, REC_SEND, STAT_REC_RESCUED_SEND))
		udp_datagram(sk, ret, flags, true);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv, struct sock *sk, int ret, int flags)
{
	if (rec_first_copy(ctx, STAT_REC_DEFERRED_RECV))
		udp_datagram(sk, ret, flags, false);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv_mid, struct sock *sk, int ret, int flags)
{
	if (rec_mid_copy(ctx, STAT_REC_RESCUED_RECV))
		udp_datagram(sk, ret, flags, false);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv_last, struct sock *sk, int ret, int flags)
{
	if (rec_last_copy(ctx, REC_RECV, STAT_REC_RESCUED_RECV))
		udp_datagram(sk, ret, flags, false);
	return 0;
}

/* Kernels before 6.3 have no sock_send_length/sock_recv_length
 * tracepoints: the loader attaches these at function exits instead, where
 * the kernel allows fexit (Debian's 6.1 does; kernels built without it
 * lose UDP and unix counting, and doctor says so). Same work, same
 * arguments. */
/* Sends: 6.1 inlines sock_sendmsg into its callers in net/socket.c, so an
 * fexit there misses most sends; the protocol's sendmsg, reached through a
 * function pointer, is never inlined. */
SEC("fexit/inet_sendmsg")
int BPF_PROG(on_inet_send_fexit, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	struct sock *sk = sock->sk;
	if (sk)
		udp_datagram(sk, ret, 0, true);
	return 0;
}

SEC("fexit/inet6_sendmsg")
int BPF_PROG(on_inet6_send_fexit, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	struct sock *sk = sock->sk;
	if (sk)
		udp_datagram(sk, ret, 0, true);
	return 0;
}

SEC("fexit/unix_stream_sendmsg")
int BPF_PROG(on_unix_stream_send_fexit, struct socket *sock, struct msghdr *msg, size_t len, int ret)
{
	struct sock *sk = sock->sk;
	if (sk)
		udp_datagram(sk, ret, 0, true);
	return 0;
}

SEC("fexit/unix_dgram_sendmsg")
int BPF_PROG(on_unix_dgram_send_fexit, struct socket *sock, struct msghdr *msg, size_t len, int ret)
{
	struct sock *sk = sock->sk;
	if (!sk)
		return 0;
	/* A datagram sent to a path (its kernel copy is msg_name): where
	 * cgroup/sendmsg_unix is missing, this is where the path is seen. */
	struct unix_sock *u = bpf_skc_to_unix_sock(sk);
	if (u && !u->peer && msg->msg_name && ret > 0) {
		if (netns_wanted(sk_netns(sk))) {
			__u64 h = unix_addr_hash(msg->msg_name, msg->msg_namelen, false);
			if (h)
				unix_count_sendto(sk, h, ret);
		}
		return 0;
	}
	if (!send_tracepoint_on)
		udp_datagram(sk, ret, 0, true);
	return 0;
}

SEC("fexit/sock_recvmsg")
int BPF_PROG(on_recv_fexit, struct socket *sock, struct msghdr *msg, int flags, int ret)
{
	struct sock *sk = sock->sk;
	if (sk)
		udp_datagram(sk, ret, flags, false);
	return 0;
}

/* ---- unix-domain sockets, per call ---- */

/* FNV-1a of the path's len bytes: the key of a unix flow's server. */
static __always_inline __u64 unix_path_hash(const struct unix_path *p)
{
	__u64 h = 0xcbf29ce484222325ULL;
	for (int i = 0; i < (int)sizeof(p->path); i++) {
		if (i >= (int)p->len)
			break;
		h ^= (__u8)p->path[i];
		h *= 0x100000001b3ULL;
	}
	return h ? h : 1;
}

/* Hash a unix address's path, copying it into out. 0: unnamed. A bound
 * path's length includes its terminating 0 (the kernel stores it so); an
 * abstract name (leading 0) uses every byte. */
static __always_inline __u64 unix_path_of(struct unix_address *a, struct unix_path *out)
{
	int len = a->len - (int)sizeof(__kernel_sa_family_t);
	if (len <= 0)
		return 0;
	if (len > (int)sizeof(out->path))
		len = sizeof(out->path);
	if (bpf_probe_read_kernel(out->path, sizeof(out->path), &a->name[0].sun_path))
		return 0;
	out->len = len;
	return unix_path_hash(out);
}

static __always_inline bool unix_autobound(struct unix_address *a)
{
	char first = 1;
	if (a->len != (int)sizeof(__kernel_sa_family_t) + 6)
		return false;
	bpf_probe_read_kernel(&first, 1, &a->name[0].sun_path);
	return first == 0;
}

/* The first call on a unix socket finds its dependency: the server's path
 * is the name of whichever end is named. A connecting (or sending) socket
 * is rarely bound, its peer is: outbound, named by the peer. A server's
 * accepted socket carries the listener's name and its peer none: inbound.
 * Two unnamed ends (socketpair) are no service and are not counted. */
static __always_inline struct sock_state *unix_state(struct sock *sk, struct unix_sock *u)
{
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st && st->kind == SK_UNIX)
		return st;
	struct unix_address *own = u->addr;
	struct unix_address *peer_addr = NULL;
	struct sock *peer = u->peer;
	if (peer) {
		struct unix_sock *pu = bpf_skc_to_unix_sock(peer);
		if (pu)
			peer_addr = pu->addr;
	}
	/* A name the kernel gave a socket itself (autobind: a NUL and five hex
	 * digits, as SO_PASSCRED clients get) does not make it a service. */
	if (peer_addr && unix_autobound(peer_addr))
		peer_addr = NULL;
	if (own && unix_autobound(own))
		own = NULL;
	struct unix_address *srv = peer_addr ? peer_addr : own;
	if (!srv)
		return NULL;
	/* On the stack: a per-CPU buffer would be shared with preempted
	 * runs (7.x tracepoints, cgroup hooks) on the same CPU. */
	struct unix_path path = {};
	struct unix_path *p = &path;
	__u64 h = unix_path_of(srv, p);
	if (!h)
		return NULL;
	bpf_map_update_elem(&unix_paths, &h, p, BPF_ANY);
	st = new_state(sk);
	if (!st)
		return NULL;
	__builtin_memset(st, 0, sizeof(*st));
	st->kind = SK_UNIX;
	st->key.netns = sk_netns(sk);
	st->key.proto = PROTO_UNIX;
	st->key.direction = peer_addr ? DIR_OUTBOUND : DIR_INBOUND;
	__builtin_memcpy(st->key.remote_addr, &h, sizeof(h));
	return st;
}

static __always_inline int read_addr(void *dst, __u32 size, const void *src, bool user)
{
	return user ? bpf_probe_read_user(dst, size, src) : bpf_probe_read_kernel(dst, size, src);
}

static __always_inline void name_from_current(struct flow_value *v)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (v->pid != tgid)
		current_process(&v->pid, v->comm, &v->cgroup_id);
}

/* The hash of a unix sockaddr's path, kept in unix_paths; 0 if none.
 * A filesystem path is taken up to its 0, which is part of the name as the
 * kernel keeps a bound path (the caller need not pass it). */
static __always_inline __u64 unix_addr_hash(const void *addr, int addrlen, bool user)
{
	__u32 n = addrlen - (int)sizeof(__kernel_sa_family_t);
	if ((int)n <= 0)
		return 0;
	if (n > sizeof(((struct unix_path *)0)->path))
		n = sizeof(((struct unix_path *)0)->path);
	struct unix_path path = {}; /* on the stack, as in unix_state */
	struct unix_path *p = &path;
	/* A fixed-size read (6.1's verifier loses a variable size's bounds):
	 * a kernel copy is a whole sockaddr_storage, and callers pass a whole
	 * sockaddr_un. Bytes past n are not part of the name. */
	if (read_addr(p->path, sizeof(p->path), (const char *)addr + sizeof(__kernel_sa_family_t), user))
		return 0;
	if (p->path[0]) {
		__u32 len = n;
		for (__u32 i = 0; i < sizeof(p->path); i++) {
			if (i >= n)
				break;
			if (!p->path[i]) {
				len = i;
				break;
			}
		}
		if (len < sizeof(p->path)) {
			p->path[len] = 0;
			len++;
		}
		p->len = len;
	} else {
		p->len = n;
	}
	__u64 h = unix_path_hash(p);
	bpf_map_update_elem(&unix_paths, &h, p, BPF_ANY);
	return h;
}

/* The current process's flow to the unix path hashed h, named by it. */
static __always_inline struct flow_value *unix_client_flow(__u32 netns, __u64 h)
{
	struct flow_key k = {};
	k.netns = netns;
	k.proto = PROTO_UNIX;
	k.direction = DIR_OUTBOUND;
	__builtin_memcpy(k.remote_addr, &h, sizeof(h));
	struct flow_value *v = flow_entry(&k);
	if (v)
		name_from_current(v);
	return v;
}

static __always_inline void unix_count_sendto(struct sock *sk, __u64 h, int bytes)
{
	struct flow_value *v = unix_client_flow(BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum), h);
	if (!v)
		return;
	__sync_fetch_and_add(&v->datagrams_sent, 1);
	__sync_fetch_and_add(&v->bytes_sent, bytes);
}

static __always_inline void unix_count(struct sock *sk, int bytes, bool send)
{
	struct unix_sock *u = bpf_skc_to_unix_sock(sk);
	if (!u)
		return;
	if (send && !u->peer && sk->sk_type == SOCK_DGRAM) {
		/* sendto(path) on an unconnected socket: the path came from
		 * cgroup/sendmsg_unix in the same system call. */
		struct sock_state *st = sk->sk_bpf_storage ? bpf_sk_storage_get(&socks, sk, 0, 0) : NULL;
		if (st && st->unix_dest && st->tid == (__u32)bpf_get_current_pid_tgid()) {
			__u64 h = st->unix_dest;
			st->unix_dest = 0;
			unix_count_sendto(sk, h, bytes);
		}
		return;
	}
	struct sock_state *st = unix_state(sk, u);
	if (!st)
		return;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (st->pid != tgid)
		current_process(&st->pid, st->comm, &st->cgroup_id);
	struct flow_value *v = flow_entry(&st->key);
	if (!v)
		return;
	bool datagram = sk->sk_type == SOCK_DGRAM;
	if (!datagram && !st->counting) {
		/* A stream connection counts once, at its first data. */
		st->counting = 1;
		__sync_fetch_and_add(&v->connections, 1);
	}
	if (send) {
		__sync_fetch_and_add(&v->bytes_sent, bytes);
		if (datagram)
			__sync_fetch_and_add(&v->datagrams_sent, 1);
	} else {
		__sync_fetch_and_add(&v->bytes_received, bytes);
		if (datagram)
			__sync_fetch_and_add(&v->datagrams_received, 1);
	}
	name_flow(v, st);
	/* The process at the other end: whoever last used the peer socket
	 * (the server that accepted and serves the connection, not merely the
	 * one that created the listener). */
	struct sock *peer = u->peer;
	if (peer) {
		struct sock_state *ps = bpf_sk_storage_get(&socks, peer, 0, 0);
		if (ps && ps->pid && v->peer_pid != ps->pid) {
			v->peer_pid = ps->pid;
			__builtin_memcpy(v->peer_comm, ps->comm, sizeof(v->peer_comm));
		}
	}
}

/* ---- connects that fail inside connect() ----
 *
 * A unix connect that finds no listener, and a TCP connect refused before
 * any SYN (no route, a prohibit route, a policy), change no socket state
 * that a tracepoint shows: only connect()'s return value tells. Where
 * fexit works it gives that value per family at no cost to other system
 * calls; elsewhere the connect system call's exit tracepoint does (which
 * puts every system call of every task through the kernel's slower exit
 * path while attached: see docs/design.md). Both read the sockaddr the
 * caller passed, a kernel copy for fexit and user memory for the
 * tracepoint. */

/* A unix connect to path addr failed with err. Read through probes: the
 * system call path has only an untyped socket. */
static __always_inline void unix_connect_failed(struct sock *sk, const void *addr, int addrlen, bool user, int err)
{
	switch (err) {
	case ECONNREFUSED:
	case ENOENT:
	case EPROTOTYPE:
	case EAGAIN:
	case ETIMEDOUT:
	case EINTR: /* not ERESTARTSYS: the kernel restarts that connect, which may succeed */
	case EACCES:
	case EPERM:
		break;
	default:
		return; /* the caller's own mistake (EINVAL, EISCONN...): no dependency */
	}
	__u32 netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_wanted(netns))
		return;
	__u64 h = unix_addr_hash(addr, addrlen, user);
	if (!h)
		return;
	struct flow_value *v = unix_client_flow(netns, h);
	if (v)
		count_failed_errno(v, err);
}

/* A TCP connect that failed before its SYN: the state machine never left
 * CLOSE and the socket sent nothing. Other errors of connect() (refused,
 * timed out, and even unreachable after a SYN) went through SYN_SENT and
 * were counted there. */
static __always_inline void tcp_connect_failed_early(struct sock *sk, const void *addr, bool user, int err)
{
	if (err != ENETUNREACH && err != EHOSTUNREACH && err != EACCES && err != EPERM)
		return;
	if (BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP || BPF_CORE_READ(sk, __sk_common.skc_state) != TCP_CLOSE)
		return;
	/* No initial sequence number yet: the connect never reached SYN_SENT
	 * (which chooses it). A failure after a SYN leaves one, even after
	 * tcp_disconnect (which resets segs_out, but moves write_seq on). */
	if (BPF_CORE_READ((struct tcp_sock *)sk, write_seq))
		return;
	__u32 netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_wanted(netns))
		return;
	struct sockaddr_in6 sa = {};
	if (read_addr(&sa, sizeof(sa), addr, user))
		return;
	struct flow_key k = {};
	k.netns = netns;
	k.proto = IPPROTO_TCP;
	k.direction = DIR_OUTBOUND;
	k.port = bpf_ntohs(sa.sin6_port);
	if (sa.sin6_family == AF_INET) {
		set_v4mapped(k.remote_addr, ((struct sockaddr_in *)&sa)->sin_addr.s_addr);
		set_v4mapped(k.local_addr, BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr));
	} else if (sa.sin6_family == AF_INET6) {
		__builtin_memcpy(k.remote_addr, &sa.sin6_addr, 16);
		BPF_CORE_READ_INTO(&k.local_addr, sk, __sk_common.skc_v6_rcv_saddr);
	} else {
		return;
	}
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	count_failed_errno(v, err);
	name_from_current(v);
}

/* from_syscall: the system call's tracepoint, which leaves alone what a
 * running fexit counts. */
static __always_inline void connect_returned(struct sock *sk, const void *addr, int addrlen, bool from_syscall, long ret)
{
	if (ret >= 0 || ret == -EINPROGRESS || !sk || !addr)
		return;
	__u32 skip = from_syscall ? connect_fexits : 0;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (family == AF_UNIX) {
		__u16 type = BPF_CORE_READ(sk, sk_type);
		if (type == SOCK_DGRAM ? (skip & CONNECT_FEXIT_UNIX_DGRAM) : (skip & CONNECT_FEXIT_UNIX_STREAM))
			return;
		if (type == SOCK_STREAM || type == SOCK_SEQPACKET || type == SOCK_DGRAM)
			unix_connect_failed(sk, addr, addrlen, from_syscall, -ret);
	} else if ((family == AF_INET || family == AF_INET6) && !(skip & CONNECT_FEXIT_INET)) {
		tcp_connect_failed_early(sk, addr, from_syscall, -ret);
	}
}

SEC("fexit/unix_stream_connect")
int BPF_PROG(on_unix_connect_fexit, struct socket *sock, struct sockaddr *uaddr, int addr_len, int flags, int ret)
{
	connect_returned(sock->sk, uaddr, addr_len, false, ret);
	return 0;
}

SEC("fexit/unix_dgram_connect")
int BPF_PROG(on_unix_dgram_connect_fexit, struct socket *sock, struct sockaddr *uaddr, int addr_len, int flags, int ret)
{
	connect_returned(sock->sk, uaddr, addr_len, false, ret);
	return 0;
}

SEC("fexit/inet_stream_connect")
int BPF_PROG(on_inet_connect_fexit, struct socket *sock, struct sockaddr *uaddr, int addr_len, int flags, int ret)
{
	connect_returned(sock->sk, uaddr, addr_len, false, ret);
	return 0;
}

/* syscalls/sys_exit_connect's record */
struct connect_exit_args {
	__u64 common;
	int nr;
	int _pad;
	long ret;
};

SEC("tracepoint/syscalls/sys_exit_connect")
int on_connect_exit(struct connect_exit_args *ctx)
{
	long ret = ctx->ret;
	if (ret >= 0 || ret == -EINPROGRESS)
		return 0; /* nearly every connect: leave at once */
	struct task_struct *t = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	/* connect(fd, addr, addrlen): the system call's own arguments, in
	 * x86-64's registers (elsewhere this program fails to load, and doctor
	 * says so). */
	int fd = BPF_CORE_READ(regs, di);
	const void *addr = (const void *)BPF_CORE_READ(regs, si);
	int addrlen = BPF_CORE_READ(regs, dx);
	struct fdtable *fdt = BPF_CORE_READ(t, files, fdt);
	if (fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	if (!f)
		return 0;
	/* connect() gave one of the errors above only for a socket */
	struct socket *so = BPF_CORE_READ(f, private_data);
	struct sock *sk = BPF_CORE_READ(so, sk);
	connect_returned(sk, addr, addrlen, true, ret);
	return 0;
}

/* ---- UDP peers of unconnected sockets (socket-address layer) ---- */

static __always_inline struct sock_state *peer_slot(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_UDP || !ctx->sk)
		return NULL;
	struct sock_state *st = bpf_sk_storage_get(&socks, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		stat_inc(STAT_SOCK_STORAGE_FAILED);
		return NULL;
	}
	st->tid = (__u32)bpf_get_current_pid_tgid();
	st->peer_port = (__u16)ctx->user_port;
	return st;
}

static __always_inline void remember_peer4(struct bpf_sock_addr *ctx)
{
	struct sock_state *st = peer_slot(ctx);
	if (st)
		set_v4mapped(st->peer, ctx->user_ip4);
}

static __always_inline void remember_peer6(struct bpf_sock_addr *ctx)
{
	struct sock_state *st = peer_slot(ctx);
	if (!st)
		return;
	__u32 *a = (__u32 *)st->peer;
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
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

/* sendto(path) on an unconnected unix datagram socket (Linux 6.7+): the
 * path, for the send tracepoint of the same system call. */
SEC("cgroup/sendmsg_unix")
int unix_sendmsg(struct bpf_sock_addr *ctx)
{
	struct bpf_sock_addr_kern *sa = bpf_cast_to_kern_ctx(ctx);
	if (!ctx->sk || ctx->type != SOCK_DGRAM)
		return 1;
	struct sock *sk = sa->sk;
	if (!netns_wanted(BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum)))
		return 1;
	__u64 h = unix_addr_hash(sa->uaddr, sa->uaddrlen, false);
	if (!h)
		return 1;
	struct sock_state *st = bpf_sk_storage_get(&socks, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		stat_inc(STAT_SOCK_STORAGE_FAILED);
		return 1;
	}
	st->tid = (__u32)bpf_get_current_pid_tgid();
	st->unix_dest = h;
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

/* A connected UDP socket's last counts, before its storage goes. Runs for
 * every inet socket; everything but UDP leaves at the first test. */
SEC("cgroup/sock_release")
int udp_release(struct bpf_sock *ctx)
{
	if (ctx->protocol != IPPROTO_UDP)
		return 1;
	struct sock_state *st = bpf_sk_storage_get(&socks, ctx, 0, 0);
	if (st && st->kind == SK_UDP)
		udp_fold(st);
	return 1;
}

/* ---- the drain-time harvest: every socket deptrace tagged ---- */

/* Fold one tagged socket's growth into the flows; report a listener. */
static __always_inline void harvest_sock(struct sock *sk, struct sock_state *st, struct seq_file *seq)
{
	if (st->kind == SK_TCP) {
		/* A connection tagged while already counting is left alone for
		 * its first 10 ms: a close racing with the tag has counted it. */
		if (st->counting && (!st->tagged_ns || bpf_ktime_get_ns() - st->tagged_ns > TAG_SETTLE_NS))
			tcp_fold(sk, st, false, 0);
	} else if (st->kind == SK_UDP) {
		udp_fold(st);
	} else if (st->kind == SK_LISTENER) {
		if (sk->__sk_common.skc_state != TCP_LISTEN)
			return;
		struct listener_record r = {};
		r.netns = st->key.netns;
		r.port = st->key.port;
		__builtin_memcpy(r.local_addr, st->key.local_addr, sizeof(r.local_addr));
		r.backlog_limit = sk->sk_max_ack_backlog;
		r.queue = sk->sk_ack_backlog;
		r.drops = advance32(&st->rep_drops, listen_drops(sk));
		r.pid = st->pid;
		__builtin_memcpy(r.comm, st->comm, sizeof(r.comm));
		struct port_value *pv = port_lookup(r.netns, r.port);
		if (pv) {
			/* The deepest queue since the last harvest, per port: the
			 * first listener of the port this harvest visits takes it,
			 * and every listener of the port reports it. */
			if (pv->harvest_gen != harvest_gen) {
				pv->queue_reported = __sync_lock_test_and_set(&pv->queue_max, 0);
				pv->harvest_gen = harvest_gen;
			}
			r.queue_max = pv->queue_reported;
			if (!r.pid && pv->pid) {
				/* Listening since before deptrace started: user space
				 * named its process in the port table at start-up. */
				r.pid = pv->pid;
				__builtin_memcpy(r.comm, pv->comm, sizeof(r.comm));
			}
		}
		bpf_seq_write(seq, &r, sizeof(r));
	}
}

SEC("iter/bpf_sk_storage_map")
int harvest(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct sock *sk = ctx->sk;
	if (!sk || !ctx->value)
		return 0;
	/* The same storage as ctx->value, but as a map value: 6.1's verifier
	 * takes no iterator buffer as a map key (the flow key lives here). */
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st)
		harvest_sock(sk, st, ctx->meta->seq);
	return 0;
}

/* The same harvest through the socket tables, one namespace per run, for
 * kernels whose socket-storage map iterator is unsafe (7.0 and later, see
 * docs/install.md): it costs a walk of each namespace's tables. */
SEC("iter/tcp")
int harvest_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	if (!skc)
		return 0;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0; /* time-wait and request sockets: never tagged */
	struct sock *sk = (struct sock *)tp;
	if (!sk->sk_bpf_storage)
		return 0;
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st)
		harvest_sock(sk, st, ctx->meta->seq);
	return 0;
}

SEC("iter/udp")
int harvest_udp(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;
	if (!sk || !sk->sk_bpf_storage)
		return 0;
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st)
		harvest_sock(sk, st, ctx->meta->seq);
	return 0;
}

/* ---- start-up: sockets that existed before deptrace started ---- */

/* Pass 1, per namespace: listening ports (user space fills the port table
 * from these records) and listener storage. */
SEC("iter/tcp")
int seed_listeners(struct bpf_iter__tcp *ctx)
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
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (tp) {
		struct socket *sock = tp->inet_conn.icsk_inet.sk.sk_socket;
		if (sock && sock->file)
			r.ino = sock->file->f_inode->i_ino;
		listener_tag((struct sock *)tp, 0, NULL, 0);
		struct port_key pk = {.netns = r.netns, .port = r.port, .proto = IPPROTO_TCP};
		struct port_value init = {};
		struct port_value *pv = lookup_or_init(&ports, &pk, &init, STAT_PORT_MAP_FULL);
		if (pv)
			remember_listener(pv, (struct sock *)tp);
	}
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}

/* Pass 2, per namespace, after the port table is seeded: tag open
 * connections so that their bytes count from now on (bytes moved before
 * deptrace started are not counted; neither is the open). The iterator
 * holds each socket's lock, so a concurrent ESTABLISHED cannot be tagged
 * twice. */
SEC("iter/tcp")
int tag_connections(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	if (!skc)
		return 0;
	int state = skc->skc_state;
	if (state == TCP_LISTEN || state == TCP_CLOSE || state == TCP_SYN_SENT || state == TCP_SYN_RECV ||
	    state == TCP_TIME_WAIT || state == TCP_NEW_SYN_RECV)
		return 0;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	struct sock *sk = (struct sock *)tp;
	if (!inet_family(sk) || !netns_wanted(sk_netns(sk)))
		return 0;
	struct sock_state *st = new_state(sk);
	if (!st || st->kind)
		return 0;
	st->kind = SK_TCP;
	__u8 dir = port_lookup(sk_netns(sk), sk->__sk_common.skc_num) ? DIR_INBOUND : DIR_OUTBOUND;
	tcp_key(sk, &st->key, dir);
	tcp_start_counting(st, tp, false);
	st->tagged_ns = bpf_ktime_get_ns(); /* its close may be racing (see tcp_tag_late) */
	return 0;
}

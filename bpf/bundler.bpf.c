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
#include "dns.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Referenced here so the shared types land in BTF for bpf2go. */
const struct flow_key *_btf_flow_key __attribute__((unused));
const struct flow_value *_btf_flow_value __attribute__((unused));
const struct port_key *_btf_port_key __attribute__((unused));
const struct port_value *_btf_port_value __attribute__((unused));
const struct listen_record *_btf_listen_record __attribute__((unused));
const struct listener_record *_btf_listener_record __attribute__((unused));
const enum stat_index *_btf_stat_index __attribute__((unused));
const enum pid_naming *_btf_pid_naming __attribute__((unused));
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

/* Set by the loader from before the programs attach until Seed has tagged
 * the connections open at start: until then a busy connection is left to
 * the seed (its bytes count from the start), not tagged late as if
 * deptrace had seen it open (its bytes would count from its open). */
volatile __u32 seed_pending = 0;

extern void *bpf_cast_to_kern_ctx(void *) __ksym;

/* A new flow's first value, kept off the 512-byte stack. */
const volatile struct flow_value zero_flow = {};

/* The bundled-flow maps: two of this shape, in fixed slots. Programs
 * count interval n into map n & 1 (interval_now); the drain of interval n
 * makes them count n + 1 into the other map, then waits for an RCU grace
 * period (updating a slot of this outer array waits for one), so that no
 * program still writes to map n & 1 when it is read: no entry and no
 * increment is lost between intervals. The map is not reset after it is
 * read: its values carry the interval they count (flow_value.gen), and the
 * first program to touch one in interval n + 2 zeroes it.
 *
 * One value per flow, shared by every CPU (programs add atomically, as to
 * the spill), not one per CPU: a hot flow that holds a slot of the per-CPU
 * flow cache in front of it is counted there, and with many flows a
 * per-CPU value was the cost: each lookup a cold line on a page of its
 * own, memory growing with the CPUs, the drain copying every CPU's
 * (docs/performance.md). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 2);
	__type(key, __u32);
	/* clang-format off */
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__uint(max_entries, 65536);
		__type(key, struct flow_key);
		__type(value, struct flow_value);
	});
	/* clang-format on */
} flows SEC(".maps");

/* The spill: where a flow goes when its insert into the active flow map
 * fails, or its value is being zeroed for the interval by another program
 * (GEN_CLAIMING). A hash without preallocation takes each new entry from a
 * per-CPU cache that the kernel refills asynchronously, so a burst of
 * inserts on one CPU can find it empty (-ENOMEM); an insert nested in an
 * update of the same map on one CPU fails too (-EBUSY), and a full map
 * (-E2BIG).
 * The spill is preallocated and never fails that way: its slots are
 * claimed by compare-and-swap and shared by every CPU (programs add to
 * them atomically). Half i goes with flow map i: interval n spills into
 * half n & 1, so the drain's grace period also quiesces the old half, which
 * the drain then reads and frees (its map is only read). Two programs
 * racing to claim one key may take two slots: the drain sums every slot
 * and map entry of a key. Only when a key finds no slot is the count lost,
 * and counted. */
/* Slots per half, a power of two: the loader sizes the spill from the
 * flow map (internal/bundler SpillSlots: an eighth of it). When the flow
 * map held a value per CPU, whose allocator caches 3 free values per CPU,
 * inserts failed on a steady stream of new flows too (1,000 new UDP peers
 * a second lost 11 % with 256 slots); with one value per flow that load
 * needed no slot (docs/performance.md). */
const volatile __u32 spill_slots = 256;
#define SPILL_PROBES 8 /* slots tried from the key's hash */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * 256); /* the loader sets 2 * spill_slots */
	__type(key, __u32);
	__type(value, struct spill_slot);
} spill SEC(".maps");

/* The number of the interval programs count (from 1), written by user
 * space only: its parity picks the flow map, the spill half and the cache
 * half, and flow values carry it. A program reads it once per event, so
 * all three agree. A map rather than a global variable: it is pinned with
 * the flow maps, so that a process adopting a pinned side steers the
 * programs it adopts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} interval_now SEC(".maps");

/* Slots claimed per half: the drain reads a half only when it has some. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} spill_used SEC(".maps");

/* Which slots were claimed, in the order spill_used counted them, per
 * half: when few were, the drain looks up those alone rather than reading
 * the whole half (8,192 slots at the default size: 2.8-4.7 ms a drain). */
#define SPILL_MAX_SLOTS 65536 /* internal/bundler SpillSlots' largest */
struct spill_claims {
	__u32 slot[SPILL_MAX_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct spill_claims);
} spill_claims SEC(".maps");

/* Set by the loader (tests): flow_entry leaves new flows out of the flow
 * map and puts them in the spill, the path that otherwise runs only when
 * an insert fails (a flow finding no slot then counts as an allocation
 * failure). */
const volatile __u32 spill_only = 0;

const enum spill_state *_btf_spill_state __attribute__((unused)); /* for bpf2go */

/* In front of the flow map, a small direct-mapped cache per CPU: a flow
 * found there costs a hash of its key and a compare, where a lookup in the
 * flow map costs a hash, a walk of a bucket in a large table (a cache and
 * TLB miss once the table outgrows the cache), and the value: about 160 ns
 * of each of a short connection's four flow updates in this VM's profile
 * (measured when the map held a value per CPU). It also keeps a hot flow's
 * counts on each CPU's own line, where the map's one value is shared. A
 * slot goes to the first flow of the interval that
 * hashes to it, on that CPU; flows that find it taken use the map as
 * before. Slots use the spill's states and halves: half i goes with flow
 * map i (interval_now), so the drain's grace period quiesces the old half, which
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
/* The peer of one datagram in flight on an unconnected UDP socket, learnt
 * by the cgroup sendmsg/recvmsg hook and taken by the byte tracepoint of
 * the same system call, thread tid's. Sends and receives have slots of
 * their own, two each: a server answering one query on one thread while
 * another thread reads the next (dockerd's DNS forwarder does) or two
 * threads sending at once must not take each other's peer, which would
 * lose a datagram. */
struct udp_peer {
	__u32 tid;
	__u16 port; /* network byte order */
	__u16 pad;
	__u8 addr[16];
};
#define UDP_PEER_SLOTS 2

struct sock_state {
	struct flow_key key; /* the socket's bundled flow */
	__u32 kind;          /* enum sock_kind */
	__u32 pid;           /* thread-group id of the owning process */
	char comm[16];       /* its name */
	__u64 cgroup_id;
	__u64 syn_ns; /* TCP: connect() time, for the connect latency */
	/* TCP: the counters when deptrace started counting this connection */
	__u64 base_acked;
	__u64 base_received;
	__u32 base_una;
	__u32 counting; /* TCP: 1 from ESTABLISHED (or the start-up tag) until close */
	/* TCP: what was folded into flows so far */
	__u64 rep_sent;
	__u64 rep_received;
	__u64 last_raw_received; /* bytes_received at the previous drain */
	__u32 rep_retrans;
	__u32 open_pending; /* 1 while the open is not counted yet */
	__u32 latency_us;   /* connect latency of the pending open */
	__u32 connect_err;  /* TCP: an error the application read with SO_ERROR while connecting */
	__u64 tagged_ns;    /* TCP: when a connection already counting was tagged (0: at its start) */
	/* connected UDP: per-datagram counters, taken by exchange */
	__u64 udp_bytes_sent;
	__u64 udp_bytes_received;
	__u64 udp_dgrams_sent;
	__u64 udp_dgrams_received;
	__u8 udp_daddr[16]; /* the peer the key was built for */
	__u16 udp_dport;
	/* unconnected UDP: the peers of the datagrams in flight, sends and
	 * receives apart (udp_peer) */
	struct udp_peer inflight[2][UDP_PEER_SLOTS];
	/* unconnected unix datagram socket: the destination path's hash of
	 * the send in flight (thread tid), from cgroup/sendmsg_unix */
	__u32 tid;
	__u64 unix_dest;
	/* listeners: the drop counter already reported (32-bit, as the
	 * kernel's counter is, so a wrap is followed) */
	__u32 rep_drops;
	/* unconnected UDP bound to a port the kernel chose: enum udp_role */
	__u32 udp_role;
	/* unconnected UDP: its last sendto() went to port 53 (note_dns) */
	__u32 dns_asked;
};

/* Which end an unconnected UDP socket bound to a port the kernel chose is
 * (see udp_count_unconnected). */
enum udp_role {
	UDP_ROLE_UNDECIDED = 0, /* one peer so far: counted in storage, as a client */
	UDP_ROLE_CLIENT = 1,    /* sent first to its second peer */
	UDP_ROLE_SERVER = 2,    /* heard first from its second peer: it answers */
	UDP_ROLE_FRESH = 3,     /* bound while deptrace watched, nothing yet: its first datagram decides */
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
 * one-query socket is not). One small element holding every slot: 256
 * elements of a slot each put a third of on_send's samples, in a profile
 * of one-shot UDP sockets, on loading the element's pointer and then the
 * slot, each from a cold line. */
#define SENDERS_SLOT_BITS 6
#define SENDERS_SLOTS (1 << SENDERS_SLOT_BITS)
struct recent_senders {
	__u32 tag[SENDERS_SLOTS];
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct recent_senders);
} recent_senders SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* The DNS watcher's per-call programs (bpf/dns.bpf.c: dns_send,
 * dns_recv), which internal/dnswatch puts here when it runs: a send or
 * receive on a socket that may be a resolver's goes on in them by a tail
 * call, so every other call pays a port test, not a second program's
 * dispatch on the tracepoint (docs/performance.md, "DNS watching"). One
 * array per tracepoint: from 6.13 a tail call may only go to a program
 * of the same hook. Empty (the watcher is off): the call falls through. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} dns_send_calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} dns_recv_calls SEC(".maps");

/* The resolver notes of unconnected UDP sockets (dns_dests, struct
 * dns_dest), which udp_sendmsg4/6 write (note_dns) and the watcher's
 * programs, any variant, loaded with this map in place of their own,
 * read: with the tracer the watcher needs no sendmsg programs of its own. */
#include "dnsnote.bpf.h"

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

#define REC_ON_STALE() \
	do { \
	} while (0)
#include "recmarks.h"

enum rec_family { REC_STATE = 0,
	REC_SEND = 1,
	REC_RECV = 2,
	REC_FAMILIES = 3 };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REC_FAMILIES);
	__type(key, __u32);
	__type(value, __u32);
} rec_busy SEC(".maps");

/* The helpers, by concern; each header uses only the maps and settings
 * above and the headers before it. */
#include "sock.bpf.h"
#include "flow.bpf.h"
#include "copies.bpf.h"
#include "tcp.bpf.h"
#include "unix.bpf.h"
#include "udp.bpf.h"
#include "connect.bpf.h"
#include "harvest.bpf.h"

/* ---- TCP ---- */

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
	bool work = rec_task_marks ? tcp_state_wanted(sk, oldstate, newstate) && rec_last_copy(ctx, REC_STATE, STAT_REC_RESCUED_STATE) : rec_last_copy(ctx, REC_STATE, STAT_REC_RESCUED_STATE) && tcp_state_wanted(sk, oldstate, newstate);
	if (work)
		tcp_state_change(sk, oldstate, newstate);
	return 0;
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

/* ---- UDP datagrams and unix-domain data ---- */

/* Sends and receives run in process context only: before 6.19 nothing
 * nests in them and they have no copies; from 6.19 they are preemptible
 * and the loader attaches copies (recmarks.h). */

/* dns_hand_off ends the program in the DNS watcher's per-call program
 * (dns_send_calls above) when the call may be a resolver's (candidate:
 * udp_datagram's answer). It must come last: a tail call does not
 * return. */
#define dns_hand_off(ctx, candidate, calls) \
	do { \
		if (candidate) \
			bpf_tail_call(ctx, calls, 0); \
	} while (0)

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send, struct sock *sk, int ret, int flags)
{
	if (rec_first_copy(ctx, STAT_REC_DEFERRED_SEND)) {
		bool dns = udp_datagram(sk, ret, flags, true, true);
		dns_hand_off(ctx, dns, &dns_send_calls);
	}
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send_mid, struct sock *sk, int ret, int flags)
{
	if (rec_mid_copy(ctx, STAT_REC_RESCUED_SEND)) {
		bool dns = udp_datagram(sk, ret, flags, true, true);
		dns_hand_off(ctx, dns, &dns_send_calls);
	}
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send_last, struct sock *sk, int ret, int flags)
{
	if (rec_last_copy(ctx, REC_SEND, STAT_REC_RESCUED_SEND)) {
		bool dns = udp_datagram(sk, ret, flags, true, true);
		dns_hand_off(ctx, dns, &dns_send_calls);
	}
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv, struct sock *sk, int ret, int flags)
{
	if (rec_first_copy(ctx, STAT_REC_DEFERRED_RECV)) {
		bool dns = udp_datagram(sk, ret, flags, false, true);
		dns_hand_off(ctx, dns, &dns_recv_calls);
	}
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv_mid, struct sock *sk, int ret, int flags)
{
	if (rec_mid_copy(ctx, STAT_REC_RESCUED_RECV)) {
		bool dns = udp_datagram(sk, ret, flags, false, true);
		dns_hand_off(ctx, dns, &dns_recv_calls);
	}
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_recv_last, struct sock *sk, int ret, int flags)
{
	if (rec_last_copy(ctx, REC_RECV, STAT_REC_RESCUED_RECV)) {
		bool dns = udp_datagram(sk, ret, flags, false, true);
		dns_hand_off(ctx, dns, &dns_recv_calls);
	}
	return 0;
}

/* The fexit fallbacks of the byte tracepoints: one call on a socket
 * returned ret (bytes, or an error), as the tracepoints would report it. */
static __always_inline int socket_io(struct socket *sock, int ret, int flags, bool send)
{
	struct sock *sk = sock->sk;
	if (sk)
		udp_datagram(sk, ret, flags, send, false);
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
	return socket_io(sock, ret, 0, true);
}

SEC("fexit/inet6_sendmsg")
int BPF_PROG(on_inet6_send_fexit, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	return socket_io(sock, ret, 0, true);
}

SEC("fexit/unix_stream_sendmsg")
int BPF_PROG(on_unix_stream_send_fexit, struct socket *sock, struct msghdr *msg, size_t len, int ret)
{
	return socket_io(sock, ret, 0, true);
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
		udp_datagram(sk, ret, 0, true, false);
	return 0;
}

SEC("fexit/sock_recvmsg")
int BPF_PROG(on_recv_fexit, struct socket *sock, struct msghdr *msg, int flags, int ret)
{
	return socket_io(sock, ret, flags, false);
}

/* ---- connects that fail inside connect() (connect.bpf.h) ---- */

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

#if defined(__TARGET_ARCH_arm64)
/* The part of arm64's struct pt_regs read below (vmlinux.h is x86-64's;
 * CO-RE finds the fields in the running kernel's BTF, regs[] inside its
 * anonymous union). */
struct pt_regs___dt_arm64 {
	__u64 regs[31];
	__u64 orig_x0;
} __attribute__((preserve_access_index));
#endif

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
	/* connect(fd, addr, addrlen): the system call's own arguments, from
	 * the registers it was entered with (bpf2go builds one object per
	 * architecture, __TARGET_ARCH_*; another architecture's field names
	 * fail the CO-RE relocation, this program does not load and doctor
	 * says so). */
#if defined(__TARGET_ARCH_arm64)
	/* x0 holds the return value by now, orig_x0 the first argument */
	struct pt_regs___dt_arm64 *regs = (struct pt_regs___dt_arm64 *)bpf_task_pt_regs(t);
	int fd = BPF_CORE_READ(regs, orig_x0);
	const void *addr = (const void *)BPF_CORE_READ(regs, regs[1]);
	int addrlen = BPF_CORE_READ(regs, regs[2]);
#else
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	int fd = BPF_CORE_READ(regs, di);
	const void *addr = (const void *)BPF_CORE_READ(regs, si);
	int addrlen = BPF_CORE_READ(regs, dx);
#endif
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

SEC("cgroup/sendmsg4")
int udp_sendmsg4(struct bpf_sock_addr *ctx)
{
	remember_peer4(ctx, true);
	return 1;
}

SEC("cgroup/sendmsg6")
int udp_sendmsg6(struct bpf_sock_addr *ctx)
{
	remember_peer6(ctx, true);
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
	remember_peer4(ctx, false);
	return 1;
}

SEC("cgroup/recvmsg6")
int udp_recvmsg6(struct bpf_sock_addr *ctx)
{
	remember_peer6(ctx, false);
	return 1;
}

/* A UDP socket bound with bind() while deptrace watches: its whole life is
 * seen, so its first datagram tells which end it is (udp_count_unconnected):
 * received first, nobody could have sent to a port the kernel chose but a
 * peer told of it or a NAT rule (Docker's embedded DNS: dockerd binds
 * 127.0.0.11:0 in the container's namespace, a rule sends 127.0.0.11:53
 * there), so it is a server from its first datagram on, never reported as
 * a client of its first peer's port when a drain falls before its second
 * peer. A socket bound to a fixed port is a server anyway (udp_direction);
 * an autobound one (sendto without bind) never runs this hook. */
static __always_inline int udp_post_bind(struct bpf_sock *ctx)
{
	if (ctx->protocol != IPPROTO_UDP)
		return 1;
	struct sock_state *st = bpf_sk_storage_get(&socks, ctx, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		stat_inc(STAT_SOCK_STORAGE_FAILED);
		return 1;
	}
	if (st->kind == 0 && st->udp_role == UDP_ROLE_UNDECIDED)
		st->udp_role = UDP_ROLE_FRESH;
	return 1;
}

SEC("cgroup/post_bind4")
int udp_post_bind4(struct bpf_sock *ctx)
{
	return udp_post_bind(ctx);
}

SEC("cgroup/post_bind6")
int udp_post_bind6(struct bpf_sock *ctx)
{
	return udp_post_bind(ctx);
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

/* ---- the drain-time harvest ---- */

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
		/* No process to ask here: the socket's own cgroup names it
		 * (user space adds the process from /proc). */
		__u64 cgroup = sock_cgroup_id((struct sock *)tp);
		listener_tag((struct sock *)tp, 0, NULL, cgroup);
		struct port_key pk = {.netns = r.netns, .port = r.port, .proto = IPPROTO_TCP};
		struct port_value init = {.cgroup_id = cgroup};
		struct port_value *pv = lookup_or_init(&ports, &pk, &init, STAT_PORT_MAP_FULL);
		if (pv) {
			remember_listener(pv, (struct sock *)tp);
			if (!pv->pid) /* else a listen() since start named it */
				pv->cgroup_id = cgroup;
		}
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

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
#include <bpf/bpf_endian.h>

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

/* ---- Recursion-miss experiments on sock_send_length (6.3+) ----
 *
 * Every mode counts the unix stream sends of skstress's own process
 * (target_tgid) and "processes" each one. The ground truth is exact: each
 * sending thread numbers its sends in a variable of its own (user memory,
 * address in `threads`), incremented before each write(2); process() reads
 * it in the thread's own syscall, so processing one send twice shows as the
 * same number twice (dups) and sends never processed as a jump (gaps).
 * The work per processed send (work_loops atomic adds to a shared array)
 * stands for deptrace's own work and sets how long a run is.
 */
const volatile __u32 target_tgid = 0;
const volatile __u32 work_loops = 64;

struct thr {
	__u64 seq_addr;  /* user address of the thread's send number */
	__u64 last;      /* the last processed send's number */
	__u64 processed; /* processed runs, duplicates included */
	__u64 dups;      /* runs that processed an already processed send */
	__u64 gaps;      /* sends skipped over between two processed ones */
	__u64 unread;    /* runs that could not read the send number */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 128);
	__type(key, __u32); /* thread id, filled in by user space */
	__type(value, struct thr);
} threads SEC(".maps");

/* Event counters of the copies, per CPU, summed by user space. Added
 * atomically: on a preemptible kernel two programs (two copies) can
 * interleave on one CPU, and a plain += would lose increments. */
enum {
	C_A_PROC,     /* copy A processed the send (and marked it) */
	C_A_NOSTORE,  /* copy A ran but got no task storage: left the send to later copies */
	C_A_FULL,     /* copy A ran but found every mark slot taken: left it to later copies */
	C_B_RESCUED,  /* a middle copy processed a send no earlier copy had (and marked it) */
	C_B_SEEN,     /* a middle copy found an earlier copy's mark: nothing to do */
	C_B_UNMARKED, /* a middle copy found no mark but could not mark: left it */
	C_C_RESCUED,  /* the last copy processed a send no earlier copy had */
	C_C_SEEN,     /* the last copy found a mark (and cleared it) */
	C_STALE,      /* stale marks cleared by copy A */
	C_OLD_BACKUP, /* misses2: the old backup's runs that did the work */
	C_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} cnt SEC(".maps");

/* Counters of the common outcomes (A processed, a mark seen), which deptrace
 * would not keep: compiled out with -DLEAN for cost measurements. */
#ifdef LEAN
#define inc_common(i) do { } while (0)
#else
#define inc_common(i) inc(i)
#endif

static __always_inline void inc(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&cnt, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline bool relevant(struct sock *sk)
{
	return sk->__sk_common.skc_family == 1 /* AF_UNIX */ &&
	       (bpf_get_current_pid_tgid() >> 32) == target_tgid;
}

static __always_inline void process(int ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thr *t = bpf_map_lookup_elem(&threads, &tid);
	if (t) {
		__u64 seq = 0;
		if (bpf_probe_read_user(&seq, sizeof(seq), (void *)t->seq_addr) || seq == 0) {
			t->unread++;
		} else {
			if (seq == t->last)
				t->dups++;
			else if (seq > t->last)
				t->gaps += seq - t->last - 1;
			t->last = seq;
		}
		t->processed++;
	}
	count(6);
	for (__u32 i = 0; i < work_loops && i < 256; i++)
		count(7);
}

/* misses (on_send alone) and misses2 (on_send + on_send_backup, the first
 * idea): on_send raises a per-CPU flag while it runs; the backup does the
 * work when it sees the flag up, taken to mean "the kernel skipped on_send
 * for this event". It is wrong both ways: a task can finish on_send, be
 * preempted (or migrate) before the backup runs, and find the flag raised
 * by another task now preempted inside on_send: the send is processed twice;
 * and a task preempted between the kernel's recursion check and on_send's
 * first instruction holds the guard with the flag down: the skipped send is
 * lost. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} in_send SEC(".maps");

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send, struct sock *sk, int ret, int flags)
{
	if (!relevant(sk))
		return 0;
	__u32 z = 0;
	__u32 *busy = bpf_map_lookup_elem(&in_send, &z);
	if (busy)
		*busy = 1;
	process(ret);
	if (busy)
		*busy = 0;
	return 0;
}

/* empty: nothing at all; its bpf_stats run time is the measuring floor. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(send_empty, struct sock *sk, int ret, int flags)
{
	return 0;
}

/* plain: the body alone (no flag), the baseline for cost measurements. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(send_plain, struct sock *sk, int ret, int flags)
{
	if (relevant(sk))
		process(ret);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_send_backup, struct sock *sk, int ret, int flags)
{
	if (!relevant(sk))
		return 0;
	__u32 z = 0;
	__u32 *busy = bpf_map_lookup_elem(&in_send, &z);
	if (!busy || !*busy)
		return 0;
	inc(C_OLD_BACKUP);
	process(ret);
	return 0;
}

/* marksN: the scheme proposed for deptrace. N copies of the program (A,
 * N-2 middle copies, the last copy; separate programs, so separate
 * recursion guards) are attached to the tracepoint in that order. One
 * tracepoint call runs them one after the other in the same task (the task
 * may be preempted, and migrate, between two copies, but not inside one);
 * the kernel may skip any of them for recursion. The copies talk through
 * the task's own storage, keyed by the address of the call's argument
 * array (ctx): bpf_trace_runN() builds that array on its stack frame, at
 * the same address for every copy of one call, and a call nested in it (an
 * interrupt or softirq on the same task) builds its own on the interrupt
 * stack or deeper on the same stack, so no two unfinished calls of one task
 * share an address.
 * - A marks (a slot := ctx) and processes; if it cannot mark (no storage,
 *   every slot taken) it does nothing and counts that.
 * - a middle copy: mark found -> nothing; else mark and process (cannot
 *   mark -> nothing, counted).
 * - the last copy: mark found -> clear it, nothing; else process.
 * A copy processes only if no earlier copy of this call did: that copy
 * wrote its mark before processing, and only this call's last copy clears a
 * slot holding this address. A send is lost only when every copy that could
 * process it was skipped, or when a mark left behind by a skipped last copy
 * sits at the same address; every loss shows in
 *   lost = A.recursion_misses + A_NOSTORE + A_FULL - rescued (middle + last).
 * Marks left behind (their last copy skipped) are cleared by copy A when it
 * can prove them stale (see mark()). */
#define REC_ON_STALE() inc(C_STALE)
#include "recmarks.h"

/* The copies' work goes through the verdicts of recmarks.h (the code meant
 * for deptrace), counting each outcome. */
static __always_inline bool first_copy(void *ctx)
{
#ifdef COST_GET_ONLY
	/* cost measurement: get the task's storage, do not mark */
	if (!bpf_task_storage_get(&rec_marks, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE)) {
		inc(C_A_NOSTORE);
		return false;
	}
	return true;
#endif
	switch (rec_first(ctx)) {
	case REC_PROCESS:
		inc_common(C_A_PROC);
		return true;
	case REC_NOSTORE:
		inc(C_A_NOSTORE);
		return false;
	default:
		inc(C_A_FULL);
		return false;
	}
}

static __always_inline bool mid_copy(void *ctx)
{
	switch (rec_mid(ctx)) {
	case REC_PROCESS:
		inc(C_B_RESCUED);
		return true;
	case REC_DONE:
		inc_common(C_B_SEEN);
		return false;
	default:
		inc(C_B_UNMARKED);
		return false;
	}
}

static __always_inline bool last_copy(void *ctx)
{
	if (rec_last(ctx) == REC_PROCESS) {
		inc(C_C_RESCUED);
		return true;
	}
	inc_common(C_C_SEEN);
	return false;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(send_a, struct sock *sk, int ret, int flags)
{
	if (!relevant(sk))
		return 0;
	if (first_copy(ctx))
		process(ret);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(send_mid, struct sock *sk, int ret, int flags)
{
	if (!relevant(sk))
		return 0;
	if (mid_copy(ctx))
		process(ret);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(send_last, struct sock *sk, int ret, int flags)
{
	if (!relevant(sk))
		return 0;
	if (last_copy(ctx))
		process(ret);
	return 0;
}

/* ---- The same scheme on inet_sock_set_state (-event state) ----
 * Transitions of TCP sockets to or from target_port (the stress's loopback
 * listener), in process context (connect, close) and in softirq (handshake,
 * FIN and ACK processing). Ground truth: per connection exactly one
 * transition to SYN_SENT, two to ESTABLISHED (client, server child) and one
 * of the client to CLOSE; process_state counts those and keeps each socket's last
 * processed transition in socket storage: the same transition twice in a
 * row on one socket is a duplicate (a socket never legitimately repeats
 * one). */
const volatile __u16 target_port = 0;

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} sst SEC(".maps");

enum {
	S_COUNTED = 8, /* processed transitions of the counted kinds, duplicates included */
	S_DUPS,        /* processed twice (counted kinds) */
	S_DUPS_ALL,    /* processed twice (any kind) */
	S_UNCHECKED,   /* no socket storage: could not check for a duplicate */
	S_SEEN,        /* -seen: counted kinds seen by state_seen (attached first, no storage) */
};

/* Processed transitions by kind (oldstate << 8 | newstate). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u64);
} kinds SEC(".maps");

static __always_inline bool state_relevant(struct sock *sk)
{
	return sk->__sk_common.skc_family == 2 /* AF_INET */ &&
	       (sk->__sk_common.skc_num == target_port ||
		sk->__sk_common.skc_dport == bpf_htons(target_port));
}

static __always_inline void process_state(struct sock *sk, int oldstate, int newstate)
{
	/* The server child's own close is not counted: tcp_set_state()
	 * releases its port (inet_num = 0) before the tracepoint, so the
	 * filter cannot tell it from any other socket's. */
	bool counted = oldstate != TCP_LISTEN &&
		       (newstate == TCP_SYN_SENT || newstate == TCP_ESTABLISHED ||
			(newstate == TCP_CLOSE && sk->__sk_common.skc_dport == bpf_htons(target_port)));
	__u64 key = ((__u64)oldstate << 8 | newstate) + 1;
	__u32 kind = (__u32)oldstate << 8 | newstate;
	__u64 one = 1, *k = bpf_map_lookup_elem(&kinds, &kind);
	if (k)
		__sync_fetch_and_add(k, 1);
	else
		bpf_map_update_elem(&kinds, &kind, &one, BPF_NOEXIST);
	__u64 *last = bpf_sk_storage_get(&sst, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!last) {
		count(S_UNCHECKED);
	} else {
		if (*last == key) {
			count(S_DUPS_ALL);
			if (counted)
				count(S_DUPS);
		}
		*last = key;
	}
	if (counted)
		count(S_COUNTED);
	for (__u32 i = 0; i < work_loops && i < 256; i++)
		count(7);
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(state_seen, struct sock *sk, int oldstate, int newstate)
{
	if (state_relevant(sk) && oldstate != TCP_LISTEN &&
	    (newstate == TCP_SYN_SENT || newstate == TCP_ESTABLISHED ||
	     (newstate == TCP_CLOSE && sk->__sk_common.skc_dport == bpf_htons(target_port))))
		count(S_SEEN);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(state_one, struct sock *sk, int oldstate, int newstate)
{
	if (state_relevant(sk))
		process_state(sk, oldstate, newstate);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(state_a, struct sock *sk, int oldstate, int newstate)
{
	if (!state_relevant(sk))
		return 0;
	if (first_copy(ctx))
		process_state(sk, oldstate, newstate);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(state_mid, struct sock *sk, int oldstate, int newstate)
{
	if (!state_relevant(sk))
		return 0;
	if (mid_copy(ctx))
		process_state(sk, oldstate, newstate);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(state_last, struct sock *sk, int oldstate, int newstate)
{
	if (!state_relevant(sk))
		return 0;
	if (last_copy(ctx))
		process_state(sk, oldstate, newstate);
	return 0;
}

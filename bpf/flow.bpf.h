/* flow.bpf.h: a flow's counters, found or made: the per-CPU flow cache in
 * front of the flow map, the map, the spill behind it; the process a flow
 * is named after; the port table of listeners. */
#ifndef FLOW_BPF_H
#define FLOW_BPF_H

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

/* The cgroup v2 id of the process that made a socket (its sk_cgrp_data,
 * set when the socket was created): what names a listener found at
 * start-up, which has no current process to ask. Read through probes (an
 * iterator's socket, never on a per-event path). Before 5.15 the field is
 * one word: a cgroup pointer, or with one of its low bits set the cgroup
 * v1 net_prio/net_cls data of a socket the kernel counts as the root's. */
struct sock_cgroup_data___old {
	__u64 val;
} __attribute__((preserve_access_index));

struct sock___old {
	struct sock_cgroup_data___old sk_cgrp_data;
} __attribute__((preserve_access_index));

#define ROOT_CGROUP_ID 1

static __always_inline __u64 sock_cgroup_id(struct sock *sk)
{
	if (bpf_core_field_exists(sk->sk_cgrp_data.cgroup)) {
		struct cgroup *cg = BPF_CORE_READ(sk, sk_cgrp_data.cgroup);
		return cg ? BPF_CORE_READ(cg, kn, id) : ROOT_CGROUP_ID;
	}
	__u64 val = BPF_CORE_READ((struct sock___old *)sk, sk_cgrp_data.val);
	if (!val || (val & 3))
		return ROOT_CGROUP_ID;
	return BPF_CORE_READ((struct cgroup *)val, kn, id);
}

static __always_inline bool same_key(const struct flow_key *a, const struct flow_key *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	for (int i = 0; i < sizeof(*a) / 4; i++)
		if (x[i] != y[i])
			return false;
	return true;
}

/* Raise *p to x, or for min lower it (0 at *p: none yet), by
 * compare-and-swap: on a value shared by every CPU a plain compare and
 * store could overwrite a larger value written meanwhile. Bounded retries:
 * each failure means another CPU moved it. */
static __always_inline void store_max64(__u64 *p, __u64 x)
{
	for (int i = 0; i < 4; i++) {
		__u64 seen = *(volatile __u64 *)p;
		if (x <= seen || __sync_val_compare_and_swap(p, seen, x) == seen)
			return;
	}
}

static __always_inline void store_min64(__u64 *p, __u64 x)
{
	for (int i = 0; i < 4; i++) {
		__u64 seen = *(volatile __u64 *)p;
		if ((seen && x >= seen) || __sync_val_compare_and_swap(p, seen, x) == seen)
			return;
	}
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

/* The flow's slot in this CPU's cache half, found or claimed; NULL when
 * the slot holds another flow or is being claimed (see flow_cache). */
static __always_inline struct flow_value *cache_entry(const struct flow_key *key, __u32 half)
{
	__u32 idx = half * CACHE_SLOTS + (key_hash(key) & (CACHE_SLOTS - 1));
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

/* Find or claim the spill slot of key in spill half `half`. err is the
 * failed insert's error, for the loss counter when no slot is free. Not
 * inlined: only a failed insert comes here. */
static __noinline struct flow_value *spill_entry(const struct flow_key *key, long err, __u32 half)
{
	__u32 base = (half & 1) * spill_slots;
	__u32 h = key_hash(key);
	for (int i = 0; i < SPILL_PROBES; i++) {
		__u32 idx = base + ((h + i) & (spill_slots - 1));
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
				if (used) {
					__u64 nth = __sync_fetch_and_add(used, 1);
					struct spill_claims *c = bpf_map_lookup_elem(&spill_claims, &hi);
					if (c && nth < SPILL_MAX_SLOTS)
						c->slot[nth] = idx;
				}
				return &s->value;
			}
		}
		if (st == SPILL_READY && same_key(&s->key, key))
			return &s->value;
	}
	stat_inc(err == -E2BIG ? STAT_FLOW_MAP_FULL : STAT_FLOW_ALLOC_FAILED);
	return NULL;
}

/* A map value of interval n: one last counted in an older interval is
 * zeroed first (its process kept, so that a flow whose next interval has
 * only softirq events stays named), once per flow and interval. Claimed
 * by compare-and-swap, as a cache slot is: a program on another CPU, or
 * nested on this one, that finds the value GEN_CLAIMING while it is zeroed
 * uses the spill. NULL then. Not inlined: it runs once per flow and
 * interval. */
static __noinline struct flow_value *renew_value(struct flow_value *v, __u64 n)
{
	__u64 gen = *(volatile __u64 *)&v->gen;
	if (gen == n)
		return v;
	if (gen == GEN_CLAIMING)
		return NULL;
	if (gen == 0) {
		/* Just inserted, all zeroes: nothing to zero, so no claim
		 * either, and two CPUs counting a new flow at once both find
		 * it (neither goes to the spill). */
		__u64 prev = __sync_val_compare_and_swap(&v->gen, 0, n);
		return prev == 0 || prev == n ? v : NULL;
	}
	__u64 prev = __sync_val_compare_and_swap(&v->gen, gen, GEN_CLAIMING);
	if (prev != gen) /* another program claimed it first: done, or not yet */
		return prev == n ? v : NULL;
	__u32 pid = v->pid;
	__u64 cgroup = v->cgroup_id;
	__u64 comm0 = *(__u64 *)&v->comm[0], comm1 = *(__u64 *)&v->comm[8];
	/* From an 8-aligned field: 29 word stores, not 232 byte stores. */
	__builtin_memset(&v->last_jiffies, 0, sizeof(*v) - sizeof(v->gen));
	v->pid = pid;
	v->cgroup_id = cgroup;
	*(__u64 *)&v->comm[0] = comm0;
	*(__u64 *)&v->comm[8] = comm1;
	__sync_lock_test_and_set(&v->gen, n);
	return v;
}

static __always_inline struct flow_value *current_value(struct flow_value *v, __u64 n)
{
	if (*(volatile __u64 *)&v->gen == n)
		return v;
	return renew_value(v, n);
}

/* Find or create the bundled entry of k for the interval programs count
 * (interval_now), in this CPU's cache, the interval's map, or where its
 * insert fails, the spill. The lookup that finds an existing flow, by far
 * the common case, is all it costs. */
static __always_inline struct flow_value *flow_entry(const struct flow_key *key)
{
	__u32 zero = 0;
	__u64 *now_p = bpf_map_lookup_elem(&interval_now, &zero);
	if (!now_p)
		return NULL;
	/* Read once: the map, the halves and the values' tag must agree. */
	__u64 n = *(volatile __u64 *)now_p;
	__u32 half = n & 1;
	struct flow_value *v = cache_off || spill_only ? NULL : cache_entry(key, half);
	if (v)
		goto found;
	void *m = bpf_map_lookup_elem(&flows, &half);
	if (!m)
		return NULL;
	long err = 0;
	v = bpf_map_lookup_elem(m, key);
	if (!v && !spill_only) {
		/* -EEXIST: another CPU inserted it meanwhile. */
		err = bpf_map_update_elem(m, key, (const void *)&zero_flow, BPF_NOEXIST);
		if (!err || err == -EEXIST)
			v = bpf_map_lookup_elem(m, key);
	}
	if (v)
		v = current_value(v, n);
	if (!v)
		v = spill_entry(key, err, half);
	if (!v)
		return NULL;
found:;
	/* Reading the clock costs about 50 ns on some VMs (rdtsc), more than
	 * the rest of the update: read it at most once per jiffy per value.
	 * last_seen is then exact to one jiffy (1-10 ms). A value may be
	 * shared by every CPU: first and last seen move by compare-and-swap,
	 * never back. */
	__u64 j = bpf_jiffies64();
	if (v->last_jiffies != j) {
		__u64 now = bpf_ktime_get_boot_ns();
		v->last_jiffies = j;
		if (!v->first_seen_ns)
			__sync_val_compare_and_swap(&v->first_seen_ns, 0, now);
		store_max64(&v->last_seen_ns, now);
	}
	return v;
}

/* Name v after process pid, its cgroup and name, under v's pid
 * (PID_NAMING, bundler.h): unless another program is naming it at this
 * moment, whose process is as recent as ours. pid 0 sets only the cgroup
 * of a flow with no process yet (a listener found at start-up whose
 * process /proc does not show), when cgroup is known, under the same lock
 * released back to 0: a real naming that meets it skips this one event. */
static __always_inline void name_set(struct flow_value *v, __u32 pid, __u64 cgroup, const char *comm)
{
	__u32 seen = *(volatile __u32 *)&v->pid;
	if (!pid) {
		if (!seen && cgroup && __sync_val_compare_and_swap(&v->pid, 0, PID_NAMING) == 0) {
			v->cgroup_id = cgroup;
			__sync_lock_test_and_set(&v->pid, 0);
		}
		return;
	}
	if (seen == pid || seen == PID_NAMING)
		return;
	if (__sync_val_compare_and_swap(&v->pid, seen, PID_NAMING) != seen)
		return;
	v->cgroup_id = cgroup;
	__builtin_memcpy(v->comm, comm, sizeof(v->comm));
	__sync_lock_test_and_set(&v->pid, pid);
}

/* Name v after the current process (UDP and unix, in the process's own
 * context): the pid compare alone on the usual path. */
static __always_inline void name_current(struct flow_value *v)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (v->pid == tgid)
		return;
	__u32 pid;
	char comm[16] __attribute__((aligned(4)));
	__u64 cgroup;
	current_process(&pid, comm, &cgroup);
	name_set(v, pid, cgroup, comm);
}

/* Name the flow's process from the socket's, or for a server without one
 * (the handshake completes in softirq) from the listening process. */
static __always_inline void name_flow(struct flow_value *v, const struct sock_state *st)
{
	if (st->pid) {
		name_set(v, st->pid, st->cgroup_id, st->comm);
		return;
	}
	if (v->pid || st->key.direction != DIR_INBOUND || st->key.proto != IPPROTO_TCP)
		return;
	struct port_value *pv = port_lookup(st->key.netns, st->key.port);
	if (pv && pv->pid)
		name_set(v, pv->pid, pv->cgroup_id, pv->comm);
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

#endif /* FLOW_BPF_H */

/* tcp.bpf.h: TCP, counted from the socket: tagging a connection when it
 * opens, folding its counters at drain and at close, connects in flight,
 * failed connects, resets, and the listening sockets. */
#ifndef TCP_BPF_H
#define TCP_BPF_H

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
	fill_addrs(sk, sk->__sk_common.skc_family, k);
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

/* The socket's smoothed RTT in microseconds, 0 before the first sample
 * (tcp_sock.srtt_us holds 8 times it; under 1 us reads as 1). */
static __always_inline __u32 tcp_srtt_us(const struct tcp_sock *tp)
{
	__u32 srtt8 = tp->srtt_us;
	if (!srtt8)
		return 0;
	return srtt8 < 8 ? 1 : srtt8 >> 3;
}

/* One RTT sample into the flow, taken by a read of the socket that
 * updates the flow anyway (a close or drain that reports bytes,
 * retransmissions or the open): never a flow update of its own. */
static __always_inline void flow_rtt(struct flow_value *v, __u32 rtt)
{
	if (!rtt)
		return;
	__sync_fetch_and_add(&v->rtt_samples, 1);
	__sync_fetch_and_add(&v->rtt_sum_us, rtt);
	store_min64(&v->rtt_min_us, rtt);
	store_max64(&v->rtt_max_us, rtt);
}

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
	__u32 rtt = tcp_srtt_us(tp);
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
	/* A read that reports nothing takes no RTT sample either: an idle
	 * connection does not make its flow active at every drain. */
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
			store_max64(&v->latency_max_us, lat);
		}
	}
	if (d_sent)
		__sync_fetch_and_add(&v->bytes_sent, d_sent);
	if (d_received)
		__sync_fetch_and_add(&v->bytes_received, d_received);
	if (d_retrans)
		__sync_fetch_and_add(&v->retransmits, d_retrans);
	flow_rtt(v, rtt);
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
	name_set(v, ci->pid, ci->cgroup_id, ci->comm);
}

/* An unnamed server's flow takes the listening process from the port
 * table: the one that called listen(), or for a listener found at start-up
 * the one /proc names and the cgroup of the socket itself (known even when
 * /proc does not show its process: another pid namespace). */
static __always_inline void name_from_port(struct flow_value *v, const struct port_value *pv)
{
	name_set(v, pv->pid, pv->cgroup_id ? pv->cgroup_id : v->cgroup_id, pv->comm);
}

static __always_inline void name_from_listener(struct flow_value *v, __u32 netns, __u16 port)
{
	if (v->pid)
		return;
	struct port_value *pv = port_lookup(netns, port);
	if (pv)
		name_from_port(v, pv);
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
	if (v && !v->pid)
		name_from_port(v, pv);
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
 * direction at close would be guessed wrong, a connect left some, or the
 * start-up seed has not ended. */
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
	/* Until the start-up seed ends, a connection that opens takes storage
	 * now, counting from its open: the seed would otherwise tag it as one
	 * open before the start (counting from the seed), and no late tag
	 * runs meanwhile (tcp_tag_late). */
	if (!st && (seed_pending || tcp_direction(sk) != dir)) {
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
			store_max64(&v->latency_max_us, lat);
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
	/* Before the start-up seed ends, a connection that opens takes
	 * storage: one closing without was open before the start, and its
	 * counters hold its life before deptrace. */
	if (seed_pending)
		return;
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
	__u32 rtt = tcp_srtt_us(tp);
	if (!sent && !received && !retrans)
		return; /* no sample either: no flow update for it alone */
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
	flow_rtt(v, rtt);
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
	if (seed_pending)
		return; /* it may have been open before the start: the seed's */
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
	fill_addrs(sk, sk->__sk_common.skc_family, &st->key);
	st->pid = pid;
	if (comm)
		__builtin_memcpy(st->comm, comm, sizeof(st->comm));
	st->cgroup_id = cgroup;
	st->rep_drops = listen_drops(sk);
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

#endif /* TCP_BPF_H */

/* udp.bpf.h: UDP datagrams, per call: a connected socket counted in its
 * storage, an unconnected one per peer (the socket-address programs
 * remember the peer of each datagram); which end a socket is. */
#ifndef UDP_BPF_H
#define UDP_BPF_H

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
	name_current(v);
}

/* Count one datagram of a connected socket straight into its flow. */
static __always_inline void udp_count_direct(struct sock *sk, int bytes, bool send)
{
	struct flow_key k = {};
	udp_key(sk, &k, bpf_ntohs(sk->__sk_common.skc_dport));
	fill_addrs(sk, sk->__sk_common.skc_family, &k);
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
	__u64 h = tag * 0x9E3779B97F4A7C15ULL;
	/* The slot from the hash's top bits, the stored tag from the 32 below
	 * them (bit 26 aside). Two sockets with one peer and other local
	 * ports differ in tag bits 48-63 alone, so their hashes differ
	 * somewhere in bits 48-63, which slot and tag cover: they never share
	 * both (sockets with the same ports and peer, in two namespaces say,
	 * do). Other pairs share both about once in 2^37. */
	__u32 slot = (__u32)(h >> (64 - SENDERS_SLOT_BITS)) & (SENDERS_SLOTS - 1);
	__u32 want = (__u32)(h >> (32 - SENDERS_SLOT_BITS)) | 1; /* never 0, an empty slot */
	__u32 zero = 0;
	struct recent_senders *rs = bpf_map_lookup_elem(&recent_senders, &zero);
	if (!rs)
		return false;
	if (rs->tag[slot] == want)
		return true;
	rs->tag[slot] = want;
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
		fill_addrs(sk, sk->__sk_common.skc_family, &st->key);
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
static __always_inline bool first_peer(const struct sock_state *st, const struct udp_peer *p)
{
	const __u32 *a = (const __u32 *)st->udp_daddr, *b = (const __u32 *)p->addr;
	return p->port == st->udp_dport && a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
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
static __always_inline bool udp_undecided(struct sock *sk, struct sock_state *st, const struct udp_peer *p, int bytes,
        bool send)
{
	if (st->kind != SK_UDP || !st->udp_dport) {
		if (st->kind == SK_UDP)
			udp_fold(st); /* counts of an earlier connect() */
		st->kind = SK_UDP;
		st->udp_bytes_sent = 0;
		st->udp_bytes_received = 0;
		st->udp_dgrams_sent = 0;
		st->udp_dgrams_received = 0;
		udp_key_dir(sk, &st->key, bpf_ntohs(p->port), DIR_OUTBOUND);
		fill_addrs(sk, sk->__sk_common.skc_family, &st->key);
		__builtin_memcpy(st->key.remote_addr, p->addr, sizeof(st->key.remote_addr));
		__builtin_memcpy(st->udp_daddr, p->addr, sizeof(st->udp_daddr));
		st->udp_dport = p->port;
	} else if (!first_peer(st, p)) {
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

/* Take this thread's peer from a socket's slots for one direction. */
static __always_inline bool peer_take(struct udp_peer *slots, __u32 tid, struct udp_peer *p)
{
	if (slots[0].tid == tid) {
		*p = slots[0];
		slots[0].tid = 0;
		return true;
	}
	if (slots[1].tid == tid) {
		*p = slots[1];
		slots[1].tid = 0;
		return true;
	}
	return false;
}

/* An unconnected socket: every datagram may have another peer, which the
 * cgroup hook of this same syscall saw. */
static __always_inline void udp_count_unconnected(struct sock *sk, struct sock_state *st, int bytes, bool send)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct udp_peer p;
	if (!st || !peer_take(st->inflight[send], tid, &p)) {
		stat_inc(STAT_UDP_PEER_UNKNOWN);
		return;
	}
	__u8 dir = udp_direction(sk);
	if (dir == DIR_OUTBOUND) {
		if (st->udp_role == UDP_ROLE_FRESH)
			st->udp_role = send ? UDP_ROLE_CLIENT : UDP_ROLE_SERVER;
		if (st->udp_role == UDP_ROLE_UNDECIDED && udp_undecided(sk, st, &p, bytes, send))
			return;
		if (st->udp_role == UDP_ROLE_SERVER)
			dir = DIR_INBOUND;
	}
	struct flow_key k = {};
	udp_key_dir(sk, &k, bpf_ntohs(p.port), dir);
	fill_addrs(sk, sk->__sk_common.skc_family, &k);
	__builtin_memcpy(k.remote_addr, p.addr, sizeof(k.remote_addr));
	struct flow_value *v = flow_entry(&k);
	if (!v)
		return;
	add_datagram(v, bytes, send);
}

/* dns_candidate says whether sk may be a resolver's socket: connected to
 * port 53, or an unconnected UDP socket whose last sendto() went to port
 * 53 (note_dns). */
static __always_inline bool dns_candidate(struct sock *sk)
{
	__u16 dport = sk->__sk_common.skc_dport;
	if (dport)
		return dport == bpf_htons(DNS_PORT);
	if (sk->sk_protocol != IPPROTO_UDP || !sk->sk_bpf_storage)
		return false;
	struct sock_state *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	return st && st->dns_asked;
}

/* udp_datagram counts one send or receive call's datagram, and says
 * whether the call may be a resolver's (dns_candidate) for the hand-off
 * to the DNS watcher. dns: the caller hands off (a constant, so that the
 * fexit callers, which do not, pay nothing for the answer). A counted UDP
 * call answers from the storage it has just looked up, so it looks that
 * storage up once; the calls that leave before counting (errors, peeks,
 * other protocols, namespaces outside --netns) pay dns_candidate's. */
static __always_inline bool udp_datagram(struct sock *sk, int ret, int flags, bool send, bool dns)
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
		return dns && sk->__sk_common.skc_dport == bpf_htons(DNS_PORT);
	}
	/* A peek is read again later; an error-queue read returns a sent
	 * datagram an ICMP error came back for (IP_RECVERR), not a new one. */
	if (ret < 0 || (flags & (MSG_PEEK | MSG_ERRQUEUE)))
		return dns && dns_candidate(sk);
	if (sk->__sk_common.skc_family == AF_UNIX) {
		if (netns_wanted(sk_netns(sk)))
			unix_count(sk, ret, send);
		return false;
	}
	if (sk->sk_protocol != IPPROTO_UDP || !inet_family(sk) || !netns_wanted(sk_netns(sk)))
		return dns && dns_candidate(sk);
	struct sock_state *st = sk->sk_bpf_storage ? bpf_sk_storage_get(&socks, sk, 0, 0) : NULL;
	__u16 dport = sk->__sk_common.skc_dport;
	if (dport)
		udp_count_connected(sk, st, ret, send);
	else
		udp_count_unconnected(sk, st, ret, send);
	if (!dns)
		return false;
	if (dport)
		return dport == bpf_htons(DNS_PORT);
	return st && st->dns_asked;
}

/* A slot for this thread's datagram in flight: the one it already holds
 * (from a call that never reached the tracepoint: a failed send, a peek),
 * so that a thread never holds two and peer_take never finds a stale one;
 * else the one its thread id picks, or the other if that one is another
 * thread's and the other is free. *stp: the socket's storage. */
static __always_inline struct udp_peer *peer_slot(struct bpf_sock_addr *ctx, bool send, struct sock_state **stp)
{
	if (ctx->protocol != IPPROTO_UDP || !ctx->sk)
		return NULL;
	struct sock_state *st = bpf_sk_storage_get(&socks, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		stat_inc(STAT_SOCK_STORAGE_FAILED);
		return NULL;
	}
	*stp = st;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct udp_peer *slots = st->inflight[send];
	__u32 i;
	if (slots[0].tid == tid)
		i = 0;
	else if (slots[1].tid == tid)
		i = 1;
	else {
		i = tid & 1;
		if (slots[i].tid && !slots[i ^ 1].tid)
			i ^= 1;
	}
	struct udp_peer *p = &slots[i & 1];
	p->tid = tid;
	p->port = (__u16)ctx->user_port;
	return p;
}

/* note_dns is the tracer's part of DNS watching (dns_note): it notes a
 * sendto() to port 53 for the DNS watcher's per-call programs (dns_dests,
 * read when dns_hand_off hands them the socket's calls), and forgets the
 * note when the socket sends elsewhere. st->dns_asked, which the hand-off
 * tests, keeps every other unconnected socket's calls out of the watcher,
 * and spares their sends a second storage lookup here. */
static __always_inline void note_dns(struct bpf_sock_addr *ctx, struct sock_state *st, bool v6)
{
	enum dns_noted n = dns_note(ctx, v6, st->dns_asked);
	if (n == DNS_NOTE_FAILED)
		stat_inc(STAT_SOCK_STORAGE_FAILED);
	st->dns_asked = n == DNS_NOTE_TAKEN;
}

/* remember_peer4 and 6 keep the datagram's peer for the byte tracepoint
 * of the same system call; a send's also notes a resolver (note_dns). */
static __always_inline void remember_peer4(struct bpf_sock_addr *ctx, bool send)
{
	struct sock_state *st = NULL;
	struct udp_peer *p = peer_slot(ctx, send, &st);
	if (!p)
		return;
	set_v4mapped(p->addr, ctx->user_ip4);
	if (send)
		note_dns(ctx, st, false);
}

static __always_inline void remember_peer6(struct bpf_sock_addr *ctx, bool send)
{
	struct sock_state *st = NULL;
	struct udp_peer *p = peer_slot(ctx, send, &st);
	if (!p)
		return;
	__u32 *a = (__u32 *)p->addr;
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	if (send)
		note_dns(ctx, st, true);
}

#endif /* UDP_BPF_H */

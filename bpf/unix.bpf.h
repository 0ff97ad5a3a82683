/* unix.bpf.h: unix-domain sockets, per call: a server's path by its hash,
 * the two ends' processes, the counts of a send or receive. */
#ifndef UNIX_BPF_H
#define UNIX_BPF_H

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

/* The kernel's autobind name is a NUL and five lowercase hex digits
 * (unix_autobind: "%05x"). A program's own abstract name of five
 * characters has the same length: @redis is a service, @0001f is not. */
static __always_inline bool unix_autobound(struct unix_address *a)
{
	char name[6] = {1};
	if (a->len != (int)sizeof(__kernel_sa_family_t) + 6)
		return false;
	if (bpf_probe_read_kernel(name, sizeof(name), &a->name[0].sun_path) || name[0])
		return false;
	for (int i = 1; i < 6; i++) {
		char c = name[i];
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false;
	}
	return true;
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
	/* A name the kernel gave a socket itself (autobind, as SO_PASSCRED
	 * clients get) does not make it a service. */
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
		name_current(v);
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
		__u32 pid = ps ? *(volatile __u32 *)&ps->pid : 0;
		__u32 seen = *(volatile __u32 *)&v->peer_pid;
		/* Named as name_set names the local process. */
		if (ps && pid && seen != pid && seen != PID_NAMING &&
		        __sync_val_compare_and_swap(&v->peer_pid, seen, PID_NAMING) == seen) {
			__builtin_memcpy(v->peer_comm, ps->comm, sizeof(v->peer_comm));
			__sync_lock_test_and_set(&v->peer_pid, pid);
		}
	}
}

#endif /* UNIX_BPF_H */

/* connect.bpf.h: connects that fail inside connect().
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
#ifndef CONNECT_BPF_H
#define CONNECT_BPF_H

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
	name_current(v);
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

#endif /* CONNECT_BPF_H */

/* harvest.bpf.h: the drain-time harvest, every socket deptrace tagged:
 * its counters' growth folded into the active flow map, and each listener
 * reported to user space. */
#ifndef HARVEST_BPF_H
#define HARVEST_BPF_H

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

#endif /* HARVEST_BPF_H */

/* dnsnote.bpf.h: the resolver note (struct dns_dest, dns.h) of a UDP
 * datagram sent with sendto(), shared by the two objects that take it in
 * a cgroup sendmsg4/6 program: the tracer's (bpf/udp.bpf.h, note_dns),
 * whose map the watcher's programs, any variant, are loaded with when the
 * watcher runs with a tracer; and the watcher's own (bpf/dns.bpf.c),
 * without one. Included after the helpers. */
#ifndef DNSNOTE_BPF_H
#define DNSNOTE_BPF_H

#include "dns.h"

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct dns_dest);
} dns_dests SEC(".maps");

enum dns_noted {
	DNS_NOTE_FAILED = -1,   /* to port 53, but the storage could not be made */
	DNS_NOTE_ELSEWHERE = 0, /* not to port 53: any earlier note forgotten */
	DNS_NOTE_TAKEN = 1,
};

/* dns_note notes the resolver of a sendto() to port 53 from the UDP
 * socket ctx->sk, or forgets its earlier note when it sends elsewhere;
 * may_hold false says the socket holds no note, which spares other
 * sockets' sends a lookup. v6: the program is sendmsg6's. */
static __always_inline enum dns_noted dns_note(struct bpf_sock_addr *ctx, bool v6, bool may_hold)
{
	struct dns_dest *d;
	if (ctx->user_port != bpf_htons(DNS_PORT)) {
		if (may_hold) {
			d = bpf_sk_storage_get(&dns_dests, ctx->sk, 0, 0);
			if (d) {
				d->pending = 0;
				d->asked = 0;
			}
		}
		return DNS_NOTE_ELSEWHERE;
	}
	d = bpf_sk_storage_get(&dns_dests, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!d)
		return DNS_NOTE_FAILED;
	__u32 *a = (__u32 *)d->addr;
	if (v6) {
		a[0] = ctx->user_ip6[0];
		a[1] = ctx->user_ip6[1];
		a[2] = ctx->user_ip6[2];
		a[3] = ctx->user_ip6[3];
		d->family = 6;
	} else {
		a[0] = ctx->user_ip4;
		a[1] = 0;
		a[2] = 0;
		a[3] = 0;
		d->family = 4;
	}
	d->pending = 1;
	return DNS_NOTE_TAKEN;
}

#endif /* DNSNOTE_BPF_H */

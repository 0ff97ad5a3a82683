/* dns.h: the record bpf/dns.bpf.c writes into its ring buffer for every
 * DNS packet (cgroup_skb programs) or every DNS socket's send and receive
 * call (the per-call programs), shared with internal/dnswatch (bpf2go
 * -type dns_event); and the resolver note (struct dns_dest) that a cgroup
 * sendmsg program writes for the watcher's programs (bpf/dnsnote.bpf.h). */
#ifndef DNS_H
#define DNS_H

#define DNS_PORT 53

/* The resolver of a datagram sent with sendto() to port 53 from an
 * unconnected socket, noted by a cgroup sendmsg program (the tracer's,
 * bpf/udp.bpf.h, when the watcher runs with a tracer, whichever its
 * variant; else the watcher's own) in the dns_dests socket storage, for
 * the programs that see the datagram afterwards: the egress program sees
 * the packet after NAT (musl's resolver sends to 127.0.0.11:53 this way,
 * and Docker's rule changes the port), the socket-address hook before it. */
struct dns_dest {
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
	__u32 pending; /* set by the hook, taken by the egress (or send) program */
	__u32 asked;   /* per call: the socket's last send went to port 53, so
	                * its receives are answers */
	__u32 family;  /* 4: addr is IPv4 (sendmsg4, also a v6 socket's
	                * v4-mapped destination); 6: IPv6 */
};

/* Most payload bytes copied per packet: a UDP answer up to an EDNS buffer
 * of 4096 fits whole; a TCP segment longer than this is cut, and the
 * message it belongs to counted as unparsed in user space. */
#define DNS_MAX_PAYLOAD 4096 /* a power of 2: bpf/dns.bpf.c masks with it */

enum dns_dir {
	DNS_EGRESS = 0,
	DNS_INGRESS = 1,
};

/* Variants of the cgroup_skb programs (bpf/dns.bpf.c), by what the kernel
 * lets cgroup_skb call. The per-call programs (dns_send, dns_recv) are
 * one variant of their own. */
enum dns_variant {
	DNS_VARIANT_KCTX = 0, /* bpf_cast_to_kern_ctx, bpf_get_current_pid_tgid */
	DNS_VARIANT_TASK = 1, /* bpf_get_current_task; the socket's pointer read */
	DNS_VARIANT_BARE = 2, /* no process */
};

/* Counters in the stats array. */
enum dns_stat {
	DNS_STAT_EVENTS = 0,       /* records written */
	DNS_STAT_RINGBUF_FULL = 1, /* records lost: the ring buffer was full */
	DNS_STAT_CUT = 2,          /* payloads longer than DNS_MAX_PAYLOAD */
	DNS_STAT_UNREADABLE = 3,   /* per call: a call whose buffer could not be found (io_uring, splice) */
	DNS_STAT_BUSY = 4,         /* per call: records lost, this CPU's scratch was in use (preempted) */
	DNS_STAT_MAX = 5,
};

struct dns_event {
	__u64 ts_ns;     /* bpf_ktime_get_ns */
	__u64 cgroup_id; /* the socket's cgroup v2 id */
	__u64 cookie;    /* the socket's cookie */
	__u32 netns;     /* network namespace inode */
	__u32 pid;       /* thread-group id on egress (0 on ingress, and in DNS_VARIANT_BARE; per call: the caller, both ways) */
	__u8 comm[16];   /* the process's name on egress */
	__u8 dir;        /* enum dns_dir */
	__u8 proto;      /* IPPROTO_UDP or IPPROTO_TCP */
	__u8 family;     /* 4 or 6 */
	__u8 tcp_flags;  /* TCP header flags (SYN, FIN, RST); 0 per call */
	__u16 sport;     /* packet's ports, host order */
	__u16 dport;
	__u8 saddr[16]; /* packet's addresses (IPv4 in the first 4 bytes) */
	__u8 daddr[16];
	__u8 sk_raddr[16]; /* the socket's remote address and port (a connected */
	__u16 sk_rport;    /* socket: what it addressed, before any NAT) */
	__u16 pad;
	__u32 tcp_seq;     /* sequence number of the first payload byte */
	__u32 payload_len; /* L4 payload length in the packet (per call: the call's bytes, or for TCP this buffer's) */
	__u32 cap_len;     /* bytes of it that follow this header */
	__u8 payload[DNS_MAX_PAYLOAD];
};

#endif

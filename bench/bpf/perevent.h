/* Structures shared by bundler.bpf.c and its Go loader (bpf2go turns them
 * into Go types). No packed structs: every padding byte is an explicit field
 * so keys hash the same whatever the compiler does. */
#ifndef DEPTRACE_PEREVENT_H
#define DEPTRACE_PEREVENT_H

#define DIR_OUTBOUND 1 /* the local end is the client */
#define DIR_INBOUND 2  /* the local end is the server */

/* One bundled flow: every connection that differs only by the client's
 * ephemeral port lands here. Addresses are IPv6 or IPv4-mapped IPv6
 * (::ffff:a.b.c.d), network byte order. */
struct flow_key {
	__u32 netns;    /* network namespace inode number */
	__u16 port;     /* server port, host byte order */
	__u8 proto;     /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 direction; /* DIR_OUTBOUND or DIR_INBOUND */
	__u8 local_addr[16];
	__u8 remote_addr[16];
	/* The client's port: always 0 when bundling. Set only in the
	 * baseline modes the benchmark compares against (see mode). */
	__u16 client_port;
	__u16 _pad;
};

/* Per-CPU counters of one bundled flow; user space sums the CPUs. */
struct flow_value {
	__u64 connections;        /* TCP opens that reached ESTABLISHED */
	__u64 failed_connections; /* TCP opens that never did */
	__u64 bytes_sent;
	__u64 bytes_received;
	__u64 first_seen_ns; /* CLOCK_BOOTTIME */
	__u64 last_seen_ns;  /* CLOCK_BOOTTIME, exact to one jiffy */
	__u64 last_jiffies;  /* jiffy of last_seen_ns */
	__u64 cgroup_id;
	__u32 pid; /* thread group id of the local process */
	__u32 _pad;
	char comm[16];
};

/* Listening-port table: TCP listeners and UDP sockets bound to a port. */
struct port_key {
	__u32 netns;
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 _pad;
};

struct port_value {
	__u32 refs; /* sockets listening on / bound to this port */
	__u32 pid;  /* process that last started listening, 0 if unknown */
	__u64 cgroup_id;
	char comm[16];
};

/* Record written by the seeding iterators. */
struct listen_record {
	__u32 netns;
	__u16 port;
	__u8 proto;
	__u8 _pad;
};

/* Modes of the object. Only MODE_BUNDLE is deptrace; the others are the
 * baselines of `deptrace bench compare`, on the very same hooks. */
#define MODE_BUNDLE 0
#define MODE_FIVE_TUPLE 1 /* aggregate per 5-tuple: client port in the key */
#define MODE_STREAM 2     /* stream connect/accept and UDP datagrams */

/* Stream-mode event kinds. */
#define EV_OPEN 1   /* TCP connection established */
#define EV_FAILED 2 /* TCP open failed */
#define EV_UDP_SEND 3
#define EV_UDP_RECV 4

struct stream_event {
	struct flow_key key; /* with client_port */
	__u8 kind;
	__u8 _pad[3];
	__u32 bytes;
};

/* Indexes of the per-CPU loss and event counters. */
enum stat_index {
	STAT_FLOW_INSERT_FAILED = 0,    /* bundled-flow map full: an event was lost */
	STAT_PORT_INSERT_FAILED = 1,    /* listening-port table full */
	STAT_UDP_PEER_UNKNOWN = 2,      /* UDP datagram on an unconnected socket whose peer was not seen */
	STAT_PENDING_INSERT_FAILED = 3, /* no socket storage for a UDP peer */
	STAT_STREAM_DROPPED = 4,        /* stream mode: ring buffer full */
	STAT_MAX = 5,
};

#endif

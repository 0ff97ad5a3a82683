/* Structures and constants shared by bundler.bpf.c and its Go loader
 * (bpf2go turns them into Go types and constants; nothing is mirrored by
 * hand). No packed structs: every padding byte is an explicit field so keys
 * hash the same whatever the compiler does, and _Static_assert pins every
 * size the Go side relies on. */
#ifndef DEPTRACE_BUNDLER_H
#define DEPTRACE_BUNDLER_H

/* flow_key.proto of unix-domain flows (IP protocols use their IPPROTO_*;
 * 1, ICMP, is never a deptrace flow). */
enum flow_proto {
	PROTO_UNIX = 1,
};

enum direction {
	DIR_OUTBOUND = 1, /* the local end is the client */
	DIR_INBOUND = 2,  /* the local end is the server */
};

/* One bundled flow: every connection that differs only by the client's
 * ephemeral port lands here. Addresses are IPv6 or IPv4-mapped IPv6
 * (::ffff:a.b.c.d), network byte order. */
struct flow_key {
	__u32 netns;          /* network namespace inode number */
	__u16 port;           /* server port, host byte order */
	__u8 proto;           /* IPPROTO_TCP, IPPROTO_UDP or PROTO_UNIX */
	__u8 direction;       /* enum direction */
	__u8 local_addr[16];  /* unix: zero */
	__u8 remote_addr[16]; /* unix: the first 8 bytes hash the server's socket path (see unix_paths) */
};
_Static_assert(sizeof(struct flow_key) == 40, "flow_key layout");

/* The counters of one bundled flow: a flow map value (shared by every
 * CPU), a spill slot's, or a flow cache slot's (one per CPU); user space
 * sums every value and slot of a key. The fields every update touches come
 * first (the interval, the jiffy, opens, process, bytes, datagrams, last
 * seen and connect latency: the first 96 bytes), so that an update touches
 * fewer cache lines: about two of a value where the counters it adds to
 * were spread over four. The layout is numbered (flowLayout,
 * internal/bundler/pin.go): change both together. */
struct flow_value {
	/* The interval (interval_now's number) the counters belong to. A
	 * program finding an older one zeroes the counters, keeping the
	 * process, before it adds (flow_entry): the drain then counts only the
	 * values of the interval it reads, and never has to reset the map.
	 * GEN_CLAIMING while a program zeroes it. Map values only: spill and
	 * cache slots are freed by the drain instead. */
	__u64 gen;
	__u64 last_jiffies; /* jiffy of last_seen_ns */
	__u64 connections;  /* opens that reached ESTABLISHED */
	__u32 pid;          /* thread-group id of the local process */
	__u32 peer_pid;     /* unix: the process at the other end, 0 if unknown */
	__u64 bytes_sent;   /* payload, from the socket's own counters */
	__u64 bytes_received;
	__u64 datagrams_sent;
	__u64 datagrams_received;
	__u64 last_seen_ns;  /* CLOCK_BOOTTIME, exact to one jiffy */
	__u64 latency_count; /* connect latency, SYN sent to ESTABLISHED */
	__u64 latency_sum_us;
	__u64 latency_max_us;
	/* TCP: the socket's smoothed RTT (srtt), one sample per read of the
	 * socket (at close, and at a drain that folds its counters); min is
	 * 0 in a value or slot that took no sample */
	__u64 rtt_samples;
	__u64 rtt_sum_us;
	__u64 rtt_min_us;
	__u64 rtt_max_us;
	__u64 first_seen_ns;      /* CLOCK_BOOTTIME */
	__u64 retransmits;        /* segments */
	__u64 failed_connections; /* opens that never did: the four causes below */
	__u64 failed_refused;
	__u64 failed_timeout; /* including connects abandoned by the caller */
	__u64 failed_reset;
	__u64 failed_unreachable;
	__u64 resets_sent;
	__u64 resets_received;
	__u64 cgroup_id;
	char comm[16]; /* the process's name (its thread-group leader's) */
	char peer_comm[16];
};
_Static_assert(sizeof(struct flow_value) == 240, "flow_value layout");

/* flow_value.pid (and peer_pid) while a program writes the process it
 * names (name_set, flow.bpf.h): flow map values and spill slots are shared
 * by every CPU, and a pid, cgroup and name written by two programs at once
 * must still name one process. User space never reads it from a drained
 * interval (its programs are done); a salvaged one reads it as no
 * process. */
enum pid_naming {
	PID_NAMING = 0xFFFFFFFFu,
};

/* flow_value.gen while a program zeroes the value for a newer interval. */
#define GEN_CLAIMING (~0ULL)

/* A bundled flow kept in the spill, the preallocated overflow of the
 * flow maps for new flows whose insert failed (bundler.bpf.c, spill). One
 * value for every CPU: programs add to it atomically. */
enum spill_state {
	SPILL_FREE = 0,     /* zero: a free slot is all zeroes */
	SPILL_CLAIMING = 1, /* a program is writing the key */
	SPILL_READY = 2,    /* key written: counts go to value */
};

struct spill_slot {
	__u32 state; /* enum spill_state */
	__u32 _pad;
	struct flow_key key;
	struct flow_value value;
};
_Static_assert(sizeof(struct spill_slot) == 288, "spill_slot layout");

/* A unix socket path, by the hash the flow key carries. */
struct unix_path {
	__u32 len; /* bytes of path used; an abstract name starts with 0 */
	char path[108];
};
_Static_assert(sizeof(struct unix_path) == 112, "unix_path layout");

/* Listening-port table: TCP listeners per namespace and port. */
struct port_key {
	__u32 netns;
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 _pad;
};
_Static_assert(sizeof(struct port_key) == 8, "port_key layout");

struct port_value {
	__u32 refs; /* sockets listening on / bound to this port */
	__u32 pid;  /* process that last started listening, 0 if unknown */
	__u64 cgroup_id;
	char comm[16];
	/* addresses of the sockets that last started listening, per family
	 * (read only through probes, and checked: still listening there) */
	__u64 listener4;
	__u64 listener6;
	__u32 queue_max;      /* deepest accept queue seen since the last harvest */
	__u32 queue_reported; /* what the current harvest reports for every listener of the port */
	__u32 harvest_gen;    /* the harvest that took queue_max */
	__u32 _pad;
};
_Static_assert(sizeof(struct port_value) == 64, "port_value layout");

/* Record written by the port-seeding iterators. */
struct listen_record {
	__u32 netns;
	__u16 port;
	__u8 proto;
	__u8 _pad;
	__u64 ino; /* the socket's inode: user space finds its process in /proc */
};
_Static_assert(sizeof(struct listen_record) == 16, "listen_record layout");

/* Record written by the harvest for every listening TCP socket. */
struct listener_record {
	__u32 netns;
	__u16 port;
	__u8 _pad[2];
	__u8 local_addr[16];
	__u32 backlog_limit; /* sk_max_ack_backlog */
	__u32 queue;         /* sk_ack_backlog now */
	__u64 drops;         /* listen drops since the previous harvest */
	__u32 pid;
	__u32 queue_max; /* deepest accept queue seen since the previous harvest */
	char comm[16];
};
_Static_assert(sizeof(struct listener_record) == 64, "listener_record layout");

/* Indexes of the per-CPU loss counters. */
enum stat_index {
	STAT_FLOW_MAP_FULL = 0,       /* bundled-flow map full: counts lost */
	STAT_FLOW_ALLOC_FAILED = 1,   /* flow insert failed for another reason (memory) */
	STAT_PORT_MAP_FULL = 2,       /* listening-port table full */
	STAT_UDP_PEER_UNKNOWN = 3,    /* UDP datagram on an unconnected socket whose peer was not seen */
	STAT_SOCK_STORAGE_FAILED = 4, /* no per-socket storage: that socket's counts lost */
	/* Runs a later copy of a program did because the kernel skipped the
	 * first copy for recursion (see recmarks.h and rec_begin). */
	STAT_REC_RESCUED_STATE = 5,
	STAT_REC_RESCUED_SEND = 6,
	STAT_REC_RESCUED_RECV = 7,
	/* Calls the first copy left to the later ones (task marks: no
	 * storage, or every slot live). */
	STAT_REC_DEFERRED_STATE = 8,
	STAT_REC_DEFERRED_SEND = 9,
	STAT_REC_DEFERRED_RECV = 10,
	STAT_MAX = 11,
};

#endif

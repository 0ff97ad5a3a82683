/* copies.bpf.h: which copy of a hot program does a tracepoint call's work
 * (see rec_task_marks in bundler.bpf.c): the first copy's per-CPU flag
 * before 6.19, the task marks of recmarks.h from 6.19. */
#ifndef COPIES_BPF_H
#define COPIES_BPF_H

/* The first copy's flag, raised for its run (per-CPU flag mode). Only the
 * first copy writes it and the kernel never nests it in itself on one CPU:
 * plain increments. */
static __always_inline __u32 *rec_begin(__u32 family)
{
	if (rec_task_marks)
		return NULL;
	__u32 *busy = bpf_map_lookup_elem(&rec_busy, &family);
	if (busy)
		*busy += 1;
	return busy;
}

static __always_inline void rec_end(__u32 *busy)
{
	if (busy)
		*busy -= 1;
}

static __always_inline bool rec_first_copy(void *ctx, __u32 deferred)
{
	if (!rec_task_marks || rec_first(ctx) == REC_PROCESS)
		return true;
	/* No storage or every slot live: left to the later copies. */
	stat_inc(deferred);
	return false;
}

static __always_inline bool rec_mid_copy(void *ctx, __u32 rescued)
{
	if (!rec_task_marks || rec_mid(ctx) != REC_PROCESS)
		return false;
	stat_inc(rescued);
	return true;
}

static __always_inline bool rec_last_copy(void *ctx, __u32 family, __u32 rescued)
{
	if (rec_task_marks) {
		if (rec_last(ctx) != REC_PROCESS)
			return false;
	} else {
		__u32 *busy = bpf_map_lookup_elem(&rec_busy, &family);
		if (!busy || !*busy)
			return false;
	}
	stat_inc(rescued);
	return true;
}

#endif /* COPIES_BPF_H */

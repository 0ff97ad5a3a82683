/* recmarks.h: process each tracepoint event exactly once although the
 * kernel may skip any run of a program for recursion (7.x runs tracepoint
 * programs preemptible: a task preempted inside program P makes every other
 * run of P on that CPU skip; on any kernel a softirq nested in a run of P
 * skips P). Written for deptrace's bundler, prototyped and measured in
 * scripts/kernel-matrix/skstress (see docs/install.md, "Recovering runs
 * skipped for recursion").
 *
 * Attach N copies of a program (separate programs: separate recursion
 * counters) to one tracepoint, in this order: the first copy, N-2 middle
 * copies, the last copy. One tracepoint call runs them in that order, in
 * one task, possibly preempted and moved to another CPU between two copies.
 * Each copy, after its filter and before any side effect:
 *
 *	first:  switch (rec_first(ctx)) { case REC_PROCESS: break;
 *	                                   default: count it (REC_NOSTORE /
 *	                                   REC_FULL); return 0; }
 *	middle: switch (rec_mid(ctx))   { case REC_PROCESS: count "rescued"; break;
 *	                                   case REC_DONE: return 0;
 *	                                   default: return 0; }
 *	last:   switch (rec_last(ctx))  { case REC_PROCESS: count "rescued"; break;
 *	                                   default: return 0; }
 *
 * then does the work. Events lost = the first copy's recursion misses +
 * its REC_NOSTORE + REC_FULL - rescued (exact when every call passes the
 * filter; an upper bound otherwise).
 *
 * A call is identified by its context address: bpf_trace_runN() builds the
 * argument array in its stack frame, at the same address for every program
 * of one call; a call nested in it (interrupt, softirq) has its own on the
 * interrupt stack or deeper. The marks live in the task's own storage, so
 * preemption and migration between copies do not matter.
 *
 * The includer may define REC_ON_STALE() (a stale mark was cleared) before
 * including. Needs vmlinux.h and bpf_helpers.h. */
#ifndef RECMARKS_H
#define RECMARKS_H

#ifndef REC_ON_STALE
/* clang-format off */
#define REC_ON_STALE() do { } while (0)
/* clang-format on */
#endif

#define REC_SLOTS 4               /* a power of two */
#define REC_MIN_STACK (16 * 1024) /* x86-64 THREAD_SIZE without KASAN */
#define REC_MAX_STACK (64 * 1024) /* more than any task or interrupt stack */

struct rec_marks {
	__u64 slot[REC_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct rec_marks);
} rec_marks SEC(".maps");

/* x86-64 runs hard and soft interrupts on per-CPU interrupt stacks (soft
 * ones otherwise in ksoftirqd, or under PREEMPT_RT from local_bh_enable(),
 * never between two copies of a call). So while a task runs a call on its
 * own stack, no other call of that task is unfinished anywhere: every other
 * mark is stale. 0: the weaker rule that holds on any architecture. */
const volatile __u32 rec_irq_own_stacks = 1;

enum rec_verdict {
	REC_PROCESS = 0, /* do the work (a middle or last copy: a rescue) */
	REC_DONE,        /* an earlier copy did it: nothing to do */
	REC_NOSTORE,     /* no task storage: cannot mark, leave it to later copies */
	REC_FULL,        /* every slot holds a live mark: leave it to later copies */
};

/* Record the call whose arguments are at x, for the task whose stack
 * starts at stack. A slot holding x is reused (no other unfinished call of
 * this task can have x), and stale marks are cleared:
 * - x on the task's stack: with rec_irq_own_stacks every other mark;
 *   otherwise those below x on that stack (an unfinished outer call's
 *   frame is above any call nested in it) and those off it (a task running
 *   on its own stack is inside no interrupt);
 * - x on an interrupt stack: marks off the task's stack that are below x
 *   (deeper on this stack, or another stack) or REC_MAX_STACK or more above
 *   it (another stack). Marks on the task's stack and just above x may be
 *   outer calls': kept.
 * The task's stack is taken as REC_MIN_STACK when deciding that x is on it
 * and as REC_MAX_STACK when deciding that a mark is off it, so a bigger
 * stack (KASAN) only makes the clearing more cautious. */
static __always_inline bool rec_mark(struct rec_marks *m, __u64 x, __u64 stack)
{
	bool x_on_task = x >= stack && x < stack + REC_MIN_STACK;
	if (x_on_task && rec_irq_own_stacks) {
		m->slot[0] = x;
		for (int i = 1; i < REC_SLOTS; i++)
			m->slot[i] = 0;
		return true;
	}
	int free = -1;
	for (int i = 0; i < REC_SLOTS; i++) {
		__u64 y = m->slot[i];
		if (y == x)
			return true;
		if (y) {
			bool y_maybe_task = y >= stack && y < stack + REC_MAX_STACK;
			bool stale;
			if (x_on_task)
				stale = y < x || !y_maybe_task;
			else
				stale = !y_maybe_task && (y < x || y >= x + REC_MAX_STACK);
			if (stale) {
				m->slot[i] = 0;
				REC_ON_STALE();
				y = 0;
			}
		}
		if (!y && free < 0)
			free = i;
	}
	if (free < 0)
		return false;
	if (free < REC_SLOTS)
		m->slot[free & (REC_SLOTS - 1)] = x;
	return true;
}

/* Is the call at x marked? With clear, its mark is removed. */
static __always_inline bool rec_marked(struct rec_marks *m, __u64 x, bool clear)
{
	bool found = false;
	for (int i = 0; i < REC_SLOTS; i++)
		if (m->slot[i] == x) {
			found = true;
			if (clear)
				m->slot[i] = 0;
		}
	return found;
}

/* The first copy: mark, then do the work (REC_PROCESS); or cannot mark. */
static __always_inline int rec_first(void *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct rec_marks *m = bpf_task_storage_get(&rec_marks, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!m)
		return REC_NOSTORE;
	return rec_mark(m, (__u64)ctx, (__u64)task->stack) ? REC_PROCESS : REC_FULL;
}

/* A middle copy: an earlier copy did it (REC_DONE); or mark and do it. */
static __always_inline int rec_mid(void *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct rec_marks *m = bpf_task_storage_get(&rec_marks, task, 0, 0);
	if (m && rec_marked(m, (__u64)ctx, false))
		return REC_DONE;
	if (!m)
		m = bpf_task_storage_get(&rec_marks, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!m)
		return REC_NOSTORE;
	return rec_mark(m, (__u64)ctx, (__u64)task->stack) ? REC_PROCESS : REC_FULL;
}

/* The last copy: an earlier copy did it (REC_DONE, its mark cleared); or
 * do it (REC_PROCESS). No storage: no copy can have marked this call. */
static __always_inline int rec_last(void *ctx)
{
	struct rec_marks *m = bpf_task_storage_get(&rec_marks, bpf_get_current_task_btf(), 0, 0);
	if (m && rec_marked(m, (__u64)ctx, true))
		return REC_DONE;
	return REC_PROCESS;
}

#endif /* RECMARKS_H */

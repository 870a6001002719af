/* Off-CPU intervals and thread states (sharing the sample path: emit.h).
 *
 * Off CPU: sched_switch notes when a recorded thread leaves a CPU and, when it comes back
 * after blocking for at least off_cpu_min_ns, that it owes a stack: its kernel stack is
 * taken then (the task has not run yet, so it is the stack it blocked in). Its user
 * registers and stack cannot be read from another task's context, but they do not change
 * until the thread runs user code again: the thread's next system-call exit copies them
 * through the same path as a CPU sample (Lua frames included), when its saved user
 * registers are still those it blocked with. Shorter intervals, waits for a CPU
 * (preemption) and blocks whose user context is gone are only counted, per thread.
 *
 * Only the part of an interval inside the recording's window counts (recording_window:
 * the span its CPU samples describe): one that began before it is cut at its start, one
 * still open at its end is cut at its end, and each thread counts the intervals cut.
 *
 * Thread states: a task iterator, run by lrec at a fixed rate, writes each recorded
 * thread's state, system call, wait and kernel stack. */
#ifndef LREC_OFFCPU_H
#define LREC_OFFCPU_H

#include "emit.h"


/* Set by lrec before load. */
const volatile __u64 off_cpu_min_ns = 1000000;
/* When lrec loaded these programs (CLOCK_MONOTONIC ns). */
const volatile __u64 attach_ns = 0;

/* The recording's window (CLOCK_MONOTONIC ns), written by lrec: start_ns is 0 until
 * sampling starts (nothing is counted before), end_ns 0 until its end is known (-d's
 * deadline, known at the start; else the moment sampling stops). */
struct lrec_window {
	__u64 start_ns;
	__u64 end_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lrec_window);
} recording_window SEC(".maps");

/* What lrec keeps per thread (task storage: freed with the task; created only for the
 * recorded processes' threads, so its presence marks one). */
struct lrec_task {
	__u64 out_ns;     /* left the CPU at; 0 while on it */
	__u64 out_ip;     /* its saved user ip and sp then */
	__u64 out_sp;
	__u32 out_state;  /* 0: preempted (runnable) */
	__u32 owed_state;
	__u64 owed_start; /* blocked intervals whose stack is owed */
	__u64 owed_ns;
	__u64 owed_ip;
	__u64 owed_sp;
	__u64 syscall_ns; /* entered the current system call at (--states) */
	__s32 syscall1;   /* its number + 1; 0: none */
	__u32 kstack_len;
	__u64 woken_ns;   /* last woken at (--states) */
	__u32 woken_from; /* the state it was woken from */
	__u32 pad;
	/* The intervals counted, not recorded, and those the window cut: copied to
	 * thread_totals when the thread exits and when lrec runs flush_totals at the end. */
	struct lrec_thread_totals totals;
	__u64 cut_at_start;
	__u64 cut_at_end;
	__u64 kstack[LREC_MAX_KSTACK];
};

/* What thread_totals holds per thread (lrec reads it as is: record/src/sampler/off_cpu.rs). */
struct lrec_thread_off_cpu {
	struct lrec_thread_totals totals;
	__u64 cut_at_start; /* intervals that began before the window: counted from its start */
	__u64 cut_at_end;   /* intervals still open at its end: counted to it */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lrec_task);
} tasks SEC(".maps");

/* Per tid: the intervals counted, not recorded (read by lrec at the end). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct lrec_thread_off_cpu);
} thread_totals SEC(".maps");

/* The kernel's struct pt_regs, the two fields read here (CO-RE relocated). */
struct pt_regs___lrec {
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* A task's saved user ip and sp: two loads, not a copy of all registers (this runs on
 * every context switch of a recorded thread). */
static __always_inline void saved_ip_sp(struct task_struct *task, __u64 *ip, __u64 *sp)
{
	struct pt_regs___lrec *ur = (void *)bpf_task_pt_regs(task);
	*ip = 0;
	*sp = 0;
	if (ur) {
		*ip = ur->ip;
		*sp = ur->sp;
	}
}

/* The recorded thread's bookkeeping, created on first sight; NULL for other threads
 * (and for the idle tasks, tgid 0, without a lookup). */
static __always_inline struct lrec_task *recorded_task(struct task_struct *task)
{
	struct lrec_task *st = bpf_task_storage_get(&tasks, task, 0, 0);
	if (st)
		return st;
	struct task_struct___lrec *t = (void *)task;
	__u32 tgid = t->tgid;
	if (!tgid || !bpf_map_lookup_elem(&targets, &tgid))
		return NULL;
	st = bpf_task_storage_get(&tasks, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (st) {
		st->totals.pid = tgid;
		st->totals.tid = t->pid;
	}
	return st;
}

/* The part of the interval [from, to] of thread st inside the recording's window: its
 * length (0 if none of it is, or the window is not open yet), and where it begins in
 * *start. Counts the interval in st as cut at the window's start or end if it was. */
static __always_inline __u64 in_window(struct lrec_task *st, __u64 from, __u64 to, __u64 *start)
{
	__u32 zero = 0;
	struct lrec_window *w = bpf_map_lookup_elem(&recording_window, &zero);
	if (!w || !w->start_ns)
		return 0;
	__u64 a = from, b = to, end = w->end_ns;
	if (a < w->start_ns)
		a = w->start_ns;
	if (end && b > end)
		b = end;
	*start = a;
	if (b <= a)
		return 0;
	st->cut_at_start += a != from;
	st->cut_at_end += b != to;
	return b - a;
}

/* A thread's bookkeeping changes at its own context switches, system-call exits and
 * lua_resume calls, which never run at the same time, and in the task iterators lrec runs
 * once at each end of the recording, which may run beside them on another CPU: the time
 * off CPU since out_ns and the time owed a stack are each taken with one exchange, so
 * that either side counts an interval, never both. */
#define lrec_take(field) __atomic_exchange_n(&(field), 0, __ATOMIC_RELAXED)

/* The owed stack can no longer be taken: count its time. */
static __always_inline void unpaired(struct lrec_task *st)
{
	__u64 d = lrec_take(st->owed_ns);
	if (d) {
		st->totals.unpaired_count += 1;
		st->totals.unpaired_ns += d;
	}
}

/* Recorded thread prev leaves the CPU. */
static __always_inline void switch_out(struct lrec_task *st, struct task_struct *prev,
				       int preempt, unsigned int prev_state, __u64 now)
{
	__u64 ip, sp;
	saved_ip_sp(prev, &ip, &sp);
	/* It ran user code since it last blocked: that stack is gone. */
	if (st->owed_ns && (ip != st->owed_ip || sp != st->owed_sp))
		unpaired(st);
	st->out_ns = now;
	st->out_state = preempt ? 0 : prev_state;
	st->out_ip = ip;
	st->out_sp = sp;
}

/* Recorded thread next gets a CPU back (NULL: it did so unseen, see on_sys_exit). Its
 * interval off CPU is classified by its whole length and counted by its part inside the
 * window. */
static __always_inline void switch_in(struct lrec_task *st, struct task_struct *next, __u64 now)
{
	__u64 from = lrec_take(st->out_ns), start;
	if (!from)
		return;
	__u64 d = in_window(st, from, now, &start);
	if (!d)
		return;
	if (st->out_state == 0) {
		st->totals.runnable_count += 1;
		st->totals.runnable_ns += d;
		return;
	}
	if (now - from < off_cpu_min_ns) {
		st->totals.short_count += 1;
		st->totals.short_ns += d;
		return;
	}
	if (st->owed_ns && (st->out_ip != st->owed_ip || st->out_sp != st->owed_sp))
		unpaired(st);
	if (!st->owed_ns) {
		st->owed_start = start;
		st->owed_state = st->out_state;
		st->owed_ip = st->out_ip;
		st->owed_sp = st->out_sp;
		/* The task has not run yet: its kernel stack is the one it blocked in. */
		long len = next ? bpf_get_task_stack(next, st->kstack, sizeof(st->kstack), 0) : 0;
		st->kstack_len = len > 0 ? len / sizeof(__u64) : 0;
	}
	__sync_fetch_and_add(&st->owed_ns, d);
}

/* Runs at every context switch of the machine: for other threads it costs a task
 * storage lookup and, for those not seen before, one of targets. */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	/* One clock read for both sides. (Two branches on the lookups: clang would OR the
	 * pointers of a combined test, which the verifier refuses.) */
	__u64 now = 0;
	struct lrec_task *st = recorded_task(prev);
	if (st) {
		now = bpf_ktime_get_ns();
		switch_out(st, prev, preempt, prev_state, now);
	}
	st = bpf_task_storage_get(&tasks, next, 0, 0);
	if (st) {
		if (!now)
			now = bpf_ktime_get_ns();
		switch_in(st, next, now);
	}
	return 0;
}

/* Copies a thread's counted intervals and cuts where lrec reads them. */
static __always_inline void flush_task_totals(struct lrec_task *st)
{
	if (!(st->totals.short_count | st->totals.runnable_count | st->totals.unpaired_count |
	      st->cut_at_start | st->cut_at_end))
		return;
	struct lrec_thread_off_cpu v = {
		.totals = st->totals,
		.cut_at_start = st->cut_at_start,
		.cut_at_end = st->cut_at_end,
	};
	bpf_map_update_elem(&thread_totals, &st->totals.tid, &v, BPF_ANY);
}

struct bpf_iter_meta___lrec {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__task___lrec {
	struct bpf_iter_meta___lrec *meta;
	struct task_struct *task;
} __attribute__((preserve_access_index));

/* Recorded thread task, off CPU and not switched since lrec attached (it has no
 * bookkeeping yet): noted as off CPU since then, in the state it is in. */
static __always_inline struct lrec_task *off_since_attach(struct task_struct *task)
{
	struct task_struct___lrec *t = (void *)task;
	if (t->on_cpu || t->exit_state)
		return NULL;
	struct lrec_task *st = recorded_task(task);
	if (st) {
		st->out_state = t->__state;
		saved_ip_sp(task, &st->out_ip, &st->out_sp);
		/* Unless it was switched out meanwhile. */
		__sync_val_compare_and_swap(&st->out_ns, 0, attach_ns);
	}
	return st;
}

/* Run once by lrec when an attached target's recording starts: a thread off CPU since
 * before lrec attached (blocked in a long call, or waiting for a CPU) is noted, so that
 * when it gets a CPU back its interval counts from the window's start, with its stack. */
SEC("iter/task")
int open_window(struct bpf_iter__task___lrec *ctx)
{
	struct task_struct *task = ctx->task;
	if (task && !bpf_task_storage_get(&tasks, task, 0, 0))
		off_since_attach(task);
	return 0;
}

/* Run once by lrec at the end, after the window closed: the living threads' totals into
 * thread_totals, with the time of blocks still in progress or whose stack is still owed
 * (counted, as their stacks cannot be taken any more) and of waits for a CPU in
 * progress, up to the window's end. */
SEC("iter/task")
int flush_totals(struct bpf_iter__task___lrec *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task)
		return 0;
	struct lrec_task *st = bpf_task_storage_get(&tasks, task, 0, 0);
	struct task_struct___lrec *t = (void *)task;
	/* Not switched since lrec attached, and blocked (a thread open_window did not see,
	 * or of a target lrec started): blocked all along. */
	if (!st && t->__state)
		st = off_since_attach(task);
	if (!st)
		return 0;
	__u64 from = lrec_take(st->out_ns);
	if (from) {
		__u64 start, d = in_window(st, from, bpf_ktime_get_ns(), &start);
		if (st->out_state == 0) {
			st->totals.runnable_count += d > 0;
			st->totals.runnable_ns += d;
		} else {
			__sync_fetch_and_add(&st->owed_ns, d);
		}
	}
	unpaired(st);
	flush_task_totals(st);
	return 0;
}

/* A recorded thread returns from a system call: if it owes the stack of a blocked
 * interval and is where it blocked, record it now. */
SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct lrec_task *st = bpf_task_storage_get(&tasks, task, 0, 0);
	if (!st)
		return 0;
	st->syscall1 = 0;
	/* Off CPU since out_ns, yet running: the switch that gave it a CPU back was not
	 * traced (on this project's machines the kernel skips about one a second of a thread
	 * woken every 10 ms, for perf as well), and it got the CPU back by now at the latest.
	 * Its user stack is still the one it blocked with; its kernel stack is gone. */
	if (st->out_ns)
		switch_in(st, NULL, bpf_ktime_get_ns());
	if (!st->owed_ns)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	struct pt_regs r;
	if (!task_user_regs(&r) || r.rip != st->owed_ip || r.rsp != st->owed_sp) {
		unpaired(st);
		return 0;
	}
	__u32 cpu = bpf_get_smp_processor_id();
	struct sample_buf *b = begin(id, cpu, LREC_KIND_OFF_CPU);
	if (!b)
		return 0;
	struct lrec_sample *s = &b->s;
	s->off_ns = lrec_take(st->owed_ns);
	if (!s->off_ns)
		return 0;
	s->flags = LREC_KERNEL_MODE;
	s->off_state = st->owed_state;
	s->off_start = st->owed_start;
	__u32 k = st->kstack_len;
	if (k > LREC_MAX_KSTACK)
		k = LREC_MAX_KSTACK;
	s->kstack_len = k;
	__builtin_memcpy(s->kstack, st->kstack, sizeof(s->kstack));
	emit(b, &r, cpu);
	return 0;
}

/* --states: a recorded thread enters a system call. */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long nr)
{
	struct lrec_task *st = recorded_task(bpf_get_current_task_btf());
	if (!st)
		return 0;
	st->syscall1 = nr + 1;
	st->syscall_ns = bpf_ktime_get_ns();
	return 0;
}

struct thread_state_buf {
	struct lrec_thread_state t;
	__u64 kstack[LREC_MAX_KSTACK];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_state_buf);
} state_buf SEC(".maps");

/* --states: the lrec thread that reads the states (set by lrec before load), when it was
 * last woken, and when it saw itself awake before the current read (CLOCK_MONOTONIC ns,
 * written by lrec before each read). */
const volatile __u32 states_reader_tid = 0;
__u64 states_reader_woken_ns = 0;
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} states_reader_awake_ns SEC(".maps");

/* --states: a recorded thread is woken; noted with the state it leaves (sched_waking runs
 * before the state changes, and only for a task that really sleeps in it). Also notes
 * when the states reader wakes. */
SEC("tp_btf/sched_waking")
int BPF_PROG(on_waking, struct task_struct *p)
{
	struct task_struct___lrec *t = (void *)p;
	if (t->pid == states_reader_tid) {
		states_reader_woken_ns = bpf_ktime_get_ns();
		return 0;
	}
	struct lrec_task *st = bpf_task_storage_get(&tasks, p, 0, 0);
	if (!st)
		return 0;
	st->woken_ns = bpf_ktime_get_ns();
	st->woken_from = t->__state;
	return 0;
}

/* Since when a target thread woken on the reader's CPU and not yet running has waited for
 * lrec: since the reader's wake-up, less the 50 µs of slack by which one timer interrupt
 * may have woken both (lrec saw itself awake up to 0.1 ms after such a wake-up); at most
 * 1 ms back, as in a longer run lrec is more likely one of many that the thread waits
 * for than the one. */
static __always_inline __u64 waiting_for_reader_since(void)
{
	__u32 zero = 0;
	__u64 *awake = bpf_map_lookup_elem(&states_reader_awake_ns, &zero);
	if (!awake)
		return -1;
	__u64 since = states_reader_woken_ns;
	if (since > *awake || *awake - since > 1000000)
		since = *awake;
	return since - 60000;
}

/* --states: one record per recorded thread, each time lrec reads the iterator. */
SEC("iter/task")
int thread_states(struct bpf_iter__task___lrec *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;
	if (!task)
		return 0;
	struct task_struct___lrec *t = (void *)task;
	__u32 tgid = BPF_CORE_READ(t, tgid);
	if (!bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	__u32 zero = 0;
	struct thread_state_buf *b = bpf_map_lookup_elem(&state_buf, &zero);
	if (!b)
		return 0;
	b->t.time_ns = bpf_ktime_get_ns();
	b->t.pid = tgid;
	b->t.tid = BPF_CORE_READ(t, pid);
	b->t.state = BPF_CORE_READ(t, __state);
	b->t.exit_state = BPF_CORE_READ(t, exit_state);
	b->t.on_cpu = BPF_CORE_READ(t, on_cpu);
	b->t.syscall = -1;
	b->t.syscall_ns = 0;
	b->t.off_since = 0;
	struct lrec_task *st = bpf_task_storage_get(&tasks, task, 0, 0);
	if (st) {
		b->t.syscall = st->syscall1 - 1;
		b->t.syscall_ns = st->syscall1 ? st->syscall_ns : 0;
		b->t.off_since = st->out_ns;
		/* Woken on this CPU since lrec woke to read, and not running yet: it waits for
		 * lrec, which holds this CPU at its high priority; without lrec it would not be
		 * waiting, so it is read in the state it was woken from. (Read as runnable, a
		 * thread that sleeps 10 ms at a time, runnable 0.1-0.25 % of the time by its own
		 * schedstat, showed 5-10 %.) Waits on other CPUs are the target's own. */
		if (!b->t.state && !b->t.on_cpu && st->woken_from &&
		    BPF_CORE_READ(t, thread_info.cpu) == bpf_get_smp_processor_id() &&
		    st->woken_ns >= waiting_for_reader_since())
			b->t.state = st->woken_from;
	}
	saved_ip_sp(task, &b->t.user_ip, &b->t.user_sp);
	long len = bpf_get_task_stack(task, b->kstack, sizeof(b->kstack), 0);
	if (len < 0)
		len = 0;
	b->t.kstack_len = len / sizeof(__u64);
	__u32 size = sizeof(b->t) + (len & 1023);
	if (size > sizeof(*b))
		size = sizeof(*b);
	bpf_seq_write(seq, b, size);
	return 0;
}

#endif

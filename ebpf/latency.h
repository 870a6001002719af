/* Timed calls (--latency, --node-loop).
 *
 * lat_entry/lat_return are a uprobe and a uretprobe on one function, attached per target
 * process with the function's probe id as cookie. Each thread keeps a shadow stack of
 * the timed calls it is in (task storage): an entry pushes (probe, stack pointer, time);
 * a return pops the entry of the same probe whose stack pointer is the one the return
 * leaves (x86-64: 8 bytes above the entry's, the return address popped). An entry is
 * paired with its own return or with nothing: a return without its entry (the call began
 * before lrec attached, or its entry was not kept) is counted, never matched with another
 * call's entry; entries the thread left without returning (longjmp, exceptions) are
 * counted when a return or a call at or above their stack address shows them dead.
 *
 * lat_mark_entry/lat_mark_return time what lies between two events (--node-loop: the
 * phases of libuv's loop, some of which the compiler inlined into uv_run, so that no
 * function bounds them): the cookie is the event's index in lat_marks, which says which
 * phase the event ends (if the thread's previous event was the one expected) and whether
 * it ends a loop iteration.
 *
 * Durations go into per-thread histograms of log-linear buckets (format/src/v1/latency.rs
 * is the reference of lat_bucket) and per-thread count/sum/min/max, with no record per
 * call unless --latency-events. A thread runs on one CPU at a time and its keys are its
 * own: no atomics are needed. */
#ifndef LREC_LATENCY_H
#define LREC_LATENCY_H

#include "common.h"


#define LAT_MAX_PROBES 256
#define LAT_DEPTH 32
#define LAT_EXACT 64
#define LAT_SUB_BITS 5
#define LAT_MAX_LOG2 47
/* Stack pointer after a function's return minus the one at its first instruction. */
#define LAT_SP_DELTA 8
#define LAT_NONE 0xffffffff

/* Per probe and CPU: [probe * LAT_COUNTERS + k]. Calls still open at the end are what
 * these and the histograms leave: hits - too deep - abandoned - timed - dropped. */
enum {
	LAT_HITS,
	LAT_UNMATCHED,
	LAT_ABANDONED,
	LAT_TOO_DEEP,
	LAT_DROPPED,
	LAT_COUNTERS = 8,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LAT_MAX_PROBES * LAT_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} lat_counters SEC(".maps");

struct lat_frame {
	__u64 sp;
	__u64 ts;
	__u32 probe;
	__u32 pad;
};

struct lat_task {
	__u32 depth;
	/* The last boundary event (lat_marks index + 1; 0: none yet) and when. */
	__u32 last_event;
	__u64 last_ts;
	/* When the current loop iteration began (0: not yet). */
	__u64 iter_ts;
	struct lat_frame stack[LAT_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lat_task);
} lat_tasks SEC(".maps");

/* What a boundary event ends: written by lrec (--node-loop). */
struct lat_mark {
	/* The phase (probe id) this event ends when the thread's previous event was
	 * `after`, or LAT_NONE. */
	__u32 phase;
	__u32 after;
	/* The loop iteration (probe id) this event ends and begins, or LAT_NONE. */
	__u32 iteration;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LAT_MAX_PROBES);
	__type(key, __u32);
	__type(value, struct lat_mark);
} lat_marks SEC(".maps");

/* struct lrec_lat_hist_key in sample.h, shared with lrec. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized by lrec with --latency */
	__type(key, struct lrec_lat_hist_key);
	__type(value, __u64);
} lat_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized by lrec with --latency */
	__type(key, struct lrec_lat_stat_key);
	__type(value, struct lrec_lat_stat);
} lat_stats SEC(".maps");

/* --latency-events: one struct lrec_lat_event per timed call. */
const volatile __u32 lat_events_on = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* sized by lrec with --latency-events */
} lat_events SEC(".maps");

/* Frame i of a shadow stack, by a masked index the compiler cannot turn into a pointer
 * walk the verifier cannot bound. */
static __always_inline struct lat_frame *lat_frame(struct lat_task *t, __u32 i)
{
	i &= LAT_DEPTH - 1;
	asm volatile("" : "+r"(i));
	i &= LAT_DEPTH - 1;
	return &t->stack[i];
}

static __always_inline void lat_counter(__u32 probe, __u32 k)
{
	__u32 i = probe * LAT_COUNTERS + k;
	if (probe >= LAT_MAX_PROBES)
		return;
	__u64 *c = bpf_map_lookup_elem(&lat_counters, &i);
	if (c)
		*c += 1;
}

static __always_inline __u32 lat_log2(__u64 v)
{
	__u32 r = 0;
#pragma unroll
	for (__u32 shift = 32; shift > 0; shift >>= 1)
		if (v >> shift) {
			v >>= shift;
			r += shift;
		}
	return r;
}

static __always_inline __u16 lat_bucket(__u64 ns)
{
	if (ns < LAT_EXACT)
		return ns;
	__u32 log2 = lat_log2(ns);
	/* Longer than the last power of two kept apart: the last bucket. */
	if (log2 > LAT_MAX_LOG2)
		return LAT_EXACT + (LAT_MAX_LOG2 - 5) * (1 << LAT_SUB_BITS) - 1;
	__u64 sub = (ns >> (log2 - LAT_SUB_BITS)) & ((1 << LAT_SUB_BITS) - 1);
	return LAT_EXACT + (log2 - 6) * (1 << LAT_SUB_BITS) + sub;
}

/* A call of `probe` by the current thread took d ns from `start`. */
static __always_inline void lat_record(__u32 probe, __u64 start, __u64 d)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct lrec_lat_hist_key hk = { .tid = (__u32)id, .probe = probe, .bucket = lat_bucket(d) };
	__u64 *c = bpf_map_lookup_elem(&lat_hist, &hk);
	if (!c) {
		__u64 zero = 0;
		bpf_map_update_elem(&lat_hist, &hk, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&lat_hist, &hk);
	}
	struct lrec_lat_stat_key sk = { .tid = (__u32)id, .probe = probe };
	struct lrec_lat_stat *s = bpf_map_lookup_elem(&lat_stats, &sk);
	if (!s) {
		struct lrec_lat_stat init = { .pid = id >> 32, .min_ns = ~0ULL };
		bpf_map_update_elem(&lat_stats, &sk, &init, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&lat_stats, &sk);
	}
	if (!c || !s) {
		lat_counter(probe, LAT_DROPPED);
		return;
	}
	*c += 1;
	s->count += 1;
	s->sum_ns += d;
	if (d < s->min_ns)
		s->min_ns = d;
	if (d > s->max_ns)
		s->max_ns = d;
	if (lat_events_on) {
		struct lrec_lat_event e = {
			.probe = probe,
			.pid = id >> 32,
			.tid = (__u32)id,
			.start_ns = start,
			.duration_ns = d,
		};
		bpf_ringbuf_output(&lat_events, &e, sizeof(e), BPF_RB_NO_WAKEUP);
	}
}

SEC("uprobe")
int lat_entry(struct pt_regs *ctx)
{
	__u32 probe = bpf_get_attach_cookie(ctx);
	lat_counter(probe, LAT_HITS);
	struct lat_task *t = bpf_task_storage_get(&lat_tasks, bpf_get_current_task_btf(), 0,
						  BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t) {
		/* Not kept, as when too deep. */
		lat_counter(probe, LAT_TOO_DEEP);
		return 0;
	}
	__u64 sp = PT_REGS_SP(ctx);
	__u32 d = t->depth;
	/* Calls this one took the place of on the stack have ended without a return: those
	 * below its stack pointer, and an earlier call of the same function at it (a call
	 * at the same address of another function is one that tail-called this one, and
	 * returns with it). */
	for (int i = 0; i < LAT_DEPTH; i++) {
		if (d == 0)
			break;
		struct lat_frame *top = lat_frame(t, d - 1);
		if (top->sp > sp || (top->sp == sp && top->probe != probe))
			break;
		lat_counter(top->probe, LAT_ABANDONED);
		d--;
	}
	if (d >= LAT_DEPTH) {
		t->depth = d;
		lat_counter(probe, LAT_TOO_DEEP);
		return 0;
	}
	struct lat_frame *f = lat_frame(t, d);
	f->sp = sp;
	f->probe = probe;
	f->ts = bpf_ktime_get_ns();
	t->depth = d + 1;
	return 0;
}

SEC("uretprobe")
int lat_return(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 probe = bpf_get_attach_cookie(ctx);
	struct lat_task *t = bpf_task_storage_get(&lat_tasks, bpf_get_current_task_btf(), 0, 0);
	if (!t) {
		lat_counter(probe, LAT_UNMATCHED);
		return 0;
	}
	__u64 sp = PT_REGS_SP(ctx) - LAT_SP_DELTA;
	__u32 d = t->depth;
	/* The entry of this very call, from the top; the ones above it are calls that
	 * never returned. */
	__u32 found = LAT_NONE;
	for (int i = 0; i < LAT_DEPTH; i++) {
		if (i >= d)
			break;
		__u32 at = (d - 1 - i) & (LAT_DEPTH - 1);
		struct lat_frame *f = lat_frame(t, at);
		if (f->sp > sp)
			break;
		if (f->sp == sp && f->probe == probe) {
			found = at;
			break;
		}
	}
	if (found == LAT_NONE) {
		lat_counter(probe, LAT_UNMATCHED);
		return 0;
	}
	for (int j = 0; j < LAT_DEPTH; j++) {
		__u32 i = found + 1 + j;
		if (i >= d)
			break;
		lat_counter(lat_frame(t, i)->probe, LAT_ABANDONED);
	}
	struct lat_frame *f = lat_frame(t, found);
	__u64 start = f->ts;
	t->depth = found;
	lat_record(probe, start, now - start);
	return 0;
}

static __always_inline int lat_mark(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 ev = bpf_get_attach_cookie(ctx);
	struct lat_mark *m = bpf_map_lookup_elem(&lat_marks, &ev);
	if (!m)
		return 0;
	struct lat_task *t = bpf_task_storage_get(&lat_tasks, bpf_get_current_task_btf(), 0,
						  BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		return 0;
	if (m->phase != LAT_NONE) {
		lat_counter(m->phase, LAT_HITS);
		if (t->last_event == m->after + 1)
			lat_record(m->phase, t->last_ts, now - t->last_ts);
		else
			lat_counter(m->phase, LAT_UNMATCHED);
	}
	if (m->iteration != LAT_NONE) {
		lat_counter(m->iteration, LAT_HITS);
		if (t->iter_ts)
			lat_record(m->iteration, t->iter_ts, now - t->iter_ts);
		t->iter_ts = now;
	}
	t->last_event = ev + 1;
	t->last_ts = now;
	return 0;
}

SEC("uprobe")
int lat_mark_entry(struct pt_regs *ctx)
{
	return lat_mark(ctx);
}

SEC("uretprobe")
int lat_mark_return(struct pt_regs *ctx)
{
	return lat_mark(ctx);
}

#endif

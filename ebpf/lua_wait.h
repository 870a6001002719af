/* Lua coroutine waits (--off-cpu, LuaJIT).
 *
 * A coroutine that yields to the C code that resumed it (lua_yield: OpenResty's
 * ngx.sleep, cosocket connects and reads) waits while its thread serves others: the
 * thread blocks in epoll_wait with no Lua frames, so off-CPU intervals cannot show it.
 * lua_yield notes when the coroutine stopped; lua_resume of the same coroutine, when it
 * waited at least off_cpu_min_ns, records the wait through the sample path: the resumer's
 * registers and stack (what woke it), and the coroutine's own Lua frames, intact while
 * it is suspended, walked from its lua_State (flagged LREC_LUA_SUSPENDED). Only its part
 * inside the recording's window counts (offcpu.h's in_window); a coroutine still
 * suspended when the recording ends is not seen. */
#ifndef LREC_LUA_WAIT_H
#define LREC_LUA_WAIT_H

#include "emit.h"
#include "offcpu.h"


/* lua_State.status of a suspended coroutine (lua.h); it follows the GC header
 * (nextgc, marked, gct) and dummy_ffid. */
#define LUA_YIELD 1

struct lua_wait_key {
	__u32 tgid;
	__u32 pad;
	__u64 l;
};

/* Per yielded coroutine: when it yielded (LRU: a coroutine never resumed is forgotten). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct lua_wait_key);
	__type(value, __u64);
} lua_yielded SEC(".maps");

/* Waits shorter than off_cpu_min_ns: [0] count, [1] nanoseconds (per CPU). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} lua_wait_short SEC(".maps");

/* The targets' yields (per CPU): lrec stops timing waits above --lua-waits-max-rate. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lua_yields SEC(".maps");

/* lua_yield(L, nresults) */
SEC("uprobe")
int on_lua_yield(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&lua_yields, &zero);
	if (n)
		*n += 1;
	struct lua_wait_key k = { .tgid = tgid, .l = PT_REGS_PARM1(ctx) };
	__u64 now = bpf_ktime_get_ns();
	bpf_map_update_elem(&lua_yielded, &k, &now, BPF_ANY);
	return 0;
}

static __always_inline void lua_wait_count_short(__u64 d)
{
	__u32 i = 0;
	__u64 *v = bpf_map_lookup_elem(&lua_wait_short, &i);
	if (v)
		*v += 1;
	i = 1;
	v = bpf_map_lookup_elem(&lua_wait_short, &i);
	if (v)
		*v += d;
}

/* lua_resume(L, nargs): L is the coroutine, suspended until now. */
SEC("uprobe")
int on_lua_resume(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct lua_wait_key k = { .tgid = id >> 32, .l = PT_REGS_PARM1(ctx) };
	__u64 *t0 = bpf_map_lookup_elem(&lua_yielded, &k);
	if (!t0)
		return 0;
	__u64 start = *t0;
	bpf_map_delete_elem(&lua_yielded, &k);
	/* Still suspended in that yield (L->status is LUA_YIELD), not a new coroutine at a
	 * freed one's address: that needs the process's layout. */
	struct lrec_lua_config *cfg = bpf_map_lookup_elem(&lua_config, &k.tgid);
	__u8 status = 0;
	if (!cfg || bpf_probe_read_user(&status, 1, (void *)(k.l + (cfg->gc64 ? 11 : 7))) ||
	    status != LUA_YIELD)
		return 0;
	/* Counted by its part inside the recording's window, under the resuming thread. */
	struct lrec_task *st = recorded_task(bpf_get_current_task_btf());
	if (!st)
		return 0;
	__u32 cpu = bpf_get_smp_processor_id();
	struct sample_buf *b = begin(id, cpu, LREC_KIND_OFF_CPU);
	if (!b)
		return 0;
	__u64 from, d = in_window(st, start, b->s.time_ns, &from);
	if (!d)
		return 0;
	if (b->s.time_ns - start < off_cpu_min_ns) {
		lua_wait_count_short(d);
		return 0;
	}
	struct lua_work *w = lua_work();
	if (!w)
		return 0;
	struct lrec_sample *s = &b->s;
	s->off_state = LREC_OFF_LUA_YIELD;
	s->off_start = from;
	s->off_ns = d;
	/* A uprobe's registers are the task's saved user registers. */
	struct pt_regs r;
	if (!task_user_regs(&r))
		return 0;
	w->suspended = k.l;
	emit(b, &r, cpu);
	w = lua_work();
	if (w)
		w->suspended = 0;
	return 0;
}

#endif

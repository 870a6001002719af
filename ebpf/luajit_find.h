/* Finding the LuaJIT VM a sampled thread runs: its global_State,
 * current lua_State and innermost C frame, validated against the thread's stack. */
#ifndef LREC_LUAJIT_FIND_H
#define LREC_LUAJIT_FIND_H

#include "luajit_work.h"
#include "luajit_read.h"

static __always_inline int in_vm(struct lua_work *w, __u64 ip)
{
	for (int i = 0; i < LREC_LUA_MAX_RANGES; i++)
		if (ip >= w->cfg.vm_start[i] && ip < w->cfg.vm_end[i])
			return 1;
	return 0;
}

/* G is the VM this thread runs when its current lua_State belongs to G and that state's
 * innermost C frame lies on this thread's stack just above sp. An idle VM (cframe 0),
 * or one that another thread runs, fails. */
static __always_inline int lua_try(struct lua_work *w, __u64 g)
{
	if (!g)
		return 0;
	__u64 l = lj_gref(w, g, w->cfg.g_cur_l);
	if (!l || lj_state(w, l, w->cfg.l_glref, 1) != g)
		return 0;
	__u64 cf = lj_state(w, l, w->cfg.l_cframe, 0) & ~3ULL;
	if (cf < w->sp || cf >= w->sp + w->window)
		return 0;
	w->g = g;
	w->l = l;
	w->cf = cf;
	return 1;
}

/* One slot of the scan: a return address into the VM sits just below the C frame of the
 * VM that made the call; that frame's SAVE_L names the state, whose glref names G. */
static long lua_scan_slot(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w)
		return 1;
	__u64 v;
	if (!copied_stack_word(w->cpu, i, &v))
		return 1;
	if (!in_vm(w, v))
		return 0;
	__u64 cf = w->sp + i * 8 + 8;
	__u64 l = lj_cstack(w, cf + w->cfg.cf_l, lj_refsize(w));
	if (!l)
		return 0;
	return lua_try(w, rdref(w, l + w->cfg.l_glref));
}

/* Finds G for this thread: DISPATCH in r14 (interpreter, GC64 traces, and C code that
 * left r14 alone), the VM this thread ran last time, or a VM return address on the
 * stack (C code called from the VM). */
static __always_inline int lua_find(struct lua_work *w, struct lrec_regs *r, __u32 tid)
{
	__u64 disp = w->cfg.gc64 ? r->r14 : (__u32)r->r14;
	if (disp > w->cfg.g2disp && lua_try(w, disp - w->cfg.g2disp))
		return 1;
	__u64 *last = bpf_map_lookup_elem(&lua_thread_vm, &tid);
	if (last && lua_try(w, *last))
		return 1;
	bpf_loop(LREC_LUA_SCAN_SLOTS, lua_scan_slot, NULL, 0);
	return w->g != 0;
}

#endif

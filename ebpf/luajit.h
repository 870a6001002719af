/* LuaJIT 2.1: finds the sampled thread's running lua_State and walks its Lua frames,
 * across the coroutines that resumed one another, into struct lrec_lua_frame records.
 * The layout of the build comes from lrec (lua_config map), which validated it against
 * the live process; nothing here assumes one.
 *
 * The walk follows lj_debug_frame (lj_debug.c) and attributes each frame to the VM's
 * native C frame (cframe) that runs it as err_unwind (lj_err.c) does, so lanalyze can put
 * every Lua frame in place of the native lj_vm_* frame that ran it. */
#ifndef LREC_LUAJIT_H
#define LREC_LUAJIT_H

#include "luajit_work.h"
#include "luajit_walk.h"
#include "luajit_callback.h"
#include "luajit_trace.h"

/* Fills the Lua stack header after the walk: h at offset, the walk's frames after it. */
static __always_inline __u32 lua_stack_end(struct sample_buf *b, struct lua_work *w,
					   __u32 offset, __u64 l0, __u64 cf0, __s32 vmstate)
{
	if (w->n >= LREC_LUA_MAX_FRAMES && w->frame > w->bot)
		w->flags |= LREC_LUA_TRUNCATED;
	struct lrec_lua_stack *h = (void *)&b->data[offset & (LREC_DATA_SIZE - 1)];
	h->g = w->g;
	h->l = l0;
	h->cframe = cf0;
	h->vmstate = vmstate;
	/* Frames taken from the memo are named, not sent (lua_memo_header). */
	__u32 sent = w->n - lua_memo_header(&w->memo, h);
	h->nframes = sent;
	h->flags = w->flags;
	h->stale = w->stale;
	h->pad = 0;
	return sizeof(struct lrec_lua_stack) + sent * sizeof(struct lrec_lua_frame);
}

/* The frames of coroutine w->suspended, which yielded from a C function (lua_yield):
 * its stack is as it left it, L->base being the C function's, and it has no C frame
 * (the walk ends at its bottom). */
static __noinline __u32 lua_suspended_stack(struct sample_buf *b, struct lua_work *w,
					    __u32 offset)
{
	__u64 l = w->suspended;
	w->g = lj_state(w, l, w->cfg.l_glref, 1);
	__u64 stack = lj_state(w, l, w->cfg.l_stack, 1);
	__u64 base = lj_state(w, l, w->cfg.l_base, 0);
	if (!w->g || base <= stack || base > lj_state(w, l, w->cfg.l_maxstack, 1) || (base & 7))
		return 0;
	w->cf = 0;
	w->cf_last = 0;
	w->nres_of = 0;
	w->nres = 0;
	w->flags = LREC_LUA_SUSPENDED;
	lua_start(w, l, stack, base, 0);
	w->out = offset + sizeof(struct lrec_lua_stack);
	w->jit_start = 0;
	w->memo.note = 0;
	w->memo.try = 0;
	w->memo.used = 0;
	w->memo.made = 0;
	bpf_loop(LREC_LUA_MAX_STEPS, lua_step, NULL, 0);
	return lua_stack_end(b, w, offset, l, 0, (__s32)lj_g(w, w->g, w->cfg.g_vmstate));
}

/* Appends the sample's Lua stack after its stack bytes, when the thread runs a known
 * LuaJIT VM. Returns the bytes written. */
static __always_inline __u32 lua_stack(struct sample_buf *b, struct lrec_regs *r, __u32 tgid,
				       __u32 tid, __u32 cpu, __u32 offset)
{
	struct lrec_lua_config *cfg = bpf_map_lookup_elem(&lua_config, &tgid);
	if (!cfg || !r->sp)
		return 0;
	struct lua_work *w = lua_work();
	if (!w)
		return 0;
	__builtin_memcpy(&w->cfg, cfg, sizeof(*cfg));
	w->sp = r->sp;
	w->window = b->s.stack_len ? b->s.stack_len : LREC_PAGE_SIZE;
	w->cpu = cpu;
	w->tgid = tgid;
	w->gen = lua_proto_gen_now();
	w->frees = lua_frees_now(tgid, LUA_VM_LUAJIT);
	w->audit = lua_frees_audit();
	w->g = 0;
	w->n = 0;
	w->flags = 0;
	w->nres_of = 0;
	w->last_pt = 0;
	w->last_func = 0;
	w->last_call = 0;
	w->last_name = 0;
	w->fn_addr = 0;
	w->pt_addr = 0;
	w->ptwin.lo = 0;
	w->pt_prev = 0;
	w->site_check = 0;
	w->site_fill = 0;
	w->stale = 0;
	w->known_func = 0;
	w->lh_of = 0;
	w->gh_of = 0;
	if (w->suspended)
		return lua_suspended_stack(b, w, offset);
	if (!lua_find(w, r, tid))
		return 0;
	note_thread_vm(&lua_thread_vm, tid, w->g);
	__u64 cf0 = w->cf;
	w->cf_last = w->cf;

	/* The live base: jit_base in a trace, BASE (rdx) and PC (rbx) in the interpreter,
	 * L->base and the C frame's saved PC once the VM called C. */
	__s32 vmstate = (__s32)lj_g(w, w->g, w->cfg.g_vmstate);
	__u64 base, pc;
	if (vmstate >= 0) {
		base = lj_gref(w, w->g, w->cfg.g_jit_base);
		pc = 0;
	} else if (in_vm(w, r->ip)) {
		base = w->cfg.gc64 ? r->dx : (__u32)r->dx;
		pc = w->cfg.gc64 ? r->bx : (__u32)r->bx;
	} else {
		base = lj_state(w, w->l, w->cfg.l_base, 0);
		pc = cframe_pc(w, w->cf);
	}
	__u64 stack = lj_state(w, w->l, w->cfg.l_stack, 1);
	__u64 maxstack = lj_state(w, w->l, w->cfg.l_maxstack, 1);
	int trace = vmstate >= 0;
	if (base <= stack || base > maxstack || (base & 7)) {
		base = lj_state(w, w->l, w->cfg.l_base, 0);
		pc = cframe_pc(w, w->cf);
		trace = 0;
	}
	__u64 l0 = w->l;
	lua_start(w, w->l, stack, base, pc);
	if (lua_callback_pending(w, cf0)) {
		/* The innermost C frame is an FFI callback's whose Lua frame is not (or no
		 * longer) on the stack: the frames there are its caller's, which run in the
		 * previous C frame. */
		__u64 prev = lj_cstack(w, cf0 + w->cfg.cf_prev, 8) & ~3ULL;
		if (prev) {
			w->cf = prev;
			w->cf_last = prev;
		}
	}
	w->out = offset + sizeof(struct lrec_lua_stack);
	w->jit_start = trace;
	lj_memo_start(w);
	if (trace)
		/* The functions inlined into the trace; the walk goes on from its start frame. */
		lua_trace(w, r->ip, vmstate);
	w->memo.from = w->n;
	bpf_loop(LREC_LUA_MAX_STEPS, lua_step, NULL, 0);
	lj_memo_end(w);
	return lua_stack_end(b, w, offset, l0, cf0, vmstate);
}

#endif

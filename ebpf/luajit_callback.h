/* LuaJIT FFI callbacks: whether the innermost C frame is a
 * callback's whose Lua frame is not on the stack (entered and not set up yet, or returned
 * and not left yet), found by a short walk from the top. */
#ifndef LREC_LUAJIT_CALLBACK_H
#define LREC_LUAJIT_CALLBACK_H

#include "luajit_work.h"
#include "luajit_walk.h"

/* Frames looked at from the top for an FFI callback's own frame. */
#define LREC_CB_FRAMES 8

/* One frame of the look for an FFI callback's frame (lua_callback_pending): 1 stops. */
static long lua_cb_step(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w || w->frame <= w->bot)
		return 1;
	__u64 func, link;
	lj_frame(w, &func, &link);
	__u64 typep = link & 7, delta = link & ~7ULL;
	if (typep == LJ_FRAME_CONT && func != w->l) {
		__u64 contv = w->cfg.gc64 ? lj_stack_word(w, w->frame - 24)
					  : (__u32)lj_stack_word(w, w->frame - 8);
		if (contv == LJ_CONT_FFI_CALLBACK) {
			w->cb_seen = 1; /* the callback's frame: it runs */
			return 1;
		}
	}
	if (typep == LJ_FRAME_C || typep == LJ_FRAME_CP) {
		w->cb_seen = 2; /* its caller's C entry first: it does not */
		return 1;
	}
	if ((link & 3) == LJ_FRAME_LUA) {
		__u64 pc = w->cfg.gc64 ? link : (__u32)link;
		w->frame = lj_caller_frame(w, w->frame, lj_call_a(pc));
		return 0;
	}
	if (!delta)
		return 1;
	w->frame -= delta;
	return 0;
}

/* Whether C frame cf is an FFI callback's (lj_vm_ffi_callback stored cf + CFRAME_SIZE in
 * CTState.cb.stack, one of the two words at cfg.cts_stack) whose
 * Lua frame is not on the stack walked from w->frame: entered and not set up yet, or
 * returned and not left yet. Leaves the walk's position as it was. */
static __always_inline int lua_callback_pending(struct lua_work *w, __u64 cf)
{
	/* G->ctype_state: the FFI is loaded. */
	__u64 cts = lj_gref(w, w->g, w->cfg.g_ctype_state);
	if (!cts || !w->cfg.cts_stack)
		return 0;
	__u64 stack[2] = {};
	bpf_probe_read_user(stack, sizeof(stack), (void *)(cts + w->cfg.cts_stack));
	__u64 mark = cf + w->cfg.cf_size;
	if (stack[0] != mark && stack[1] != mark)
		return 0;
	__u64 frame = w->frame;
	w->cb_seen = 0;
	bpf_loop(LREC_CB_FRAMES, lua_cb_step, NULL, 0);
	w->frame = frame;
	return w->cb_seen == 2;
}

#endif

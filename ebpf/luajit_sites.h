/* LuaJIT call sites, remembered across samples: a Lua frame's
 * caller lies below it by its call's A operand, which the walk would otherwise read from
 * the caller's bytecode at every frame, and runs the proto that bytecode belongs to, which
 * it would read too. lua_sites (lua_protos.h) remembers both per return PC. A site is used
 * only once this sample proved it (lua_protos.h says how): a proto freed, by the GC or
 * with its VM, and another allocated at its address fails that, and the frame is read in
 * full. lj_to_caller moves to a Lua frame's caller; lj_site_step walks a caller located
 * so, when it is a Lua function called from Lua. */
#ifndef LREC_LUAJIT_SITES_H
#define LREC_LUAJIT_SITES_H

#include "luajit_work.h"
#include "luajit_frame.h"
#include "luajit_memo.h"

/* Whether lua_sites holds the call at return PC w->pc and its proto is still the one at
 * its address (no proto freed since, else, or in a sample audited, one read of its
 * fields, shared with the frames of a recursion through it): its A in w->last_a, the caller's proto in w->site_key. A
 * site that fails counts in w->stale. */
static __always_inline int lj_site_cached(struct lua_work *w)
{
	struct lua_site *s = lua_site_find(w->pc, w->tgid, w->gen);
	if (!s)
		return 0;
	struct lua_proto_key k = s->k;
	int unfreed = lua_site_unfreed(s, w->frees);
	if (!unfreed || w->audit) {
		int read = !lj_proto_key(w, s->k.ptr, &k);
		if (!read || !lua_proto_key_eq(&k, &s->k)) {
			if (unfreed && read) {
				lua_frees_wrong(w->tgid, LUA_VM_LUAJIT);
				w->frees = LUA_FREES_UNCOUNTED;
			}
			w->stale++;
			return 0;
		}
		lua_site_proved(s, w->frees);
	}
	w->last_a = s->a;
	w->site_key = k;
	return 1;
}

/* Takes the frame at w->frame, located by a remembered A, as the caller running the
 * remembered proto (a Lua frame's return PC lies in its own function's bytecode): the
 * proto, proved to be the one remembered, holds the return PC, so the bytecode before it,
 * and its A, are the ones remembered (the frame goes out marked LREC_FRAME_FROM_SITE).
 * lua_emit takes the proto from here (w->known_func, w->known_pt), reading neither the
 * frame's GCfunc nor its proto again. 0 when the frame holds no function. */
static __always_inline int lj_site_use(struct lua_work *w)
{
	__u64 func, link;
	lj_frame(w, &func, &link);
	__u64 pt = w->site_key.ptr;
	if (!func || !lj_pc_in(w->last_call, pt + w->cfg.pt_size, w->site_key.sizebc))
		return 0;
	w->known_func = func;
	w->known_pt = pt;
	return 1;
}

/* Moves from the Lua frame at w->frame, whose return PC is w->pc, to its caller. The
 * call's A operand sizes the caller's frame: the same call site again in a recursion is
 * read once; one seen in an earlier sample is taken from lua_sites (the frame it locates
 * is then named by it: lj_site_use), else read from the bytecode and remembered once the
 * caller is emitted (site_fill). */
static __always_inline void lj_to_caller(struct lua_work *w)
{
	if (w->pc != w->last_call) {
		w->last_call = w->pc;
		if (lj_site_cached(w)) {
			w->site_check = 1;
			w->site_callee = w->frame;
		} else {
			w->last_a = lj_call_a(w->pc);
			w->site_fill = w->pc;
		}
	}
	w->frame = lj_caller_frame(w, w->frame, w->last_a);
}

/* The step of a frame located by a remembered call site (w->site_check) when it is a Lua
 * function called from Lua, as most of a deep stack is: emits it from the site
 * (LREC_FRAME_FROM_SITE, as lua_emit would) and moves to its caller, with none of the
 * general step's cases. 0 when the frame is not such a frame (lua_step takes it). */
static __always_inline int lj_site_step(struct lua_work *w)
{
	struct lrec_lua_config *c = &w->cfg;
	if (w->frame <= w->bot)
		return 0;
	__u64 func, link;
	lj_frame(w, &func, &link);
	__u64 pt = w->site_key.ptr, bc = pt + c->pt_size;
	/* Not a dummy frame, called from Lua, and above the stack top of any C frame that
	 * ended below (lua_step's C frame loop would have nothing to do). */
	if (!func || func == w->l || (link & 3) != LJ_FRAME_LUA ||
	    !lj_pc_in(w->last_call, bc, w->site_key.sizebc) || w->nres_of != w->cf ||
	    (w->nres < 0 && w->frame < w->stack + (__u64)(-(__s64)w->nres)))
		return 0;
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &w->cpu);
	if (!b)
		return 0;
	struct lrec_lua_frame *f = (void *)&b->data[w->out & (LREC_DATA_SIZE - 1)];
	lua_frame_of_key(f, &w->site_key);
	f->cframe = w->cf;
	f->pos = (__u32)((w->last_call - bc) / 4) - 1;
	f->ffid = 0;
	f->link = link & 7;
	f->check = LREC_FRAME_FROM_SITE;
	f->pad = 0;
	w->out += sizeof(struct lrec_lua_frame);
	w->n++;
	lj_memo_note(w, func, link, 1);
	w->site_check = 0;
	w->site_fill = 0;
	w->last_func = func;
	w->last_pt = pt;
	w->last_bc = bc;
	w->pc = lj_caller_pc(w, link, 0);
	lj_to_caller(w);
	lj_memo_next(w);
	return 1;
}

#endif

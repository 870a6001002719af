/* LuaJIT call sites, remembered across samples (included by luajit.h): a Lua frame's
 * caller lies below it by its call's A operand, which the walk would otherwise read from
 * the caller's bytecode at every frame, and runs the proto that bytecode belongs to, which
 * it would read too. lua_sites (lua_protos.h) remembers both per return PC; lrec checks
 * the proto after the sample (LREC_FRAME_CHECK_PROTO). */
#ifndef LREC_LUAJIT_SITES_H
#define LREC_LUAJIT_SITES_H

/* Whether lua_sites holds the call at return PC w->pc: its A in w->last_a, the caller's
 * proto in w->site_key (lj_site_use). */
static __always_inline int lj_site_cached(struct lua_work *w)
{
	struct lua_site *s = lua_site_slot(w->pc);
	if (!s || s->pc != w->pc || s->k.tgid != w->tgid)
		return 0;
	w->last_a = s->a;
	w->site_key = s->k;
	return 1;
}

/* Takes the frame at w->frame, located by a remembered A, as the caller running the
 * remembered proto (a Lua frame's return PC lies in its own function's bytecode): the
 * proto holds the return PC, so the bytecode before it, and its A, are the ones
 * remembered, as long as that proto is still the one at its address, which lrec checks
 * (the frame goes out marked LREC_FRAME_CHECK_PROTO). lua_emit takes the proto from here
 * (w->known_func, w->known_pt), reading neither the frame's GCfunc nor its proto. 0 when
 * the frame holds no function. */
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

#endif

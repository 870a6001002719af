/* LuaJIT call sites, remembered across samples (included by luajit.h): a Lua frame's
 * caller lies below it by its call's A operand, which the walk would otherwise read from
 * the caller's bytecode at every frame. A remembered A is used only once the frame it
 * locates proves to be the caller (lj_site_verify). */
#ifndef LREC_LUAJIT_SITES_H
#define LREC_LUAJIT_SITES_H

/* Whether lua_sites holds the call at return PC w->pc: its A in w->last_a, the caller's
 * proto in w->site_key, to be checked (lj_site_verify). */
static __always_inline int lj_site_cached(struct lua_work *w)
{
	struct lua_site *s = lua_site_slot(w->pc);
	if (!s || s->pc != w->pc || s->k.tgid != w->tgid)
		return 0;
	w->last_a = s->a;
	w->site_key = s->k;
	return 1;
}

/* Whether the frame at w->frame, located by a remembered A, is the caller: the remembered
 * proto (same address, same key: the identity lua_protos_seen uses) is alive and holds
 * the return PC, so the bytecode before that PC, and its A, are the ones remembered. Else
 * the A was another call's, at a PC reused since. The frame then runs that proto (a Lua
 * frame's return PC lies in its own function's bytecode): lua_emit takes it from here
 * (w->known_func, w->known_pt) without reading the frame's GCfunc. */
static __always_inline int lj_site_verify(struct lua_work *w)
{
	__u64 func, link;
	lj_frame(w, &func, &link);
	__u64 pt = w->site_key.ptr;
	struct lua_proto_key k;
	if (!func || lj_proto_key(w, pt, &k) || !lua_proto_key_eq(&k, &w->site_key) ||
	    !lj_pc_in(w->last_call, pt + w->cfg.pt_size, k.sizebc))
		return 0;
	w->known_func = func;
	w->known_pt = pt;
	return 1;
}

/* Remembers the call read at return PC w->site_fill, now that its caller f is emitted
 * and holds that PC. */
static __always_inline void lj_site_fill(struct lua_work *w, struct lrec_lua_frame *f)
{
	struct lua_site *s = lua_site_slot(w->site_fill);
	if (!s)
		return;
	s->pc = w->site_fill;
	s->a = w->last_a;
	lua_proto_key_of(&s->k, w->tgid, f);
}

#endif

/* LuaJIT's frames: a frame's function, proto, caller and return PC, read as lj_frame.h
 * lays them out. */
#ifndef LREC_LUAJIT_FRAME_H
#define LREC_LUAJIT_FRAME_H

#include "luajit_work.h"
#include "luajit_read.h"
#include "luajit_find.h"

/* The PC saved in a C frame (where the VM left its Lua code for C). */
static __always_inline __u64 cframe_pc(struct lua_work *w, __u64 cf)
{
	return lj_cstack(w, cf + w->cfg.cf_pc, lj_refsize(w));
}

/* Starts walking state l (whose stack begins at `stack`) from base, the first frame's PC
 * being pc (0: unknown). */
static __always_inline void lua_start(struct lua_work *w, __u64 l, __u64 stack, __u64 base,
				      __u64 pc)
{
	w->l = l;
	w->stack = stack;
	w->bot = w->stack + (w->cfg.gc64 ? 8 : 0);
	w->frame = base - 8;
	w->pc = pc;
	w->win.lo = 0;
}

/* At the bottom of a coroutine: coroutine.resume and coroutine.wrap's functions call
 * vm_resume from the resumer's VM frame, whose C frame lies right above the
 * coroutine's first one and names the resumer in SAVE_L. A coroutine resumed from C
 * (lua_resume) has C code there instead, and the walk ends. */
static __always_inline int lua_parent(struct lua_work *w)
{
	if (!w->cf_last)
		return 0;
	__u64 pcf = w->cf_last + w->cfg.cf_size;
	__u64 pl = lj_cstack(w, pcf + w->cfg.cf_l, lj_refsize(w));
	if (!pl || pl == w->l || lj_state(w, pl, w->cfg.l_glref, 1) != w->g)
		return 0;
	if ((lj_state(w, pl, w->cfg.l_cframe, 0) & ~3ULL) != pcf)
		return 0;
	w->cf = pcf;
	w->cf_last = pcf;
	lua_start(w, pl, lj_state(w, pl, w->cfg.l_stack, 1), lj_state(w, pl, w->cfg.l_base, 0),
		  0);
	return 1;
}

/* Copies a proto's chunk name and line table out the first time a sample runs it. */
static __always_inline void lua_note_proto(struct lua_work *w, struct lrec_lua_frame *f)
{
	struct lua_proto_key k;
	struct lrec_lua_proto *p = lua_proto_begin(&k, w->tgid, w->gen, f);
	if (!p)
		return;
	__u32 len = rd32(f->chunkname + w->cfg.str_len);
	p->chunkname_len = len;
	if (len > LREC_LUA_CHUNKNAME)
		len = LREC_LUA_CHUNKNAME;
	if (len && bpf_probe_read_user(p->name, len & (2 * LREC_LUA_CHUNKNAME - 1),
				       (void *)(f->chunkname + w->cfg.str_data)))
		return;
	__u32 width = f->numline < 256 ? 1 : f->numline < 65536 ? 2 : 4;
	__u32 n = (f->sizebc ? f->sizebc - 1 : 0) * width;
	if (n > LREC_LUA_LINEINFO)
		n = LREC_LUA_LINEINFO;
	__u64 li = rdref(w, f->ptr + w->cfg.pt_lineinfo);
	p->lineinfo_len = 0;
	if (n && li &&
	    !bpf_probe_read_user(p->lineinfo, n & (2 * LREC_LUA_LINEINFO - 1), (void *)li))
		p->lineinfo_len = n;
	lua_proto_commit(p, &k);
}

/* Reads the GCfunc at func into w->fn, unless this sample read it there already. */
static __always_inline int lj_read_fn(struct lua_work *w, __u64 func)
{
	if (w->fn_addr == func)
		return 0;
	w->fn_addr = 0;
	if (bpf_probe_read_user(w->fn, 48, (void *)func))
		return -1;
	w->fn_addr = func;
	return 0;
}

/* The key of proto pt (its size, chunk name and lines, read at once into w->pt unless
 * this sample read them already, and its chunk name's identity). */
static __always_inline int lj_proto_key(struct lua_work *w, __u64 pt, struct lua_proto_key *k)
{
	struct lrec_lua_config *c = &w->cfg;
	if (w->pt_addr != pt) {
		w->pt_addr = 0;
		/* The span lrec computed, which holds the four fields: from the window of
		 * protos read in this sample (reaching on from the proto read before), else
		 * read alone. */
		__u64 *dst = (__u64 *)w->pt;
		int off = window_toward(&w->ptwin, pt + c->pt_lo, c->pt_span & 0x7f, w->pt_prev);
		w->pt_prev = pt + c->pt_lo;
		if (off >= 0) {
			__u8 *src = &w->ptwin.buf[off & (WINDOW - 1)];
			for (int i = 0; i < 16; i++)
				dst[i] = *(__u64 *)&src[i * 8];
		} else if (bpf_probe_read_user(w->pt, c->pt_span & 0x7f, (void *)(pt + c->pt_lo))) {
			return -1;
		}
		w->pt_addr = pt;
	}
	__u32 o_name = (c->pt_chunkname - c->pt_lo) & 0x7f;
	__u32 o_line = (c->pt_firstline - c->pt_lo) & 0x7f;
	__u32 o_num = (c->pt_numline - c->pt_lo) & 0x7f;
	__u32 o_size = (c->pt_sizebc - c->pt_lo) & 0x7f;
	k->tgid = w->tgid;
	k->ptr = pt;
	k->chunkname = buf_ref(w, w->pt, o_name);
	k->firstline = *(__s32 *)&w->pt[o_line];
	k->numline = *(__u32 *)&w->pt[o_num];
	k->sizebc = *(__u32 *)&w->pt[o_size];
	k->gen = w->gen;
	/* GCstr: its id (2.1's sid, or its hash in older builds) and the word after it
	 * (cfg.str_id) identify it; the frames of one chunk share it (read once per sample). */
	if (k->chunkname != w->last_name) {
		__u64 id = rd64(k->chunkname + c->str_id);
		w->last_name = k->chunkname;
		w->last_name_id = (__u32)id ^ (__u32)(id >> 32);
	}
	k->name_id = w->last_name_id;
	return 0;
}

/* Whether slot pos lies below the stack top that C frame w->cf saved, when it ended without
 * a Lua frame of its own (cpcall: lua_load, the trace recorder; its nres < 0), its nres read
 * once per C frame: the frames there run in the previous C frame. */
static __always_inline int lj_below_cframe(struct lua_work *w, __u64 pos)
{
	if (w->nres_of != w->cf) {
		w->nres_of = w->cf;
		w->nres = (__s32)lj_cstack(w, w->cf + w->cfg.cf_nres, 4);
	}
	return w->nres < 0 && pos < w->stack + (__u64)(-(__s64)w->nres);
}

/* Whether pc (a return or current PC) lies in the bytecode at bc, of sizebc instructions. */
static __always_inline int lj_pc_in(__u64 pc, __u64 bc, __u32 sizebc)
{
	return pc > bc && pc - bc <= 4ULL * sizebc;
}

/* The A operand of the call before return PC pc: the caller's frame lies 1 + A slots (and
 * GC64's link slot) below the callee's. */
static __always_inline __u64 lj_call_a(__u64 pc)
{
	return (rd32(pc - 4) >> 8) & 0xff;
}

/* The frame of the caller of the Lua frame at frame, whose call's A operand is a. */
static __always_inline __u64 lj_caller_frame(struct lua_work *w, __u64 frame, __u64 a)
{
	return frame - 8 * (1 + (w->cfg.gc64 ? 1 : 0) + a);
}

/* The PC a frame's caller runs at, from the frame's link: the return PC for a Lua frame
 * (its link), `cont` for a continuation frame (a metamethod the VM called keeps its
 * caller's PC), else unknown (0). */
static __always_inline __u64 lj_caller_pc(struct lua_work *w, __u64 link, __u64 cont)
{
	if ((link & 3) == LJ_FRAME_LUA)
		return w->cfg.gc64 ? link : (__u32)link;
	return (link & 7) == LJ_FRAME_CONT ? cont : 0;
}

#endif

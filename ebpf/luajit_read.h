/* LuaJIT's walk reading the sampled process's memory: single words, the Lua stack through a window, GC64/GC32 references, and the
 * lua_State and global_State fields, each state's read once per sample. */
#ifndef LREC_LUAJIT_READ_H
#define LREC_LUAJIT_READ_H

#include "luajit_work.h"

static __always_inline __u64 rd64(__u64 addr)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline __u32 rd32(__u64 addr)
{
	__u32 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

/* A field of size bytes (8, or 4 read as unsigned) of one of the VM's C frames at addr,
 * from the sample's copy of the thread's stack when it lies there (copied_stack_at), else
 * read (a read costs about 70 ns per sample here, a third of a frame's walk). */
static __always_inline __u64 lj_cstack(struct lua_work *w, __u64 addr, __u32 size)
{
	__u64 v;
	if (addr >= w->sp && copied_stack_at(w->cpu, addr - w->sp, &v))
		return size == 8 ? v : (__u32)v;
	return size == 8 ? rd64(addr) : rd32(addr);
}

/* The word at addr (8-byte aligned) of the Lua stack being walked, from a window of it
 * (not below the stack's start): one read for the frames of a few hundred bytes. */
static __always_inline __u64 lj_stack_word(struct lua_work *w, __u64 addr)
{
	int off = window_at(&w->win, addr, 8, w->stack);
	if (off < 0)
		return rd64(addr);
	return *(__u64 *)&w->win.buf[off & (WINDOW - 1)];
}

/* The function and the link of a frame from its slot's word (GC64: the link) and, GC64,
 * the word below it (the function). */
static __always_inline void lj_frame_words(__u64 gc64, __u64 slot, __u64 below, __u64 *func,
					   __u64 *link)
{
	if (gc64) {
		*link = slot;
		*func = below & LJ_GCVMASK;
	} else {
		*func = (__u32)slot;
		*link = (__u64)(__s64)(__s32)(slot >> 32);
	}
}

/* The function and the link of the frame at w->frame. */
static __always_inline void lj_frame(struct lua_work *w, __u64 *func, __u64 *link)
{
	/* The link first: a new window ends right above it, the function below. */
	__u64 slot = lj_stack_word(w, w->frame);
	lj_frame_words(w->cfg.gc64, slot, w->cfg.gc64 ? lj_stack_word(w, w->frame - 8) : 0,
		       func, link);
}

/* A GCRef or MRef is 64 bits in GC64 builds, 32 bits otherwise: its size, and one read. */
static __always_inline __u32 lj_refsize(struct lua_work *w)
{
	return w->cfg.gc64 ? 8 : 4;
}

static __always_inline __u64 rdref(struct lua_work *w, __u64 addr)
{
	return w->cfg.gc64 ? rd64(addr) : rd32(addr);
}

/* A GCRef or MRef at offset o of bytes already copied (o bounded by the caller). */
static __always_inline __u64 buf_ref(struct lua_work *w, __u8 *buf, __u32 o)
{
	return w->cfg.gc64 ? *(__u64 *)&buf[o] : *(__u32 *)&buf[o];
}

/* The field at offset off of lua_State l (a GCRef when ref, else 64 bits), from its
 * header read once per sample; alone when the header cannot be read whole (a state at the
 * end of a mapping). */
static __always_inline __u64 lj_state(struct lua_work *w, __u64 l, __u32 off, int ref)
{
	if (l != w->lh_of) {
		w->lh_of = 0;
		__u32 n = w->cfg.lh_size;
		if (n > 128)
			n = 128;
		if (!l || !n || bpf_probe_read_user(w->lh, n, (void *)l))
			return ref ? rdref(w, l + off) : rd64(l + off);
		w->lh_of = l;
	}
	return ref ? buf_ref(w, w->lh, off & 127) : *(__u64 *)&w->lh[off & 127];
}

/* The 64 bits at offset off of global_State g, one of the fields in cfg's span (lj_gref
 * narrows a GCRef), from the span read once per sample; alone when it cannot be read at
 * once. */
static __always_inline __u64 lj_g(struct lua_work *w, __u64 g, __u32 off)
{
	__u32 o = off - w->cfg.gh_lo, n = w->cfg.gh_size;
	if (n > 256)
		n = 256;
	if (o >= n)
		return rd64(g + off);
	if (g != w->gh_of) {
		w->gh_of = 0;
		if (!g || bpf_probe_read_user(w->gh, n, (void *)(g + w->cfg.gh_lo)))
			return rd64(g + off);
		w->gh_of = g;
	}
	asm volatile("" : "+r"(o)); /* keeps the mask for the verifier */
	return *(__u64 *)&w->gh[o & 255];
}

static __always_inline __u64 lj_gref(struct lua_work *w, __u64 g, __u32 off)
{
	__u64 v = lj_g(w, g, off);
	return w->cfg.gc64 ? v : (__u32)v;
}

/* Where a GC object's type (GCHeader.gct) lies in it. */
static __always_inline __u32 lj_gct(struct lua_work *w)
{
	return w->cfg.gc64 ? 9 : 5;
}

#endif

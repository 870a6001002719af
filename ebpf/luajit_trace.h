/* LuaJIT traces: a sample in JIT-compiled code is named by the snapshot that covers the
 * sampled instruction, as LuaJIT's own lj_trace_unwind finds it: the frames of the
 * functions inlined into the trace, innermost first, with their current lines, then the
 * trace's start frame at the PC the outermost inlined call left. The trace is read while
 * it runs, so it cannot have been flushed. The sample's walk (lua_stack, luajit.h) calls
 * lua_trace; the trace's frames are emitted as the walk's are (lua_emit). */
#ifndef LREC_LUAJIT_TRACE_H
#define LREC_LUAJIT_TRACE_H

#include "luajit_work.h"
#include "luajit_walk.h"

#define LJ_GCT_TRACE 9 /* ~LJ_TTRACE */
/* Snapshots (lj_jit.h): entries are slot << 24 | flags | IR ref. */
#define LJ_SNAP_FRAME 0x010000
#define LJ_SNAP_CONT 0x020000
#define LJ_REF_BIAS 0x8000 /* IR constants have refs below it */
#define LJ_IRT_FUNC 8
#define LJ_IRT_NUM 14

/* A trace's field at offset off (from the GCtrace copied into w->tr). */
static __always_inline __u64 tr_u64(struct lua_work *w, __u32 off)
{
	return *(__u64 *)&w->tr[off & 0x7f];
}

static __always_inline __u32 tr_u32(struct lua_work *w, __u32 off)
{
	return *(__u32 *)&w->tr[off & 0x7f];
}

static __always_inline __u32 tr_u16(struct lua_work *w, __u32 off)
{
	return *(__u16 *)&w->tr[off & 0x7f];
}

/* Reads the trace's IR constant `ref` into ins (16 bytes: a 64-bit payload follows its
 * instruction); 0 unless it is one of IR type irt. */
static __always_inline int ir_const(struct lua_work *w, __u32 ref, __u8 irt, __u8 *ins)
{
	if (!ref || ref >= LJ_REF_BIAS ||
	    bpf_probe_read_user(ins, 16, (void *)(w->tr_ir + (__u64)ref * 8)))
		return 0;
	return (ins[4] & 0x1f) == irt;
}

/* A function constant of the trace's IR (KGC), 0 if ref is not one. */
static __always_inline __u64 ir_kfunc(struct lua_work *w, __u32 ref)
{
	__u8 ins[16] = {};
	if (!ir_const(w, ref, LJ_IRT_FUNC, ins))
		return 0;
	return w->cfg.gc64 ? *(__u64 *)&ins[8] : *(__u32 *)&ins[0];
}

/* A 64-bit number constant of the trace's IR (GC64 frame links are kept as such). */
static __always_inline int ir_k64(struct lua_work *w, __u32 ref, __u64 *v)
{
	__u8 ins[16] = {};
	if (!ir_const(w, ref, LJ_IRT_NUM, ins))
		return 0;
	*v = *(__u64 *)&ins[8];
	return 1;
}

/* One step of the rightmost binary search for the snapshot covering w->ofs, as
 * lj_trace_unwind does: snapshot i covers mcode from its mcofs to the next one's. The
 * snapshot found, lo - 1, is the last one read that begins at or before w->ofs: it is kept
 * in w->snap, and w->jit_bad tells whether it could not be read (read as zeros). */
static long trace_search(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w || w->lo >= w->hi)
		return 1;
	__u32 mid = (w->lo + w->hi) >> 1;
	struct lj_snapshot sn;
	long err = bpf_probe_read_user(&sn, sizeof(sn), (void *)(w->tr_snap + (__u64)mid * 12));
	if (w->ofs < sn.mcofs) {
		w->hi = mid;
	} else {
		w->lo = mid + 1;
		w->snap = sn;
		w->jit_bad = err != 0;
	}
	return 0;
}

/* One snapshot entry: collects the frames of the functions inlined into the trace. GC64
 * (LJ_FR2): a frame's link slot is flagged SNAP_FRAME and holds its link as a number
 * constant, the function is the slot below, and below that a metamethod's continuation
 * slot (SNAP_CONT) holds the caller's PC; slot 1 flagged means the trace's start
 * function tail-called the one in slot 0. GC32: a frame's function slot is flagged, its
 * links follow the entries; slot 0 flagged is a tail call of the start function. */
static long trace_entry(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w)
		return 1;
	__u32 e = w->map[i & (LREC_JIT_MAP - 1)];
	__u32 slot = e >> 24;
	__u16 ref = e & 0xffff;
	if (e & LJ_SNAP_FRAME) {
		/* The entry before this one (~0: none). */
		__u32 p = i > 0 ? w->map[(i - 1) & (LREC_JIT_MAP - 1)] : ~0U;
		__u32 j = w->jn & (LREC_JIT_FRAMES - 1);
		if (w->cfg.gc64 && slot == 1) {
			if (p >> 24 == 0)
				w->func0_ref = p & 0xffff;
		} else if (!w->cfg.gc64 && slot == 0) {
			w->func0_ref = ref;
		} else if (w->jn >= LREC_JIT_FRAMES || (w->cfg.gc64 && p >> 24 != slot - 1)) {
			w->jit_bad = 1;
			return 1;
		} else if (w->cfg.gc64) {
			w->jf_func[j] = p & 0xffff;
			w->jf_link[j] = ref;
			__u32 q = i > 1 ? w->map[(i - 2) & (LREC_JIT_MAP - 1)] : ~0U;
			w->jf_cont[j] = (q >> 24 == slot - 2 && (q & LJ_SNAP_CONT)) ? q & 0xffff : 0;
			w->jn++;
		} else {
			w->jf_func[j] = ref;
			w->jn++;
		}
	}
	return 0;
}

/* Emits the inlined frame i (innermost first) and moves w->pc to its caller's PC. */
static long trace_frame(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w || i >= w->jn)
		return 1;
	__u32 k = (w->jn - 1 - (__u32)i) & (LREC_JIT_FRAMES - 1);
	__u64 func = ir_kfunc(w, w->jf_func[k]);
	__u64 link = 0, contpc = 0;
	if (w->cfg.gc64) {
		if (!ir_k64(w, w->jf_link[k], &link) ||
		    ((link & 7) == LJ_FRAME_CONT && !ir_k64(w, w->jf_cont[k], &contpc)))
			func = 0;
	} else {
		__u32 fl = w->fl;
		link = w->map[fl & (LREC_JIT_MAP - 1)];
		w->fl = fl + 1;
		if ((link & 7) == LJ_FRAME_CONT) {
			contpc = w->map[(fl + 1) & (LREC_JIT_MAP - 1)];
			w->fl = fl + 2;
		}
	}
	if (!func) {
		/* Not specialized to one closure (a function made in a loop): not named. */
		w->jit_bad = 1;
		return 1;
	}
	if ((link & 7) == LJ_FRAME_VARG)
		return 0; /* a vararg function's pseudo-frame: the function's frame follows */
	int emitted = lua_emit(w, func, (link & 7) | LREC_LUA_LINK_JIT);
	if (emitted == LUA_EMIT_FAILED || emitted == LUA_EMIT_NO_PC) {
		/* Unreadable, or the PC is not in the function: the snapshot does not describe
		 * this state. */
		w->jit_bad = 1;
		return 1;
	}
	w->pc = lj_caller_pc(w, link, contpc);
	return 0;
}

/* Words of the copied stack searched for the return address into a trace. */
#define LREC_JIT_RET_WORDS 512

/* One word of the search for the return address into the trace (trace_return). */
static long trace_return_step(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	__u64 v;
	if (!w || !copied_stack_word(w->cpu, i, &v))
		return 1;
	if (v <= w->code + 5 || v >= w->code_end)
		return 0;
	/* A return address follows a call: E8 rel32, or FF /2 with a register operand
	 * (what LuaJIT's emit_call writes when the target is out of rel32 range). */
	__u8 code[5];
	if (bpf_probe_read_user(code, sizeof(code), (void *)(v - 5)))
		return 0;
	if (code[0] != 0xe8 && !(code[3] == 0xff && (code[4] & 0xf8) == 0xd0))
		return 0;
	w->found = v;
	return 1;
}

/* A sample outside the running trace's machine code but in its VM state: in a helper the
 * trace called (lj_vm_modi, lj_tab_newkey, a GC step, a math function). The trace resumes
 * at the return address, the innermost word of the copied stack that lies in the trace's
 * code right after a call instruction: returns the address of that call, or 0 if there is
 * none (an exit stub: unmapped). Words above sp belong to live frames only, the helper's
 * and then the trace's, so no older return address can be found first. */
static __always_inline __u64 trace_return(struct lua_work *w, __u64 mcode, __u32 size)
{
	w->found = 0;
	w->code = mcode;
	w->code_end = mcode + size;
	bpf_loop(LREC_JIT_RET_WORDS, trace_return_step, NULL, 0);
	return w->found ? w->found - 1 : 0;
}

/* GCtrace (lj_jit.h): traceno, link, root, nextroot and nextside are 16-bit in a row. */
#define LJ_TR_ROOT 4     /* from traceno: the root trace of a side trace, 0 for a root */
#define LJ_TR_NEXTSIDE 8 /* the next side trace of the same root */
/* Side traces of one root searched for a sample in a side trace's first instructions. */
#define LREC_JIT_SIDES 64

/* Reads trace n into w->tr; its mcode if it is a live trace numbered n, else 0. */
static __always_inline __u64 trace_read(struct lua_work *w, __u64 traces, __u32 n)
{
	__u64 t = traces && n ? rdref(w, traces + (__u64)n * lj_refsize(w)) : 0;
	if (!t || bpf_probe_read_user(w->tr, 128, (void *)t) ||
	    w->tr[lj_gct(w)] != LJ_GCT_TRACE || tr_u16(w, w->cfg.tr_traceno) != n)
		return 0;
	return tr_u64(w, w->cfg.tr_mcode);
}

/* One side trace of the root: stops at the one whose code holds w->ip. */
static long trace_side_step(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w || !w->side)
		return 1;
	__u64 mcode = trace_read(w, w->traces, w->side);
	if (!mcode)
		return 1;
	if (w->ip >= mcode && w->ip - mcode < tr_u32(w, w->cfg.tr_szmcode)) {
		w->found = mcode;
		return 1;
	}
	w->side = tr_u16(w, w->cfg.tr_traceno + LJ_TR_NEXTSIDE);
	return 0;
}

/* A side trace begins with moves that restore its parent's exit state, and only then
 * stores its own number in vmstate: a sample there is in a side trace of the running
 * trace's root (w->tr) while vmstate names the parent. Finds it along the root's chain
 * of side traces and leaves it in w->tr; returns its mcode, 0 if ip is in none. */
static __always_inline __u64 trace_side(struct lua_work *w, __u64 traces, __u32 traceno,
					 __u64 ip)
{
	__u32 root = tr_u16(w, w->cfg.tr_traceno + LJ_TR_ROOT);
	if (!root)
		root = traceno;
	if (root != traceno && !trace_read(w, traces, root))
		return 0;
	w->traces = traces;
	w->side = tr_u16(w, w->cfg.tr_traceno + LJ_TR_NEXTSIDE);
	w->ip = ip;
	w->found = 0;
	bpf_loop(LREC_JIT_SIDES, trace_side_step, NULL, 0);
	return w->found;
}

/* A sample in trace `traceno`: emits the frames of the functions inlined into the trace
 * at the snapshot covering ip, innermost first, and leaves w->pc at the PC of the
 * trace's start frame (at jit_base), whose walk follows (lua_step checks that the PC lies
 * in its function). A sample that cannot be mapped keeps the start frame only, without a
 * PC, and is flagged. */
static __always_inline void lua_trace(struct lua_work *w, __u64 ip, __u32 traceno)
{
	struct lrec_lua_config *c = &w->cfg;
	w->jit_bad = 0;
	w->jn = 0;
	w->func0_ref = 0;
	w->func0 = 0;
	if (!c->j_trace)
		goto unmapped;
	__u64 traces = rd64(w->g + c->j_trace);
	__u64 mcode = trace_read(w, traces, traceno);
	if (!mcode)
		goto unmapped;
	__u32 size = tr_u32(w, c->tr_szmcode);
	if (ip < mcode || ip - mcode >= size) {
		/* In a helper the trace called, or in a side trace's first instructions. */
		__u64 ret = trace_return(w, mcode, size);
		if (ret)
			ip = ret;
		else if (!(mcode = trace_side(w, traces, traceno, ip)))
			goto unmapped;
	}
	w->tr_ir = tr_u64(w, c->tr_ir);
	w->tr_snap = tr_u64(w, c->tr_snap);
	w->ofs = ip - mcode;
	w->lo = 0;
	w->hi = tr_u16(w, c->tr_nsnap);
	bpf_loop(17, trace_search, NULL, 0);
	if (!w->lo || w->jit_bad)
		goto unmapped;
	__u32 mapofs = w->snap.mapofs, nent = w->snap.nent;
	__u32 nsnapmap = tr_u32(w, c->tr_nsnapmap);
	/* The slots, then the PC (GC64: in two entries), then GC32's frame links. */
	__u32 need = nent + (c->gc64 ? 2 : 1);
	if (mapofs >= nsnapmap || nsnapmap - mapofs < need)
		goto unmapped;
	__u32 len = need + (c->gc64 ? 0 : 2 * LREC_JIT_FRAMES);
	if (len > nsnapmap - mapofs)
		len = nsnapmap - mapofs;
	if (len >= LREC_JIT_MAP)
		len = LREC_JIT_MAP - 1;
	if (bpf_probe_read_user(w->map, (len * 4) & (LREC_JIT_MAP * 4 - 1),
				(void *)(tr_u64(w, c->tr_snapmap) + (__u64)mapofs * 4)))
		goto unmapped;
	bpf_loop(nent, trace_entry, NULL, 0);
	if (w->jit_bad)
		goto unmapped;
	/* The innermost frame resumes at the snapshot's PC: its current instruction, one
	 * before a return PC (GC64 keeps the PC << 8 | base slot in two entries). */
	__u64 pc = w->map[nent & (LREC_JIT_MAP - 1)];
	if (c->gc64)
		pc = (pc | (__u64)w->map[(nent + 1) & (LREC_JIT_MAP - 1)] << 32) >> 8;
	w->pc = pc + 4;
	w->fl = nent + 1;
	bpf_loop(w->jn, trace_frame, NULL, 0);
	if (w->jit_bad)
		goto unmapped;
	if (w->func0_ref && !(w->func0 = ir_kfunc(w, w->func0_ref)))
		goto unmapped;
	w->flags |= LREC_LUA_JIT_MAPPED;
	return;
unmapped:
	lua_unmapped(w);
}

#endif

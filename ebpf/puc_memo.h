/* PUC Lua 5.2+: the frames of this CPU's last full walk, taken again below the point where
 * the thread's CallInfos did not change, as LuaJIT's walk does (luajit_memo.h says why it
 * pays and how lrec puts the records in place). A frame is taken when its CallInfo is the
 * one the memo's frame was read from, holding the same function slot, saved PC, call status
 * and previous CallInfo, and its function slot the same closure: no proto freed since (the
 * memo is used only in the process, generation and count of freed protos it was made in),
 * the saved PC lies in the code of one live proto, the closure's, so the frame is what the
 * walk would emit. Only Lua functions' frames whose saved PC lay in their code are taken; a
 * C function's, or any other, ends the run and the walk goes on as usual. 5.1 (whose
 * frames learn from the one below whether they began a luaV_execute) is walked in full. */
#ifndef LREC_PUC_MEMO_H
#define LREC_PUC_MEMO_H

#include "puc_work.h"

/* The most of the Lua stack a run's function slots span (read at once). */
#define PUC_MEMO_STACK 32768

/* One frame of the walk remembered: its CallInfo, the fields the walk read there, and the
 * value in its function slot. */
struct puc_memo_frame {
	__u64 ci;
	__u64 func, savedpc, previous;
	__u64 v;      /* the function slot's value and tag */
	__u32 status; /* callstatus, to its size */
	__u32 tt;
	__u32 ok;     /* LUA_MEMO_OK, LUA_MEMO_CHAINED (the CallInfo below the frame noted before) */
	__u32 pad;
};

struct puc_memo {
	struct lua_memo_head h; /* base: the thread's bottom */
	struct puc_memo_frame fr[LUA_MEMO_FRAMES];
	__u8 stk[PUC_MEMO_STACK + 32];
};

_Static_assert(sizeof(struct puc_memo) <= LUA_MEMO_SIZE, "a memo fits lua_memos");

/* This CPU's memo `which` (lua_memo_get). */
static __always_inline struct puc_memo *puc_memo_get(struct puc_work *w, __u32 which)
{
	return lua_memo_get(w->cpu, LUA_VM_PUC, which);
}

/* At the start of the walk of the innermost thread, w->t (puc_enter done; lua_memo_begin).
 * 5.1's walk notes nothing. */
static __always_inline void puc_memo_start(struct puc_work *w)
{
	struct puc_memo *m = puc_memo_get(w, w->memo.active);
	w->memo.t = w->t;
	lua_memo_begin(&w->memo, m ? &m->h : NULL, w->tgid, w->gen, w->frees, w->audit,
		       w->threads[w->t & (LREC_PUC_MAX_THREADS - 1)], w->bottom,
		       w->cfg.version != 501);
	if (w->memo.try && m)
		w->memo.top = m->fr[0].func;
}

/* Remembers the frame the step just emitted (the walk's frame w->n - 1) from CallInfo
 * w->ci; ok: a Lua function's whose saved PC lay in its code. */
static __always_inline void puc_memo_note(struct puc_work *w, __u64 func, __u64 savedpc,
					  __u32 status, __u64 previous, int ok)
{
	if (!w->memo.note || w->t != w->memo.t)
		return;
	int i = lua_memo_slot(&w->memo, w->n);
	struct puc_memo *m = puc_memo_get(w, w->memo.active ^ 1);
	if (i < 0)
		return;
	if (!m) {
		/* Not noted after all: no memo from this walk. */
		w->memo.note = 0;
		w->memo.n = 0;
		return;
	}
	struct puc_memo_frame *e = &m->fr[i & (LUA_MEMO_FRAMES - 1)];
	e->ci = w->ci;
	e->func = func;
	e->savedpc = savedpc;
	e->previous = previous;
	e->status = status;
	e->v = *(__u64 *)&w->tv[0];
	e->tt = PUC_TT(w->tv);
	e->ok = ok ? LUA_MEMO_OK : 0;
	if (ok && i) {
		struct puc_memo_frame *up = &m->fr[(i - 1) & (LUA_MEMO_FRAMES - 1)];
		if ((up->ok & LUA_MEMO_OK) && up->previous == w->ci)
			e->ok |= LUA_MEMO_CHAINED;
	}
}

/* Whether CallInfo w->ci, about to be walked, with function slot func, is one the memo in
 * use holds a Lua frame of at that slot (w->memo.c, lua_memo_seek). A global function: the
 * verifier checks it once. */
__noinline int puc_memo_match(struct puc_work *w, __u64 func)
{
	if (!w)
		return 0;
	if (!lua_memo_try(&w->memo, w->n) || w->t != w->memo.t) {
		w->memo.try = 0;
		return 0;
	}
	struct puc_memo *m = puc_memo_get(w, w->memo.active);
	if (!m)
		return 0;
	if (!lua_memo_seek(&w->memo, m->fr, sizeof(m->fr[0]),
			   __builtin_offsetof(struct puc_memo_frame, func), lua_memo_frames(&m->h),
			   func))
		return 0;
	struct puc_memo_frame *e = &m->fr[w->memo.c & (LUA_MEMO_FRAMES - 1)];
	if (e->func != func || e->ci != w->ci || !(e->ok & LUA_MEMO_OK))
		return 0;
	return lua_memo_matched(&w->memo);
}

/* The run of the memo's frames from w->memo.c whose CallInfos and function slots hold what
 * they held (the slots read at once for the run); puc_memo_take takes them. Global, as
 * puc_memo_match. */
__noinline int puc_memo_run(struct puc_work *w)
{
	if (!w)
		return 0;
	w->memo.run = 0;
	struct puc_memo *m = puc_memo_get(w, w->memo.active);
	if (!m)
		return 0;
	struct lrec_puc_config *c = &w->cfg;
	__u32 first = w->memo.c & (LUA_MEMO_FRAMES - 1);
	__u32 n = lua_memo_frames(&m->h);
	/* The function slots of the frames below lie lower in the thread's stack. */
	__u64 top = m->fr[first].func + 16;
	__u64 low = m->fr[(n - 1) & (LUA_MEMO_FRAMES - 1)].func;
	if (low > top)
		return 0;
	if (top - low > PUC_MEMO_STACK)
		low = top - PUC_MEMO_STACK;
	__u32 span = (__u32)(top - low) & (2 * PUC_MEMO_STACK - 1);
	if (span > PUC_MEMO_STACK || bpf_probe_read_user(m->stk, span, (void *)low))
		return 0;
	__u32 left = LREC_LUA_MAX_FRAMES - w->n;
	__u32 size = c->ci_size & (PUC_CI - 1);
	__u32 run = 0;
	for (__u32 i = 0; i < LUA_MEMO_FRAMES; i++) {
		__u32 k = first + i;
		if (k >= n || i >= left)
			break;
		struct puc_memo_frame *e = &m->fr[k & (LUA_MEMO_FRAMES - 1)];
		if (!(e->ok & LUA_MEMO_OK) || (i && !(e->ok & LUA_MEMO_CHAINED)))
			break;
		__u8 *cib = window_piece(&w->ciw, window_at(&w->ciw, e->ci, size, 0));
		if (!cib)
			break;
		__u32 status = puc_ci_status(c, cib);
		if (PUC_U64(cib, PUC_CI, c->ci_func) != e->func ||
		    PUC_U64(cib, PUC_CI, c->ci_savedpc) != e->savedpc ||
		    PUC_U64(cib, PUC_CI, c->ci_previous) != e->previous || status != e->status)
			break;
		__u64 off = e->func - low;
		if (e->func < low || off + 16 > span)
			break;
		__u8 *tv = &m->stk[off & (PUC_MEMO_STACK - 1)];
		if (*(__u64 *)&tv[0] != e->v || PUC_TT(tv) != e->tt)
			break;
		run++;
	}
	w->memo.run = run;
	return 0;
}

/* Takes the run puc_memo_run found: it stands at the walk's frame w->n, named by the memo's
 * sequence number, and the walk goes on from the CallInfo below its last frame (read in
 * full: no proto is carried over). Global, as puc_memo_match. */
__noinline int puc_memo_take(struct puc_work *w)
{
	if (!w)
		return 0;
	__u32 run = w->memo.run;
	struct puc_memo *m = puc_memo_get(w, w->memo.active);
	if (!run || !m)
		return 0;
	__u32 last = (w->memo.c + run - 1) & (LUA_MEMO_FRAMES - 1);
	w->n = lua_memo_taken(&w->memo, &m->h, w->n);
	w->ci = m->fr[last].previous;
	w->prev_lua = 1;
	w->last_func = 0;
	w->last_pt = 0;
	return 0;
}

/* At the end of the walk (lua_memo_finish). */
static __always_inline void puc_memo_end(struct puc_work *w)
{
	struct puc_memo *m = puc_memo_get(w, w->memo.active ^ 1);
	lua_memo_finish(&w->memo, m ? &m->h : NULL, w->tgid, w->gen, w->frees);
}

#endif

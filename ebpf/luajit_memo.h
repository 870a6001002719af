/* LuaJIT: the frames of this CPU's last full walk, taken again below the point where the
 * stack did not change. A deep stack's callers wait while the callee runs: from one sample
 * to the next only the innermost frames move, and the walk would prove the same few hundred
 * frames from their call sites again (a bpf_loop step, a site lookup and a record each).
 * Instead the walk, once it reaches a slot where the last full walk emitted a frame at the
 * same PC and C frame, compares the words it would read there (each frame's function and
 * link) with the ones that walk read, and names the run of frames that match (that walk
 * sent their records, and lrec puts them in place: record/src/lua/memo.rs), going on from
 * the caller of the last one.
 *
 * Why a match proves the frames: the memo is used only in the process, generation and count
 * of freed protos (lua_frees.h) it was made in. No proto freed since, every proto it named
 * is alive with the same bytecode; a frame taken from it is a Lua function's whose PC lay in
 * its proto's bytecode (named by the PC: the function running at a PC is the one whose
 * bytecode holds it, and live protos' bytecode does not overlap), its PC is the return PC in
 * its callee's link (compared), and its caller lies below it by that call's A operand (in
 * the same unchanged bytecode). A frame that was not so, or whose words differ, ends the run
 * and the walk goes on as usual (as it does below LJ_MEMO_STACK bytes of the run's slots);
 * nothing is read after the sample. */
#ifndef LREC_LUAJIT_MEMO_H
#define LREC_LUAJIT_MEMO_H

#include "luajit_work.h"
#include "luajit_frame.h"
#include "lua_memo.h"

/* The most of the stack a run spans (its frames' slots, read at once). */
#define LJ_MEMO_STACK 16384

/* One frame of the walk remembered: where it was, what the walk read there, and its proto
 * (lrec has the record the walk sent). */
struct lj_memo_frame {
	__u64 pos;  /* its slot (w->frame) */
	__u64 pc;   /* the PC it ran at */
	__u64 func; /* its slot's words as lj_frame read them */
	__u64 link;
	__u64 cf;   /* the C frame running it */
	__u64 next; /* its caller's slot when the caller was located by the call's A, else 0 */
	__u64 ok;   /* LUA_MEMO_OK, LUA_MEMO_CHAINED (the caller of the frame noted before it:
		     * located by its A, that frame's next, at the return PC in its link, run by
		     * the same C frame) */
	__u64 pt;   /* its record's proto (ptr) */
};

/* lrec holds the records: the walk that made a memo sent them (LREC_MEMO_MADE, its
 * sequence number seq), and a walk that takes a run names it (LREC_MEMO_TAKEN). */
struct lj_memo {
	struct lua_memo_head h; /* base: the state's stack */
	struct lj_memo_frame fr[LUA_MEMO_FRAMES];
	/* The stack the run's words are compared in, read at once (lj_memo_run). */
	__u8 stk[LJ_MEMO_STACK + 16];
};

_Static_assert(sizeof(struct lj_memo) <= LUA_MEMO_SIZE, "a memo fits lua_memos");

/* This CPU's memo `which` (lua_memo_get). */
static __always_inline struct lj_memo *lj_memo_get(struct lua_work *w, __u32 which)
{
	return lua_memo_get(w->cpu, LUA_VM_LUAJIT, which);
}

/* At the start of a walk of state w->l (lua_memo_begin). */
static __always_inline void lj_memo_start(struct lua_work *w)
{
	struct lj_memo *m = lj_memo_get(w, w->memo.active);
	lua_memo_begin(&w->memo, m ? &m->h : NULL, w->tgid, w->gen, w->frees, w->audit, w->l,
		       w->stack, 1);
	if (w->memo.try && m)
		w->memo.top = m->fr[0].pos;
}

/* Remembers the frame the step just emitted (the record before w->out, the walk's frame
 * w->n - 1), at slot w->frame with words func and link, run at w->pc; ok as
 * lj_memo_frame.ok. The frames noted are the walk's from memo_first on, one after another. */
__noinline int lj_memo_note(struct lua_work *w, __u64 func, __u64 link, int ok)
{
	if (!w || !w->memo.note || w->l != w->memo.l)
		return 0;
	int i = lua_memo_slot(&w->memo, w->n);
	struct lj_memo *m = lj_memo_get(w, w->memo.active ^ 1);
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &w->cpu);
	if (i < 0)
		return 0;
	if (!m || !b) {
		/* Not noted after all: no memo from this walk. */
		w->memo.note = 0;
		w->memo.n = 0;
		return 0;
	}
	struct lj_memo_frame *e = &m->fr[i & (LUA_MEMO_FRAMES - 1)];
	struct lrec_lua_frame *f =
		(void *)&b->data[(w->out - sizeof(struct lrec_lua_frame)) & (LREC_DATA_SIZE - 1)];
	e->pos = w->frame;
	e->pc = w->pc;
	e->func = func;
	e->link = link;
	e->cf = w->cf;
	e->next = 0;
	e->ok = ok ? LUA_MEMO_OK : 0;
	e->pt = f->ptr;
	if (ok && i) {
		struct lj_memo_frame *up = &m->fr[(i - 1) & (LUA_MEMO_FRAMES - 1)];
		if ((up->ok & LUA_MEMO_OK) && up->next == w->frame &&
		    lj_caller_pc(w, up->link, 0) == w->pc && up->cf == w->cf)
			e->ok |= LUA_MEMO_CHAINED;
	}
	return 0;
}

/* The frame noted last was left through its Lua link for the caller at w->frame. */
static __always_inline void lj_memo_next(struct lua_work *w)
{
	if (!w->memo.note || !w->memo.n || w->memo.first + w->memo.n != w->n)
		return;
	struct lj_memo *m = lj_memo_get(w, w->memo.active ^ 1);
	if (m)
		m->fr[(w->memo.n - 1) & (LUA_MEMO_FRAMES - 1)].next = w->frame;
}

/* Whether the frame at w->frame, about to be walked, is one the memo in use holds at the
 * same PC and C frame and left through its Lua link: lj_memo_run takes the run from it.
 * A global function: the verifier checks it once, not in each path of the step. */
__noinline int lj_memo_match(struct lua_work *w)
{
	if (!w || w->jit_start)
		return 0;
	if (!lua_memo_try(&w->memo, w->n) || w->l != w->memo.l) {
		w->memo.try = 0;
		return 0;
	}
	struct lj_memo *m = lj_memo_get(w, w->memo.active);
	if (!m)
		return 0;
	if (!lua_memo_seek(&w->memo, m->fr, sizeof(m->fr[0]),
			   __builtin_offsetof(struct lj_memo_frame, pos), lua_memo_frames(&m->h),
			   w->frame))
		return 0;
	struct lj_memo_frame *e = &m->fr[w->memo.c & (LUA_MEMO_FRAMES - 1)];
	if (e->pos != w->frame || e->pc != w->pc || e->cf != w->cf || !e->ok || !e->next)
		return 0;
	return lua_memo_matched(&w->memo);
}

/* Takes the run of w->memo.run remembered frames from w->memo.c (lj_memo_run): they stand
 * at the walk's frame w->n, named by the memo's sequence number and not sent (lrec has
 * their records), and the walk stands at the last one's slot with its caller's PC, to be
 * left as the step that emitted it would (lj_to_caller). 1 when taken. A global
 * function: the verifier checks it once, not after each way out of lj_memo_run's loop. */
__noinline int lj_memo_take(struct lua_work *w)
{
	if (!w)
		return 0;
	__u32 run = w->memo.run;
	struct lj_memo *m = lj_memo_get(w, w->memo.active);
	if (!run || !m)
		return 0;
	/* The lowest frame taken must not lie below the stack top a C frame that ended
	 * there saved (the step's C frame loop would move to the previous C frame). */
	__u32 last = (w->memo.c + run - 1) & (LUA_MEMO_FRAMES - 1);
	struct lj_memo_frame *e = &m->fr[last];
	if (lj_below_cframe(w, e->pos))
		return 0;
	w->n = lua_memo_taken(&w->memo, &m->h, w->n);
	w->frame = e->pos;
	w->pc = lj_caller_pc(w, e->link, 0);
	/* The record before w->out is not the last frame's: lua_emit must not copy it for a
	 * recursion (last_func). */
	w->last_func = 0;
	w->last_pt = e->pt;
	w->last_bc = e->pt + w->cfg.pt_size;
	w->last_call = 0;
	w->site_check = 0;
	w->site_fill = 0;
	w->known_func = 0;
	return 1;
}

/* The run of the memo's frames from the one lj_memo_match found (w->memo.c): each frame
 * of it is a Lua function's with its words unchanged in the stack (read at once for the
 * run), its PC its callee's return PC, its C frame the run's, located by its callee's A;
 * lj_memo_take takes them. A global function, as lj_memo_match. */
__noinline int lj_memo_run(struct lua_work *w)
{
	if (!w)
		return 0;
	struct lj_memo *m = lj_memo_get(w, w->memo.active);
	if (!m)
		return 0;
	__u32 c = w->memo.c & (LUA_MEMO_FRAMES - 1);
	__u32 n = lua_memo_frames(&m->h);
	/* The slots from the lowest frame's function (GC32: its slot) to the first's link. */
	__u64 top = m->fr[c].pos + 8;
	__u64 low = m->fr[(n - 1) & (LUA_MEMO_FRAMES - 1)].pos - 8;
	if (low < w->stack)
		low = w->stack;
	if (top - low > LJ_MEMO_STACK)
		low = top - LJ_MEMO_STACK;
	__u32 span = (__u32)(top - low) & (2 * LJ_MEMO_STACK - 1);
	if (span > LJ_MEMO_STACK || bpf_probe_read_user(m->stk, span, (void *)low))
		return 0;
	/* Each frame after the first chained to the one before (LUA_MEMO_CHAINED, checked when
	 * noted) and left through its Lua link; its words unchanged. */
	__u32 left = LREC_LUA_MAX_FRAMES - w->n;
	__u32 run = 0;
	__u64 gc64 = w->cfg.gc64;
	for (__u32 i = 0; i < LUA_MEMO_FRAMES; i++) {
		__u32 k = c + i;
		if (k >= n || i >= left)
			break;
		struct lj_memo_frame *e = &m->fr[k & (LUA_MEMO_FRAMES - 1)];
		if (!e->next || (i && !(e->ok & LUA_MEMO_CHAINED)))
			break;
		__u64 off = e->pos - low;
		if (e->pos < low + 8 || off + 8 > span)
			break;
		__u64 func, link;
		lj_frame_words(gc64, *(__u64 *)&m->stk[off & (LJ_MEMO_STACK - 1)],
			       *(__u64 *)&m->stk[(off - 8) & (LJ_MEMO_STACK - 1)], &func, &link);
		if (func != e->func || link != e->link)
			break;
		run++;
	}
	w->memo.run = run;
	return 0;
}

/* At the end of the walk (lua_memo_finish). */
static __always_inline void lj_memo_end(struct lua_work *w)
{
	struct lj_memo *m = lj_memo_get(w, w->memo.active ^ 1);
	lua_memo_finish(&w->memo, m ? &m->h : NULL, w->tgid, w->gen, w->frees);
}

#endif

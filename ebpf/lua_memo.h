/* What both walkers' memos share (luajit_memo.h, puc_memo.h): each CPU keeps its last full
 * walk of a VM's frames, and a later walk on it takes the run of them that did not change,
 * naming it in its header (lrec_lua_stack.memo_*) instead of sending the frames again; lrec
 * has them from the walk that made the memo (record/src/lua/memo.rs). The limits, the
 * frames' flags, the walk's memo state, its header fields and the commit after the sample
 * went to the ring. */
#ifndef LREC_LUA_MEMO_H
#define LREC_LUA_MEMO_H

#include "common.h"
#include "lua_frees.h"

/* Frames remembered, the innermost first: a deeper stack's are walked below them. */
#define LUA_MEMO_FRAMES 256
/* Tries at matching the memo before it is given up for this sample: the walk tries each
 * frame from the memo's innermost frame's slot down (a shallower walk than the memo's
 * meets the memo's frames in the middle), and frames whose words moved lie above the ones
 * that match. */
#define LUA_MEMO_TRIES 64
/* A walk that emitted more frames than these before it reached the memo's innermost
 * frame's slot (besides a trace's inlined ones) is deeper than the memo's: it does not
 * try it, and walked in full it makes the deeper memo that the next samples, as deep or
 * shallower, take from. */
#define LUA_MEMO_ABOVE 2
/* Frames of the memo passed over in one try, looking for the walk's slot: the memo's
 * frames lie down the stack, innermost first, as the walk's do. */
#define LUA_MEMO_SKIP 8

/* A memo frame's flags: a Lua function's frame named by its PC (which lay in its code;
 * not a trace's), */
#define LUA_MEMO_OK 1
/* ... and the caller of the frame noted before it (how each VM says so: its memo). */
#define LUA_MEMO_CHAINED 2

/* A walk's memo state (in lua_work and puc_work): which of this CPU's two memos is in use
 * and the last sequence number given (kept across samples); the frames this walk noted in
 * the other one (its frames `first` to `first + n - 1`),
 * whether it notes (the count of freed protos is known) and tries the memo (lua_memo_try),
 * the memo's frame it reached (c: lua_memo_seek) and the run matching from there,
 * whether it took them (used: at its frame `at`, from memo `seq`) or made a memo (made);
 * the state whose frames are noted (l; LuaJIT: its stack `base`, PUC: its thread `t`), the
 * slot of the memo's innermost frame (top: a frame above it is not tried), the tries made
 * and the frames emitted before the walk's own (from: a trace's inlined frames). */
struct lua_memo_state {
	__u32 active, n, note, tries;
	__u32 try, used, c, run;
	__u32 first, at, made, t;
	__u32 from, pad;
	__u64 seq, seq_next, l, base, top;
};

/* What a memo was made in (the process, generation, VM state, its stack (LuaJIT) or its
 * thread's bottom (PUC) and count of freed protos), its frames and sequence number: the
 * head of each VM's memo. */
struct lua_memo_head {
	__u32 tgid, gen;
	__u64 l, base, frees, seq;
	__u32 n, pad;
};

/* Each VM's memos (struct lj_memo, struct puc_memo: a head, then the VM's frames), two per
 * CPU for each: the one in use (lua_memo_state.active) and the one a walk fills. */
#define LUA_MEMO_SIZE (48 * 1024)
struct lua_memo_blob {
	__u8 b[LUA_MEMO_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4); /* set to four times the number of CPUs by lrec */
	__type(key, __u32);
	__type(value, struct lua_memo_blob);
} lua_memos SEC(".maps");

/* Counts a try at matching the memo at the walk's frame n, the first one below the memo's
 * innermost frame's slot or one below; 0 when the memo is given up (LUA_MEMO_ABOVE, LUA_MEMO_TRIES). */
static __always_inline int lua_memo_try(struct lua_memo_state *s, __u32 n)
{
	if ((!s->tries && n - s->from > LUA_MEMO_ABOVE) || ++s->tries > LUA_MEMO_TRIES) {
		s->try = 0;
		return 0;
	}
	return 1;
}

/* Moves the cursor s->c down the memo's n frames (at fr, stride bytes each, a frame's slot
 * at offset off in it) past those whose slot lies above the walk's, a few a try: the
 * slots go down the stack with the frames, the memo's as the walk's (a binary search's
 * branches would cost the verifier each path). 0 when every frame lies above: the memo is
 * given up. */
static __always_inline int lua_memo_seek(struct lua_memo_state *s, void *fr, __u32 stride,
					 __u32 off, __u32 n, __u64 slot)
{
	__u32 c = s->c;
	for (int i = 0; i < LUA_MEMO_SKIP; i++) {
		if (c >= n || *(__u64 *)(fr + (c & (LUA_MEMO_FRAMES - 1)) * stride + off) <= slot)
			break;
		c++;
	}
	s->c = c;
	if (c >= n) {
		s->try = 0;
		return 0;
	}
	return 1;
}

/* The memo's frame s->c matched the walk's: the run from it is found next, and the memo
 * is not tried again in this walk. */
static __always_inline int lua_memo_matched(struct lua_memo_state *s)
{
	s->run = 0;
	s->try = 0;
	return 1;
}

/* CPU cpu's memo `which` (0 or 1) of VM vm (LUA_VM_*). */
static __always_inline void *lua_memo_get(__u32 cpu, __u32 vm, __u32 which)
{
	__u32 k = cpu * 4 + (vm & 1) * 2 + (which & 1);
	return bpf_map_lookup_elem(&lua_memos, &k);
}

/* At a walk's start, of state l on base: s begun, noting if asked (and the count of freed
 * protos is known), trying the memo in use (head h) if made in the same process,
 * generation, state and count (an audited sample reads every frame). */
static __always_inline void lua_memo_begin(struct lua_memo_state *s, struct lua_memo_head *h,
					   __u32 tgid, __u32 gen, __u64 frees, __u32 audit,
					   __u64 l, __u64 base, int notes)
{
	s->n = 0;
	s->used = 0;
	s->made = 0;
	s->c = 0;
	s->tries = 0;
	s->top = 0;
	s->from = 0;
	s->note = notes && frees != LUA_FREES_UNCOUNTED;
	s->l = l;
	s->base = base;
	s->try = h && s->note && !audit && h->n && h->tgid == tgid && h->gen == gen &&
		 h->l == l && h->base == base && h->frees == frees;
}

/* The memo frame the walk's frame n - 1 (just emitted) is noted in, or -1 when the walk
 * notes no more (the memo is full, or a frame was emitted without a note: the frames
 * noted are the walk's from `first` on, one after another). */
static __always_inline int lua_memo_slot(struct lua_memo_state *s, __u32 n)
{
	__u32 i = s->n;
	if (!i)
		s->first = n - 1;
	if (i >= LUA_MEMO_FRAMES || s->first + i != n - 1) {
		s->note = 0;
		return -1;
	}
	s->n = i + 1;
	return (int)i;
}

/* The memo's frames matched (s->run from s->c, memo head h) are taken: they stand at the
 * walk's frame n, named and not sent. Returns the walk's frame count past them. */
static __always_inline __u32 lua_memo_taken(struct lua_memo_state *s, struct lua_memo_head *h,
					    __u32 n)
{
	s->used = 1;
	s->at = n;
	s->seq = h->seq;
	return n + s->run;
}

/* The frames memo head h holds (at most LUA_MEMO_FRAMES). */
static __always_inline __u32 lua_memo_frames(struct lua_memo_head *h)
{
	return h->n < LUA_MEMO_FRAMES ? h->n : LUA_MEMO_FRAMES;
}

/* At the end of a walk that took nothing from the memo: the frames it noted are the other
 * memo (head h), in use once lrec has the sample (lua_memo_commit). */
static __always_inline void lua_memo_finish(struct lua_memo_state *s, struct lua_memo_head *h,
					    __u32 tgid, __u32 gen, __u64 frees)
{
	if (s->used || s->n < 2 || !h)
		return;
	h->tgid = tgid;
	h->gen = gen;
	h->l = s->l;
	h->base = s->base;
	h->frees = frees;
	h->n = s->n;
	/* Numbered per CPU and VM kind from 1 (lrec keeps each one's last). */
	h->seq = ++s->seq_next;
	s->made = 1;
}

/* Fills the walk's memo fields of its header h; returns the frames it took from the memo
 * (named, not sent). */
static __always_inline __u32 lua_memo_header(struct lua_memo_state *s, struct lrec_lua_stack *h)
{
	h->memo_pad = 0;
	if (s->used) {
		h->memo = LREC_MEMO_TAKEN;
		h->memo_seq = s->seq;
		h->memo_at = s->at;
		h->memo_from = s->c;
		h->memo_len = s->run;
		return s->run;
	}
	h->memo = s->made ? LREC_MEMO_MADE : LREC_MEMO_NONE;
	h->memo_seq = s->made ? s->seq_next : 0;
	h->memo_at = s->made ? s->first : 0;
	h->memo_from = 0;
	h->memo_len = s->made ? s->n : 0;
	return 0;
}

/* After the sample went to the ring (sent: it did): the memo its walk made is the one in
 * use, as lrec will have its frames; a sample lost leaves the one in use. */
static __always_inline void lua_memo_commit(struct lua_memo_state *s, __u32 sent)
{
	if (!s->made)
		return;
	s->made = 0;
	if (sent)
		s->active ^= 1;
}

#endif

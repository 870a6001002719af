/* PUC Lua 5.1–5.5: finds the sampled thread's running lua_State and walks its CallInfos,
 * across the coroutines that resumed one another, into struct lrec_lua_frame records.
 * It shares LuaJIT's memory readers and the proto ring. The layout comes from lrec (puc_config map), chosen by the version string of
 * the binary; nothing here assumes one.
 *
 * PUC Lua has no "current state" pointer. The running state is found from the VM this
 * thread ran last (cached, revalidated every time) or from a register or stack slot that
 * holds a lua_State (luaV_execute keeps L in a register), then descended into the
 * coroutine it resumes: a thread whose innermost CallInfo is a C function with a running
 * coroutine as its first argument (coroutine.resume) or first upvalue (coroutine.wrap).
 * The state found must run on this thread: its innermost lua_longjmp (set by lua_pcall or
 * lua_resume on the native stack of the thread running it) lies on the sampled stack. */
#ifndef LREC_PUC_H
#define LREC_PUC_H
#include "puc_work.h"
#include "puc_find.h"
#include "puc_protos.h"
#include "puc_memo.h"

/* Whether 5.1's luaV_execute began at the Lua frame emitted last, now that its caller
 * (the CallInfo below) is known: it did unless the caller is a Lua
 * function whose current instruction is a call (OP_CALL/OP_TAILCALL re-enter the loop). */
static __always_inline void puc51_link(struct puc_work *w, struct sample_buf *b, int caller_lua,
				       __u64 caller_pc)
{
	if (!w->prev_lua)
		return;
	struct lrec_lua_frame *prev =
		(void *)&b->data[(w->out - sizeof(*prev)) & (LREC_DATA_SIZE - 1)];
	int fresh = 1;
	if (caller_lua && caller_pc) {
		if (caller_pc != w->last_call) {
			w->last_call = caller_pc;
			w->last_op = rd32(caller_pc - 4) & 0x3f;
		}
		fresh = w->last_op != w->cfg.op_call && w->last_op != w->cfg.op_tailcall;
	}
	if (fresh)
		prev->link |= LREC_PUC_FRESH;
}

/* One step of the walk: emits the CallInfo w->ci and moves to the one below it, or to the
 * next thread out. */
static long puc_step(__u64 i, void *unused)
{
	struct puc_work *w = puc_work();
	if (!w)
		return 1;
	struct lrec_puc_config *c = &w->cfg;
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &w->cpu);
	if (!b)
		return 1;
	if (w->ci == w->base_ci || !w->ci) {
		/* The bottom of this thread: on to its resumer. */
		if (c->version == 501)
			puc51_link(w, b, 0, 0);
		if (w->t == 0)
			return 1;
		w->t--;
		return puc_enter(w) ? 0 : 1;
	}
	if (w->n >= LREC_LUA_MAX_FRAMES) {
		w->flags |= LREC_LUA_TRUNCATED;
		return 1;
	}
	/* The CallInfo's fields are read where the window holds it (copying it out first
	 * cost 15 % of a 200-frame walk), else from a read of it alone. */
	int off = window_at(&w->ciw, w->ci, c->ci_size & (PUC_CI - 1),
			    c->version == 501 ? w->base_ci : 0);
	__u8 *cib = window_piece(&w->ciw, off);
	if (!cib) {
		cib = w->cib;
		if (bpf_probe_read_user(cib, c->ci_size & (PUC_CI - 1), (void *)w->ci)) {
			w->flags |= LREC_LUA_BROKEN;
			return 1;
		}
	}
	__u64 func = PUC_U64(cib, PUC_CI, c->ci_func);
	__u64 savedpc = PUC_U64(cib, PUC_CI, c->ci_savedpc);
	__u32 status = puc_ci_status(c, cib);
	if (!puc_user_ptr(func)) {
		w->flags |= LREC_LUA_BROKEN;
		return 1;
	}
	/* Frames the last full walk emitted, taken where unchanged (puc_memo.h). */
	if (w->memo.try && func <= w->memo.top && puc_memo_match(w, func)) {
		puc_memo_run(w);
		puc_memo_take(w);
		return 0;
	}
	off = window_at(&w->stw, func, 16, 0);
	if (!window_copy(&w->stw, off, (__u64 *)w->tv, 2) &&
	    bpf_probe_read_user(w->tv, 16, (void *)func)) {
		w->flags |= LREC_LUA_BROKEN;
		return 1;
	}
	__u64 v = *(__u64 *)&w->tv[0];
	__u32 tt = PUC_TT(w->tv);
	/* A Lua function's proto; 5.1's closures say in isC whether they are C's (one read
	 * from the header to p). Below the innermost frame of a 5.2+ thread, savedpc is the
	 * return point of the call the frame made (saved before every call), in its own
	 * proto's code: the proto remembered for it, if any (lua_sites), names the frame
	 * once proved, without reading the closure (LREC_FRAME_FROM_SITE). */
	__u64 pt = 0;
	int lua = tt == c->tag_lcl;
	struct lua_site *site = 0;
	int cached = 0, below = 0; /* below: a frame below the innermost (savedpc a site) */
	int unfreed = 0;           /* the site proved by no proto freed since it was made */
	if (lua && v != w->last_func) {
		if (c->version == 501) {
			__u32 n = c->cl_p + 8;
			if (n > 64 || c->cl_isc >= n) {
				w->flags |= LREC_LUA_BROKEN;
				return 1;
			}
			/* Keeps the mask below for the verifier. */
			asm volatile("" : "+r"(n));
			if (bpf_probe_read_user(w->cl, n & 127, (void *)v)) {
				w->flags |= LREC_LUA_BROKEN;
				return 1;
			}
			lua = !w->cl[c->cl_isc & 63];
			pt = *(__u64 *)&w->cl[c->cl_p & 63];
		} else {
			below = w->ci != PUC_U64(w->ls, PUC_LS, c->l_ci);
			if (below)
				site = lua_site_find(savedpc, w->tgid, w->gen);
			int counted = site && lua_site_unfreed(site, w->frees);
			unfreed = counted && !w->audit;
			cached = unfreed || (site && puc_site_proved(w, site));
			if (cached && !unfreed && site)
				lua_site_proved(site, w->frees);
			/* Read, and another proto there, where the count said none was freed. */
			if (counted && !cached && site && w->last_pt == site->k.ptr) {
				lua_frees_wrong(w->tgid, LUA_VM_PUC);
				w->frees = LUA_FREES_UNCOUNTED;
			}
			if (!cached)
				pt = rd64(v + c->cl_p);
		}
	}
	if (c->version == 501) {
		/* The frame above learns from this one whether it began a luaV_execute. */
		puc51_link(w, b, lua, savedpc);
		if (lua && w->ci == PUC_U64(w->ls, PUC_LS, c->l_ci))
			savedpc = w->l_savedpc; /* the innermost Lua function keeps pc in L */
	}
	struct lrec_lua_frame *f = (void *)&b->data[w->out & (LREC_DATA_SIZE - 1)];
	f->cframe = w->bottom;
	f->link = 0;
	f->check = 0;
	f->pad = 0; /* lrec compares frames whole (record/src/lua/reuse.rs) */
	f->pos = ~0U;
	f->name_id = 0;
	if (!lua) {
		f->ffid = 1;
		f->ptr = v;
		f->chunkname = 0;
		f->firstline = 0;
		f->numline = 0;
		f->sizebc = 0;
		if (tt == c->tag_ccl || (c->version == 501 && tt == c->tag_lcl))
			f->ptr = rd64(v + c->ccl_f);
		else if (tt != c->tag_lcf)
			f->ptr = 0;
		w->prev_lua = 0;
		goto emitted;
	}
	f->ffid = 0;
	__u64 code = w->last_code;
	if (unfreed && site) {
		/* The site's proto as remembered, its code at site->a: not in w->pt, which a
		 * recursion's next frame would take it from (w->last_func). */
		w->last_func = 0;
		lua_frame_of_key(f, &site->k);
		f->check = LREC_FRAME_FROM_SITE;
		code = site->a;
	} else if (cached) {
		/* The site's proto, proved by its read: its fields in w->pt, its code at
		 * site->a. */
		w->last_func = v;
		puc_proto_fields(w, f);
		f->check = LREC_FRAME_FROM_SITE;
		code = w->last_code;
	} else if (v != w->last_func) {
		int fresh = 0;
		if (puc_read_proto(w, pt, &fresh)) {
			w->flags |= LREC_LUA_BROKEN;
			return 1;
		}
		w->last_func = v;
		puc_proto_fields(w, f);
		if (fresh || pt == w->unnoted)
			puc_note_proto(w, f);
		code = w->last_code;
		if (below && savedpc > code && savedpc - code <= 4ULL * f->sizebc)
			lua_site_fill(savedpc, code, w->tgid, w->gen, w->frees, f);
	} else {
		/* The function of the frame above again (recursion). */
		puc_proto_fields(w, f);
	}
	if (savedpc > code && savedpc - code < (1ULL << 28))
		f->pos = (__u32)((savedpc - code) / 4) - 1;
	switch (c->fresh_rule) {
	case LREC_PUC_RULE_FRESH:
		if (status & c->cist_fresh)
			f->link |= LREC_PUC_FRESH;
		break;
	case LREC_PUC_RULE_REENTRY:
		if (!(status & c->cist_fresh))
			f->link |= LREC_PUC_FRESH;
		break;
	case LREC_PUC_RULE_ALL:
		f->link |= LREC_PUC_FRESH;
		break;
	}
	if ((c->cist_tail && (status & c->cist_tail)) ||
	    (c->ci_tailcalls && PUC_U32(cib, PUC_CI, c->ci_tailcalls)))
		f->link |= LREC_PUC_TAIL;
	w->prev_lua = 1;
emitted:
	w->out += sizeof(struct lrec_lua_frame);
	w->n++;
	if (c->version == 501) {
		w->ci -= c->ci_size;
		return 0;
	}
	__u64 previous = PUC_U64(cib, PUC_CI, c->ci_previous);
	puc_memo_note(w, func, savedpc, status, previous, !f->ffid && f->pos != ~0U);
	w->ci = previous;
	return 0;
}

/* Appends the sample's Lua stack after its stack bytes, when the thread runs a PUC Lua VM
 * of a known layout; stack_end is where this thread's stack ends above sp. Returns the
 * bytes written. */
static __always_inline __u32 puc_stack(struct sample_buf *b, struct lrec_regs *r,
				       __u64 stack_end, __u32 tgid, __u32 tid, __u32 cpu,
				       __u32 offset)
{
	struct lrec_puc_config *cfg = bpf_map_lookup_elem(&puc_config, &tgid);
	if (!cfg || !r->sp)
		return 0;
	struct puc_work *w = puc_work();
	if (!w)
		return 0;
	__builtin_memcpy(&w->cfg, cfg, sizeof(*cfg));
	w->sp = r->sp;
	w->stack_top = stack_end;
	w->cpu = cpu;
	w->tgid = tgid;
	w->gen = lua_proto_gen_now();
	w->frees = lua_frees_now(tgid, LUA_VM_PUC);
	w->audit = lua_frees_audit();
	w->n = 0;
	w->flags = 0;
	w->last_func = 0;
	w->last_pt = 0;
	w->last_code = 0;
	w->last_call = 0;
	w->last_name = 0;
	w->unnoted = 0;
	w->stale = 0;
	w->ciw.lo = 0;
	w->stw.lo = 0;
	w->ptw.lo = 0;
	w->pt_prev = 0;
	w->ls_of = 0;
	__u32 n = puc_cached_root(w, tid) ? puc_chain(w) : 0;
	if (!n && puc_found_root(w, r))
		n = puc_chain(w);
	if (!n)
		return 0;
	n = puc_ascend(w, n);
	w->nthreads = n;
	w->bottoms[0] = 0;
	bpf_loop(LREC_PUC_MAX_THREADS, puc_bottom, NULL, 0);
	note_thread_vm(&puc_thread_vm, tid, w->g);

	w->t = n - 1;
	if (!puc_enter(w))
		return 0;
	w->out = offset + sizeof(struct lrec_lua_stack);
	puc_memo_start(w);
	bpf_loop(LREC_LUA_MAX_STEPS, puc_step, NULL, 0);
	puc_memo_end(w);
	if (w->n >= LREC_LUA_MAX_FRAMES && (w->ci != w->base_ci || w->t > 0))
		w->flags |= LREC_LUA_TRUNCATED;

	struct lrec_lua_stack *h = (void *)&b->data[offset & (LREC_DATA_SIZE - 1)];
	h->g = w->g;
	h->l = w->threads[(n - 1) & (LREC_PUC_MAX_THREADS - 1)];
	h->cframe = 0;
	h->vmstate = -1; /* as LuaJIT's LJ_VMST_INTERP: interpreted */
	/* Frames taken from the memo are named, not sent. */
	__u32 sent = w->n - lua_memo_header(&w->memo, h);
	h->nframes = sent;
	h->flags = w->flags | LREC_LUA_PUC;
	h->stale = w->stale;
	h->pad = 0;
	return sizeof(struct lrec_lua_stack) + sent * sizeof(struct lrec_lua_frame);
}

#endif

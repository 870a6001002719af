/* LuaJIT's walk, one frame a step (lua_step, run by bpf_loop), each frame emitted as a
 * struct lrec_lua_frame (lua_emit), named from a remembered call site where one proves it
 * (luajit_sites.h). */
#ifndef LREC_LUAJIT_WALK_H
#define LREC_LUAJIT_WALK_H

#include "luajit_work.h"
#include "luajit_frame.h"
#include "luajit_sites.h"

/* What lua_emit emitted. */
#define LUA_EMIT_PC 0     /* a Lua function's frame, at its current position */
#define LUA_EMIT_NO_PC 1  /* a Lua function's frame whose PC does not lie in it */
#define LUA_EMIT_NATIVE 2 /* a C or fast function's frame */
#define LUA_EMIT_FAILED 3 /* nothing: the function could not be read */

/* Emits a frame running func, called through a link of FRAME_* type `link` (with
 * LREC_LUA_LINK_JIT when it runs compiled code), its current position from w->pc.
 * A global function, called from three places (lua_step twice, trace_frame): the
 * verifier checks it once, on its own, which loads the program faster than inlined
 * copies (a global function's pointer argument may be NULL for the verifier). */
__noinline int lua_emit(struct lua_work *w, __u64 func, __u8 link)
{
	if (!w)
		return LUA_EMIT_FAILED;
	struct lrec_lua_config *c = &w->cfg;
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &w->cpu);
	if (!b)
		return LUA_EMIT_FAILED;
	struct lrec_lua_frame *f = (void *)&b->data[w->out & (LREC_DATA_SIZE - 1)];
	if (w->n > 0 && func == w->last_func) {
		/* Recursion: the function of the frame above again; its proto fields too. */
		struct lrec_lua_frame *prev =
			(void *)&b->data[(w->out - sizeof(*f)) & (LREC_DATA_SIZE - 1)];
		__builtin_memcpy(f, prev, sizeof(*f));
		f->cframe = w->cf;
		f->link = link;
		goto emitted;
	}
	__u8 *fn = w->fn;
	/* A caller named by its call site (lj_site_use) is a Lua function of that proto,
	 * proved in this sample: neither its GCfunc nor its proto is read again. */
	int known = w->known_func && w->known_func == func;
	if (!known && (lj_read_fn(w, func) || fn[lj_gct(w)] != LJ_GCT_FUNC)) {
		w->flags |= LREC_LUA_BROKEN;
		return LUA_EMIT_FAILED;
	}
	f->cframe = w->cf;
	f->ffid = known ? 0 : fn[c->fn_ffid & 63];
	f->link = link;
	f->check = known ? LREC_FRAME_FROM_SITE : 0;
	f->pad = 0; /* lrec compares frames whole (record/src/lua/reuse.rs) */
	f->chunkname = 0;
	f->firstline = 0;
	f->numline = 0;
	f->sizebc = 0;
	f->name_id = 0;
	if (f->ffid == 0) {
		__u64 bc = known ? w->known_pt + c->pt_size : buf_ref(w, fn, c->fn_pc & 63);
		__u64 pt = bc - c->pt_size;
		struct lua_proto_key k;
		if (known) {
			k = w->site_key;
		} else if (lj_proto_key(w, pt, &k)) {
			w->flags |= LREC_LUA_BROKEN;
			return LUA_EMIT_FAILED;
		}
		lua_frame_of_key(f, &k);
		/* Recursion repeats one proto: note it once. A site's was sent when the site
		 * was remembered. */
		if (pt != w->last_pt && !known)
			lua_note_proto(w, f);
		w->last_pt = pt;
		w->last_bc = bc;
	} else {
		f->ptr = *(__u64 *)&fn[c->fn_f & 63];
	}
	w->last_func = func;
emitted:
	/* The position of the PC in a Lua function's bytecode (w->last_bc), when it lies
	 * there. */
	f->pos = ~0U;
	if (f->ffid == 0 && lj_pc_in(w->pc, w->last_bc, f->sizebc))
		f->pos = (__u32)((w->pc - w->last_bc) / 4) - 1;
	if (w->site_fill && w->site_fill == w->pc && f->pos != ~0U)
		lua_site_fill(w->site_fill, w->last_a, w->tgid, w->gen, w->frees, f);
	w->site_fill = 0;
	w->out += sizeof(struct lrec_lua_frame);
	w->n++;
	if (f->ffid)
		return LUA_EMIT_NATIVE;
	return f->pos == ~0U ? LUA_EMIT_NO_PC : LUA_EMIT_PC;
}

/* A sample in a trace that cannot be mapped keeps the trace's start frame only, from the
 * stack and without a PC: drops the frames emitted so far (all since the walk began) and
 * flags the sample. */
static __always_inline void lua_unmapped(struct lua_work *w)
{
	w->out -= w->n * sizeof(struct lrec_lua_frame);
	w->n = 0;
	w->pc = 0;
	w->func0 = 0;
	w->last_pt = 0;
	w->last_func = 0;
	w->flags = (w->flags & ~LREC_LUA_JIT_MAPPED) | LREC_LUA_JIT_UNMAPPED;
}

/* One step of the walk: emits the frame at w->frame and moves to the one below. */
static long lua_step(__u64 i, void *unused)
{
	struct lua_work *w = lua_work();
	if (!w)
		return 1;
	if (w->n >= LREC_LUA_MAX_FRAMES) {
		w->flags |= LREC_LUA_TRUNCATED;
		return 1;
	}
	struct lrec_lua_config *c = &w->cfg;
	/* Frames the last full walk emitted, taken where unchanged (luajit_memo.h). */
	if (w->memo.try && w->frame <= w->memo.top && lj_memo_match(w)) {
		lj_memo_run(w);
		/* The last frame taken is left as its step would: to its caller, located by its
		 * call's A (the memo's next) and named by the call site when one is proved. */
		if (lj_memo_take(w))
			lj_to_caller(w);
		return 0;
	}
	if (w->site_check && lj_site_step(w))
		return 0;
	if (w->site_check) {
		/* The frame was located by a remembered A, with its proto; when it holds no
		 * function, by the A the bytecode holds now. */
		w->site_check = 0;
		if (!lj_site_use(w)) {
			w->last_a = lj_call_a(w->last_call);
			w->frame = lj_caller_frame(w, w->site_callee, w->last_a);
			w->site_fill = w->last_call;
		}
	}
	if (w->frame <= w->bot)
		return lua_parent(w) ? 0 : 1;
	__u64 func, link;
	lj_frame(w, &func, &link);
	__u64 type = link & 3, typep = link & 7;
	__u64 delta = link & ~7ULL;
	/* C frames without a Lua frame of their own (cpcall: lua_load, the trace
	 * recorder) end below the stack top they saved. */
	for (int k = 0; k < 4; k++) {
		if (!lj_below_cframe(w, w->frame))
			break;
		__u64 prev = lj_cstack(w, w->cf + c->cf_prev, 8) & ~3ULL;
		if (!prev)
			break;
		w->cf = prev;
		w->cf_last = prev;
	}
	/* Dummy frames (lj_err_optype_call) and vararg pseudo-frames are no calls. */
	if (func == w->l || typep == LJ_FRAME_VARG) {
		if (!delta)
			return 1;
		w->frame -= delta;
		return 0;
	}
	__u8 lk = typep;
	__u64 f = func;
	int start = w->jit_start;
	if (start) {
		/* A trace's start frame: compiled code, running the function the trace
		 * tail-called if it did. */
		w->jit_start = 0;
		lk |= LREC_LUA_LINK_JIT;
		if (w->func0)
			f = w->func0;
	}
	__u32 flags = w->flags;
	int emitted = lua_emit(w, f, lk);
	w->known_func = 0;
	if (start && (flags & LREC_LUA_JIT_MAPPED) && emitted != LUA_EMIT_PC) {
		/* A mapped trace's snapshot leaves the start frame's PC in its Lua function,
		 * else the snapshot is not this state (the trace returned below its start
		 * frame): unmapped after all, the frame from the stack. */
		w->flags = flags;
		lua_unmapped(w);
		emitted = lua_emit(w, func, lk);
	}
	if (emitted == LUA_EMIT_FAILED)
		return 1;
	lj_memo_note(w, func, link, emitted == LUA_EMIT_PC && !start && f == func);

	if (type != LJ_FRAME_LUA && !delta)
		return 1;
	__u64 cont = 0;
	int c_entry = typep == LJ_FRAME_C || typep == LJ_FRAME_CP;
	if (typep == LJ_FRAME_CONT) {
		/* An FFI callback's frame (lj_ccallback.c: continuation LJ_CONT_FFI_CALLBACK)
		 * was entered from C through its own C frame, as lua_call's; else a metamethod
		 * called by the VM, which keeps the caller's PC in the frame. */
		__u64 contv = c->gc64 ? lj_stack_word(w, w->frame - 24)
				      : (__u32)lj_stack_word(w, w->frame - 8);
		if (contv == LJ_CONT_FFI_CALLBACK)
			c_entry = 1;
		else
			cont = c->gc64 ? lj_stack_word(w, w->frame - 16)
				       : lj_stack_word(w, w->frame - 8) >> 32;
	}
	w->pc = lj_caller_pc(w, link, cont);
	if (type == LJ_FRAME_LUA) {
		lj_to_caller(w);
		lj_memo_next(w);
		return 0;
	}
	if (c_entry) {
		/* Called from C through lua_call/lua_pcall/lua_resume or an FFI callback: the
		 * frames below run in the previous C frame of the VM. */
		__u64 prev = lj_cstack(w, w->cf + c->cf_prev, 8) & ~3ULL;
		if (prev) {
			w->cf = prev;
			w->cf_last = prev;
			w->pc = cframe_pc(w, prev);
		}
	}
	w->frame -= delta;
	return 0;
}

#endif

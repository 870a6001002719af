/* LuaJIT 2.1: finds the sampled thread's running lua_State and walks its Lua frames,
 * across the coroutines that resumed one another, into struct lrec_lua_frame records.
 * Included by sample.bpf.c. The layout of the build comes from lrec (lua_config map),
 * which validated it against the live process; nothing here assumes one.
 *
 * The walk follows lj_debug_frame (lj_debug.c) and attributes each frame to the VM's
 * native C frame (cframe) that runs it as err_unwind (lj_err.c) does, so lanalyze can put
 * every Lua frame in place of the native lj_vm_* frame that ran it. */
#ifndef LREC_LUAJIT_H
#define LREC_LUAJIT_H

#include "sample.h"
#include "lua_protos.h"
#include "window.h"

#define LJ_FRAME_LUA 0
#define LJ_FRAME_C 1
#define LJ_FRAME_CONT 2
#define LJ_FRAME_VARG 3
#define LJ_FRAME_CP 5
#define LJ_FRAME_PCALL 6
#define LJ_CONT_FFI_CALLBACK 1 /* lj_frame.h: the continuation of an FFI callback's frame */
#define LJ_GCT_FUNC 8 /* ~LJ_TFUNC, in GCHeader.gct */
/* Most snapshot map entries copied (nent ≤ 255, then the PC and GC32's frame links), and
 * most frames inlined into a trace that are reconstructed. */
#define LREC_JIT_MAP 512
#define LREC_JIT_FRAMES 32
#define LJ_GCVMASK ((1ULL << 47) - 1)
/* Iterations of the walk: frames plus skipped dummy/vararg frames and coroutine hops. */
#define LREC_LUA_MAX_STEPS (2 * LREC_LUA_MAX_FRAMES)
/* Stack slots scanned for a return address into the VM when no register names G. */
#define LREC_LUA_SCAN_SLOTS 1024

/* Per-process layouts, set by lrec once validated. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct lrec_lua_config);
} lua_config SEC(".maps");

/* The VM each thread ran at its last sample: a candidate, revalidated every time. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} lua_thread_vm SEC(".maps");

/* A trace's snapshot (lj_jit.h SnapShot): where its map begins, the mcode offset it
 * covers from, and its map's entries. */
struct lj_snapshot {
	__u32 mapofs;
	__u16 ref;
	__u16 mcofs;
	__u8 nslots, topslot, nent, count;
};
_Static_assert(sizeof(struct lj_snapshot) == 12, "SnapShot is 12 bytes");

/* The walk's state: too big for the 512-byte BPF stack, and shared with bpf_loop
 * callbacks. */
struct lua_work {
	struct lrec_lua_config cfg;
	__u64 sp, window;   /* a running VM's cframe lies in [sp, sp + window) */
	__u64 g, l, cf, cf_last;
	__u64 frame, bot, stack;
	__u64 pc;           /* the current PC of the next Lua frame, 0 when unknown */
	__u32 cpu;
	__u32 out;          /* byte offset of the next frame in the sample's data */
	__u32 n;
	__u32 flags;
	__u32 tgid;
	__u8 fn[72];        /* the GCfunc being read (and 8 bytes of slack) */
	__u8 pt[136];       /* the GCproto fields read, from sizebc on, and slack */
	__u64 nres_of;      /* the C frame whose nres is cached */
	__s32 nres;
	__u32 pad;
	__u64 last_pt;      /* the proto of the previous Lua frame, already noted */
	__u64 last_func;    /* the function of the previous frame */
	__u64 last_bc;      /* its bytecode */
	__u64 last_call;    /* the last return PC read, and its call's A operand */
	__u64 last_a;
	__u64 last_name;    /* the last chunk name read, and its identity */
	__u32 last_name_id;
	__u32 pad2;
	/* In a trace (lua_trace): the start frame's function when the trace tail-called
	 * (0: the one on the stack), and whether the next frame walked is the start frame. */
	__u64 func0;
	/* Set by on_lua_resume around emit: walk this suspended coroutine (lua_wait.h)
	 * instead of the state this thread runs. */
	__u64 suspended;
	__u8 jit_start;
	__u8 jit_bad;       /* the snapshot could not be read or is inconsistent */
	__u16 jn;           /* frames inlined into the trace at this snapshot */
	__u32 lo, hi;       /* binary search over the snapshots' mcode offsets */
	__u64 ofs;          /* the sampled instruction's offset in the trace's mcode */
	struct lj_snapshot snap; /* the last snapshot searched that begins at or before ofs */
	/* An ip outside the running trace's code: trace_return searches the stack for a
	 * return address into [code, code_end); trace_side the side traces for one whose
	 * code holds ip, starting at side. found: the address or the side trace's mcode. */
	__u64 code, code_end, ip, found, traces;
	__u32 cb_seen;      /* lua_callback_pending: 1 the callback's frame, 2 a C entry first */
	__u32 pad4;
	__u32 side;
	__u32 pad3;
	__u64 tr_ir, tr_snap;
	__u32 fl;           /* GC32: the next frame link in the snapshot map */
	__u16 func0_ref;
	__u16 jf_func[LREC_JIT_FRAMES]; /* IR refs of each inlined frame's function, */
	__u16 jf_link[LREC_JIT_FRAMES]; /* its link (GC64), */
	__u16 jf_cont[LREC_JIT_FRAMES]; /* and its caller's PC under a metamethod (GC64) */
	__u8 tr[136];       /* the GCtrace (120 bytes at most) and slack */
	__u32 map[LREC_JIT_MAP]; /* the snapshot's map */
	/* The Lua stack, read a window at a time: the walk goes down it a frame at a time
	 * (lj_stack_word). */
	struct window win;
	__u64 fn_addr;      /* the GCfunc in fn, and the proto whose fields are in pt (0: */
	__u64 pt_addr;      /* none read in this sample) */
	/* A Lua frame's caller lies below it by its call's A operand (lua_step). Taken from
	 * lua_sites with the caller's proto (site_check, the callee's frame and the proto as
	 * remembered), the frame it locates is named by that proto (lj_site_use); read from
	 * the bytecode, it is remembered once the caller is emitted (site_fill: its return
	 * PC). */
	__u64 site_callee;
	__u64 site_fill;
	__u32 site_check;
	__u32 stale;        /* sites whose proto was no longer the one remembered */
	struct lua_proto_key site_key;
	/* The header of lua_State lh_of (0: none), read at once: cfg.lh_size bytes (lj_state). */
	__u64 lh_of;
	__u8 lh[136];
	/* The fields of global_State gh_of the walk reads, read at once: cfg.gh_size bytes
	 * from its offset cfg.gh_lo (lj_g). */
	__u64 gh_of;
	__u8 gh[272];
	/* A frame lj_site_use took to run proto known_pt (w->site_key): its function, 0 when
	 * none. */
	__u64 known_func;
	__u64 known_pt;
};


struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lua_work);
} lua_work_map SEC(".maps");

static __always_inline struct lua_work *lua_work(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&lua_work_map, &zero);
}

#include "luajit_read.h"
#include "luajit_find.h"

/* The PC saved in a C frame (where the VM left its Lua code for C). */
static __always_inline __u64 cframe_pc(struct lua_work *w, __u64 cf)
{
	return rdref(w, cf + w->cfg.cf_pc);
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
	__u64 pl = rdref(w, pcf + w->cfg.cf_l);
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
	struct lrec_lua_proto *p = lua_proto_begin(&k, w->tgid, f);
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
		/* One read of the span lrec computed, which holds the four fields. */
		if (bpf_probe_read_user(w->pt, c->pt_span & 0x7f, (void *)(pt + c->pt_lo)))
			return -1;
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
	k->pad = 0;
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
		f->ptr = pt;
		f->chunkname = k.chunkname;
		f->firstline = k.firstline;
		f->numline = k.numline;
		f->sizebc = k.sizebc;
		f->name_id = k.name_id;
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
		lua_site_fill(w->site_fill, w->last_a, w->tgid, f);
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
		/* The C frame's saved nres, read once per C frame. */
		if (w->nres_of != w->cf) {
			w->nres_of = w->cf;
			w->nres = (__s32)rd32(w->cf + c->cf_nres);
		}
		if (w->nres >= 0 || w->frame >= w->stack + (__u64)(-(__s64)w->nres))
			break;
		__u64 prev = rd64(w->cf + c->cf_prev) & ~3ULL;
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
		return 0;
	}
	if (c_entry) {
		/* Called from C through lua_call/lua_pcall/lua_resume or an FFI callback: the
		 * frames below run in the previous C frame of the VM. */
		__u64 prev = rd64(w->cf + c->cf_prev) & ~3ULL;
		if (prev) {
			w->cf = prev;
			w->cf_last = prev;
			w->pc = cframe_pc(w, prev);
		}
	}
	w->frame -= delta;
	return 0;
}

#include "luajit_callback.h"
#include "luajit_trace.h"

/* Fills the Lua stack header after the walk: h at offset, the walk's frames after it. */
static __always_inline __u32 lua_stack_end(struct sample_buf *b, struct lua_work *w,
					   __u32 offset, __u64 l0, __u64 cf0, __s32 vmstate)
{
	if (w->n >= LREC_LUA_MAX_FRAMES && w->frame > w->bot)
		w->flags |= LREC_LUA_TRUNCATED;
	struct lrec_lua_stack *h = (void *)&b->data[offset & (LREC_DATA_SIZE - 1)];
	h->g = w->g;
	h->l = l0;
	h->cframe = cf0;
	h->vmstate = vmstate;
	h->nframes = w->n;
	h->flags = w->flags;
	h->stale = w->stale;
	h->pad = 0;
	return sizeof(struct lrec_lua_stack) + w->n * sizeof(struct lrec_lua_frame);
}

/* The frames of coroutine w->suspended, which yielded from a C function (lua_yield):
 * its stack is as it left it, L->base being the C function's, and it has no C frame
 * (the walk ends at its bottom). */
static __noinline __u32 lua_suspended_stack(struct sample_buf *b, struct lua_work *w,
					    __u32 offset)
{
	__u64 l = w->suspended;
	w->g = lj_state(w, l, w->cfg.l_glref, 1);
	__u64 stack = lj_state(w, l, w->cfg.l_stack, 1);
	__u64 base = lj_state(w, l, w->cfg.l_base, 0);
	if (!w->g || base <= stack || base > lj_state(w, l, w->cfg.l_maxstack, 1) || (base & 7))
		return 0;
	w->cf = 0;
	w->cf_last = 0;
	w->nres_of = 0;
	w->nres = 0;
	w->flags = LREC_LUA_SUSPENDED;
	lua_start(w, l, stack, base, 0);
	w->out = offset + sizeof(struct lrec_lua_stack);
	w->jit_start = 0;
	bpf_loop(LREC_LUA_MAX_STEPS, lua_step, NULL, 0);
	return lua_stack_end(b, w, offset, l, 0, (__s32)lj_g(w, w->g, w->cfg.g_vmstate));
}

/* Appends the sample's Lua stack after its stack bytes, when the thread runs a known
 * LuaJIT VM. Returns the bytes written. */
static __always_inline __u32 lua_stack(struct sample_buf *b, struct lrec_regs *r, __u32 tgid,
				       __u32 tid, __u32 cpu, __u32 offset)
{
	struct lrec_lua_config *cfg = bpf_map_lookup_elem(&lua_config, &tgid);
	if (!cfg || !r->sp)
		return 0;
	struct lua_work *w = lua_work();
	if (!w)
		return 0;
	__builtin_memcpy(&w->cfg, cfg, sizeof(*cfg));
	w->sp = r->sp;
	w->window = b->s.stack_len ? b->s.stack_len : LREC_PAGE_SIZE;
	w->cpu = cpu;
	w->tgid = tgid;
	w->g = 0;
	w->n = 0;
	w->flags = 0;
	w->nres_of = 0;
	w->last_pt = 0;
	w->last_func = 0;
	w->last_call = 0;
	w->last_name = 0;
	w->fn_addr = 0;
	w->pt_addr = 0;
	w->site_check = 0;
	w->site_fill = 0;
	w->stale = 0;
	w->known_func = 0;
	w->lh_of = 0;
	w->gh_of = 0;
	if (w->suspended)
		return lua_suspended_stack(b, w, offset);
	if (!lua_find(w, r, tid))
		return 0;
	note_thread_vm(&lua_thread_vm, tid, w->g);
	__u64 cf0 = w->cf;
	w->cf_last = w->cf;

	/* The live base: jit_base in a trace, BASE (rdx) and PC (rbx) in the interpreter,
	 * L->base and the C frame's saved PC once the VM called C. */
	__s32 vmstate = (__s32)lj_g(w, w->g, w->cfg.g_vmstate);
	__u64 base, pc;
	if (vmstate >= 0) {
		base = lj_gref(w, w->g, w->cfg.g_jit_base);
		pc = 0;
	} else if (in_vm(w, r->ip)) {
		base = w->cfg.gc64 ? r->dx : (__u32)r->dx;
		pc = w->cfg.gc64 ? r->bx : (__u32)r->bx;
	} else {
		base = lj_state(w, w->l, w->cfg.l_base, 0);
		pc = cframe_pc(w, w->cf);
	}
	__u64 stack = lj_state(w, w->l, w->cfg.l_stack, 1);
	__u64 maxstack = lj_state(w, w->l, w->cfg.l_maxstack, 1);
	int trace = vmstate >= 0;
	if (base <= stack || base > maxstack || (base & 7)) {
		base = lj_state(w, w->l, w->cfg.l_base, 0);
		pc = cframe_pc(w, w->cf);
		trace = 0;
	}
	__u64 l0 = w->l;
	lua_start(w, w->l, stack, base, pc);
	if (lua_callback_pending(w, cf0)) {
		/* The innermost C frame is an FFI callback's whose Lua frame is not (or no
		 * longer) on the stack: the frames there are its caller's, which run in the
		 * previous C frame. */
		__u64 prev = rd64(cf0 + w->cfg.cf_prev) & ~3ULL;
		if (prev) {
			w->cf = prev;
			w->cf_last = prev;
		}
	}
	w->out = offset + sizeof(struct lrec_lua_stack);
	w->jit_start = trace;
	if (trace)
		/* The functions inlined into the trace; the walk goes on from its start frame. */
		lua_trace(w, r->ip, vmstate);
	bpf_loop(LREC_LUA_MAX_STEPS, lua_step, NULL, 0);
	return lua_stack_end(b, w, offset, l0, cf0, vmstate);
}

#endif

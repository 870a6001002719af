/* PUC Lua 5.1–5.5: finds the sampled thread's running lua_State and walks its CallInfos,
 * across the coroutines that resumed one another, into struct lrec_lua_frame records.
 * Included by sample.bpf.c after luajit.h (whose helpers, proto ring and work buffers it
 * shares). The layout comes from lrec (puc_config map), chosen by the version string of
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

#include "sample.h"
#include "lua_protos.h"
#include "window.h"

/* Most coroutines descended into (resumers and the running one). */
#define LREC_PUC_MAX_THREADS 8
/* Stack words scanned for a lua_State when no register holds one. */
#define LREC_PUC_SCAN_WORDS 64
/* lua_longjmp links followed to a coroutine's outermost one. */
#define LREC_PUC_MAX_JMPS 16
/* Registers that may hold a lua_State (a power of two, the last one unused). */
#define PUC_NREGS 16
/* Stack words scanned above a coroutine's bottom for the state that resumed it. */
#define LREC_PUC_ASCEND_WORDS 256
/* Resumers prepended at most (a coroutine resumed by a host's own C function). */
#define LREC_PUC_ASCENTS 2

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct lrec_puc_config);
} puc_config SEC(".maps");

/* The global_State each thread ran at its last sample: a candidate, revalidated. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} puc_thread_vm SEC(".maps");

#define PUC_LS 256 /* bytes of lua_State read: every field used lies below */
#define PUC_CI 128 /* (powers of two above sizeof: offsets are masked) */
_Static_assert(PUC_CI <= WINDOW_PIECE, "a CallInfo is a window's piece");
#define PUC_PT 256

struct puc_work {
	struct lrec_puc_config cfg;
	__u64 sp, stack_top; /* this thread's stack: a running state's longjmp lies here */
	__u64 g;
	__u64 threads[LREC_PUC_MAX_THREADS]; /* root first */
	__u64 bottoms[LREC_PUC_MAX_THREADS];
	__u32 nthreads;
	__u32 cpu;
	__u32 out;       /* byte offset of the next frame in the sample's data */
	__u32 n;
	__u32 flags;
	__u32 tgid;
	__u32 t;         /* thread being walked, counting down from the innermost */
	__u64 regs[PUC_NREGS];
	__u64 ci, base_ci, l_savedpc, bottom;
	__u64 last_func, last_pt, last_code, last_call, last_op;
	__u64 last_name;     /* the last source string whose identity was read, and it */
	__u32 last_name_id;
	__u32 pad_name;
	__u64 unnoted;       /* a proto read to prove a site, which it failed: not noted yet */
	__u32 prev_lua;  /* the frame emitted last is a Lua frame of this thread */
	__u32 stale;     /* call sites whose proto was no longer the one remembered */
	/* puc_ascend: the stack word where the search begins, the bottom it must lie above,
	 * and the resumer found (0: none). */
	__u64 scan, above, resumer;
	__u64 ls_of;     /* the lua_State whose header is in ls (0: none) */
	__u8 ls[PUC_LS + 8];
	__u8 cib[PUC_CI + 8];
	__u8 tv[24];
	__u8 cl[128];    /* 5.1: a closure's header, up to its proto (64 bytes at most) */
	__u8 pt[PUC_PT + 8];
	__u8 str[72];    /* a TString's header (str_hdr bytes, at most 56) and slack */
	/* The CallInfos and the Lua stacks, read a window at a time: the walk goes down both
	 * a frame at a time (5.1's CallInfos are an array; later ones are allocated one
	 * after another, mostly in a row). */
	struct window ciw, stw;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct puc_work);
} puc_work_map SEC(".maps");

static __always_inline struct puc_work *puc_work(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&puc_work_map, &zero);
}

#define PUC_U64(buf, size, off) (*(__u64 *)&(buf)[(off) & ((size) - 1)])
#define PUC_U32(buf, size, off) (*(__u32 *)&(buf)[(off) & ((size) - 1)])
#define PUC_U8(buf, size, off) ((buf)[(off) & ((size) - 1)])

static __always_inline int puc_user_ptr(__u64 p)
{
	return p > 4096 && p < (1ULL << 47) && !(p & 7);
}

/* The main thread of global_State g (5.5 holds it inside g). */
static __always_inline __u64 puc_mainthread(struct puc_work *w, __u64 g)
{
	if (w->cfg.version == 505)
		return g + w->cfg.g_mainthread;
	return rd64(g + w->cfg.g_mainthread);
}

/* Reads a lua_State's header into w->ls, unless this sample read it there last; 0 when it
 * is unreadable. */
static __always_inline int puc_read_state(struct puc_work *w, __u64 l)
{
	__u32 n = w->cfg.l_size & (PUC_LS - 1);
	if (l && l == w->ls_of)
		return 1;
	w->ls_of = 0;
	if (!puc_user_ptr(l) || !n || bpf_probe_read_user(w->ls, n, (void *)l))
		return 0;
	w->ls_of = l;
	return 1;
}

/* Whether the state read into w->ls runs Lua code (a coroutine running or resuming
 * another, or the main thread inside a call): status LUA_OK and a CallInfo above the
 * base one. */
static __always_inline int puc_active(struct puc_work *w, __u64 l)
{
	struct lrec_puc_config *c = &w->cfg;
	if (PUC_U8(w->ls, PUC_LS, c->l_status) != 0)
		return 0;
	__u64 ci = PUC_U64(w->ls, PUC_LS, c->l_ci);
	__u64 base = c->version == 501 ? PUC_U64(w->ls, PUC_LS, c->l_base_ci) : l + c->l_base_ci;
	return puc_user_ptr(ci) && ci != base;
}

/* Whether p is a lua_State of a VM: its global_State's main thread belongs to that VM
 * (g: the VM this thread ran last, checked first). Leaves its header in w->ls. */
static __always_inline int puc_is_state(struct puc_work *w, __u64 p, __u64 *g)
{
	struct lrec_puc_config *c = &w->cfg;
	if (!puc_read_state(w, p))
		return 0;
	__u64 pg = PUC_U64(w->ls, PUC_LS, c->l_g);
	if (!puc_user_ptr(pg))
		return 0;
	if (pg != *g) {
		__u64 m = puc_mainthread(w, pg);
		if (!puc_user_ptr(m) || rd64(m + c->l_g) != pg)
			return 0;
	}
	*g = pg;
	return 1;
}

/* The main thread of the VM this thread ran last, when it is inside a call. */
static __always_inline int puc_cached_root(struct puc_work *w, __u32 tid)
{
	struct lrec_puc_config *c = &w->cfg;
	__u64 *last = bpf_map_lookup_elem(&puc_thread_vm, &tid);
	w->g = last ? *last : 0;
	if (!w->g)
		return 0;
	__u64 m = puc_mainthread(w, w->g);
	if (!puc_read_state(w, m) || PUC_U64(w->ls, PUC_LS, c->l_g) != w->g || !puc_active(w, m))
		return 0;
	w->threads[0] = m;
	return 1;
}

/* One candidate of the search for a running state: the registers, then stack words. */
static long puc_try_word(__u64 i, void *unused)
{
	struct puc_work *w = puc_work();
	if (!w)
		return 1;
	__u64 v;
	if (i < PUC_NREGS) {
		v = w->regs[i & (PUC_NREGS - 1)];
	} else {
		if (!copied_stack_word(w->cpu, i - PUC_NREGS, &v))
			return 1;
		/* Stack addresses are no states. */
		if (v >= w->sp && v < w->stack_top)
			return 0;
	}
	__u64 g = w->g;
	if (puc_is_state(w, v, &g) && puc_active(w, v)) {
		w->g = g;
		w->threads[0] = v;
		return 1;
	}
	return 0;
}

/* A running state named by a register (luaV_execute keeps L in one) or a stack slot. */
static __always_inline int puc_found_root(struct puc_work *w, struct lrec_regs *r)
{
	__u64 regs[PUC_NREGS] = { r->bx, r->bp, r->r12, r->r13, r->r14, r->r15, r->di, r->si,
				  r->dx, r->cx, r->ax, r->r8, r->r9, r->r10, r->r11, 0 };
	__builtin_memcpy(w->regs, regs, sizeof(regs));
	w->threads[0] = 0;
	bpf_loop(PUC_NREGS + LREC_PUC_SCAN_WORDS, puc_try_word, NULL, 0);
	return w->threads[0] != 0;
}

/* The coroutine that the state in w->ls (l) resumes, or 0: its innermost CallInfo runs a
 * C function (coroutine.resume, coroutine.wrap's function) whose first argument or first
 * upvalue is a running coroutine of the same VM. Leaves that coroutine in w->ls. */
static __always_inline __u64 puc_resumed(struct puc_work *w, __u64 l)
{
	struct lrec_puc_config *c = &w->cfg;
	__u64 ci = PUC_U64(w->ls, PUC_LS, c->l_ci);
	__u64 func = rd64(ci + c->ci_func);
	if (!puc_user_ptr(func) || bpf_probe_read_user(w->tv, 32, (void *)func))
		return 0;
	__u32 tt = *(__u32 *)&w->tv[8] & 0xff;
	if (c->version == 501) {
		/* One function tag: Closure.isC tells. */
		if (tt != c->tag_lcl || !(rd32(*(__u64 *)&w->tv[0] + c->cl_isc) & 0xff))
			return 0;
	} else if (tt != c->tag_ccl && tt != c->tag_lcf) {
		return 0;
	}
	__u64 co = 0;
	if ((*(__u32 *)&w->tv[24] & 0xff) == c->tag_thread)
		co = *(__u64 *)&w->tv[16];
	else if (tt == c->tag_ccl || c->version == 501) {
		__u64 cl = *(__u64 *)&w->tv[0];
		if (!bpf_probe_read_user(w->tv, 16, (void *)(cl + c->ccl_upvalue)) &&
		    (*(__u32 *)&w->tv[8] & 0xff) == c->tag_thread)
			co = *(__u64 *)&w->tv[0];
	}
	if (!co || co == l || !puc_read_state(w, co))
		return 0;
	if (PUC_U64(w->ls, PUC_LS, c->l_g) != w->g || !puc_active(w, co))
		return 0;
	return co;
}

/* One step down: the coroutine the last state found resumes. */
static long puc_descend(__u64 i, void *unused)
{
	struct puc_work *w = puc_work();
	if (!w || w->nthreads >= LREC_PUC_MAX_THREADS)
		return 1;
	__u64 co = puc_resumed(w, w->threads[(w->nthreads - 1) & (LREC_PUC_MAX_THREADS - 1)]);
	if (!co)
		return 1;
	w->threads[w->nthreads & (LREC_PUC_MAX_THREADS - 1)] = co;
	w->nthreads++;
	return 0;
}

/* The outermost lua_longjmp of state l (where lua_resume, or lua_pcall, began it). */
static __always_inline __u64 puc_outermost_jmp(struct puc_work *w, __u64 l)
{
	__u64 jmp = rd64(l + w->cfg.l_errorjmp), bottom = jmp;
	for (int k = 0; k < LREC_PUC_MAX_JMPS && jmp; k++) {
		bottom = jmp;
		jmp = rd64(jmp); /* lua_longjmp.previous */
	}
	return bottom;
}

/* One coroutine's bottom: where it began on the native stack, its outermost lua_longjmp
 * (lua_resume's luaD_rawrunprotected), found from its innermost one. */
static long puc_bottom(__u64 i, void *unused)
{
	struct puc_work *w = puc_work();
	if (!w || i + 1 >= w->nthreads)
		return 1;
	__u32 t = (i + 1) & (LREC_PUC_MAX_THREADS - 1);
	w->bottoms[t] = puc_outermost_jmp(w, w->threads[t]);
	return 0;
}

/* Whether the state read into w->ls runs a C function at its innermost CallInfo (a
 * resumer is inside its coroutine.resume, or a host's own C function calling lua_resume). */
static __always_inline int puc_in_c(struct puc_work *w)
{
	struct lrec_puc_config *c = &w->cfg;
	__u64 ci = PUC_U64(w->ls, PUC_LS, c->l_ci);
	__u64 func = rd64(ci + c->ci_func);
	if (!puc_user_ptr(func))
		return 0;
	__u64 tv[2] = {};
	if (bpf_probe_read_user(tv, sizeof(tv), (void *)func))
		return 0;
	__u32 tt = tv[1] & 0xff;
	if (c->version == 501)
		return tt == c->tag_lcl && (rd32(tv[0] + c->cl_isc) & 0xff);
	return tt == c->tag_ccl || tt == c->tag_lcf;
}

/* One stack word above the outermost state's bottom: the state that resumed it, if the
 * word is a running state of the same VM, inside a C function, whose innermost
 * lua_longjmp lies farther up this stack (it began there, before the coroutine). */
static long puc_try_resumer(__u64 i, void *unused)
{
	struct puc_work *w = puc_work();
	if (!w)
		return 1;
	__u64 v;
	if (!copied_stack_word(w->cpu, w->scan + i, &v))
		return 1;
	if (!puc_user_ptr(v) || (v >= w->sp && v < w->stack_top) || v == w->threads[0])
		return 0;
	/* A thread object's type byte (LUA_TTHREAD): one read before the state's. */
	if ((rd64(v + 8) & 0xff) != 8)
		return 0;
	__u64 g = w->g;
	if (!puc_is_state(w, v, &g) || g != w->g || !puc_active(w, v))
		return 0;
	__u64 jmp = PUC_U64(w->ls, PUC_LS, w->cfg.l_errorjmp);
	if (jmp <= w->above || jmp >= w->stack_top || !puc_in_c(w))
		return 0;
	w->resumer = v;
	return 1;
}

/* The states that resumed the outermost one found (w->threads[0], of n), put before it:
 * a coroutine found by its register has its resumer's frames below it (a host that runs
 * its callbacks on a thread of its own, as skynet does, leaves the main thread idle).
 * The resumer's own state is on the native stack above the coroutine's bottom: its C
 * function (coroutine.resume, or a host's own) keeps it in a saved register. Returns the
 * new number of states. */
static __always_inline __u32 puc_ascend(struct puc_work *w, __u32 n)
{
	for (int a = 0; a < LREC_PUC_ASCENTS; a++) {
		if (n >= LREC_PUC_MAX_THREADS || w->threads[0] == puc_mainthread(w, w->g))
			break;
		__u64 bottom = puc_outermost_jmp(w, w->threads[0]);
		if (bottom < w->sp || bottom >= w->stack_top)
			break;
		w->scan = (bottom - w->sp) / 8;
		w->above = bottom;
		w->resumer = 0;
		bpf_loop(LREC_PUC_ASCEND_WORDS, puc_try_resumer, NULL, 0);
		if (!w->resumer)
			break;
		for (int k = LREC_PUC_MAX_THREADS - 1; k > 0; k--)
			w->threads[k] = w->threads[k - 1];
		w->threads[0] = w->resumer;
		n++;
	}
	return n;
}

/* From the root state (w->threads[0], read into w->ls), down the coroutines it
 * resumes; the innermost must run on this thread: its innermost lua_longjmp lies on this
 * stack. Returns the number of states, 0 when the chain does not run here. */
static __always_inline __u32 puc_chain(struct puc_work *w)
{
	struct lrec_puc_config *c = &w->cfg;
	w->nthreads = 1;
	bpf_loop(LREC_PUC_MAX_THREADS, puc_descend, NULL, 0);
	__u32 n = w->nthreads;
	__u64 running = w->threads[(n - 1) & (LREC_PUC_MAX_THREADS - 1)];
	if (!puc_read_state(w, running))
		return 0;
	__u64 jmp = PUC_U64(w->ls, PUC_LS, c->l_errorjmp);
	if (jmp < w->sp || jmp >= w->stack_top)
		return 0;
	return n;
}

/* Moves the walk to thread w->t (counting down), whose header is read here. */
static __always_inline int puc_enter(struct puc_work *w)
{
	struct lrec_puc_config *c = &w->cfg;
	__u32 t = w->t & (LREC_PUC_MAX_THREADS - 1);
	__u64 l = w->threads[t];
	if (!puc_read_state(w, l))
		return 0;
	w->ci = PUC_U64(w->ls, PUC_LS, c->l_ci);
	w->base_ci = c->version == 501 ? PUC_U64(w->ls, PUC_LS, c->l_base_ci) : l + c->l_base_ci;
	w->l_savedpc = c->version == 501 ? PUC_U64(w->ls, PUC_LS, c->l_savedpc) : 0;
	w->bottom = w->bottoms[t];
	w->prev_lua = 0;
	return 1;
}

#include "puc_protos.h"

/* Whether 5.1's luaV_execute began at the Lua frame emitted last, now that its caller
 * (the CallInfo below, read into w->cib) is known: it did unless the caller is a Lua
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
	int off = window_at(&w->ciw, w->ci, c->ci_size & (PUC_CI - 1),
			    c->version == 501 ? w->base_ci : 0);
	if (!window_copy(&w->ciw, off, (__u64 *)w->cib, PUC_CI / 8) &&
	    bpf_probe_read_user(w->cib, c->ci_size & (PUC_CI - 1), (void *)w->ci)) {
		w->flags |= LREC_LUA_BROKEN;
		return 1;
	}
	__u64 func = PUC_U64(w->cib, PUC_CI, c->ci_func);
	__u64 savedpc = PUC_U64(w->cib, PUC_CI, c->ci_savedpc);
	__u32 status = PUC_U32(w->cib, PUC_CI, c->ci_callstatus);
	if (c->callstatus_size == 1)
		status &= 0xff;
	else if (c->callstatus_size == 2)
		status &= 0xffff;
	if (!puc_user_ptr(func)) {
		w->flags |= LREC_LUA_BROKEN;
		return 1;
	}
	off = window_at(&w->stw, func, 16, 0);
	if (!window_copy(&w->stw, off, (__u64 *)w->tv, 2) &&
	    bpf_probe_read_user(w->tv, 16, (void *)func)) {
		w->flags |= LREC_LUA_BROKEN;
		return 1;
	}
	__u64 v = *(__u64 *)&w->tv[0];
	__u32 tt = *(__u32 *)&w->tv[8] & 0xff;
	/* A Lua function's proto; 5.1's closures say in isC whether they are C's (one read
	 * from the header to p). Below the innermost frame of a 5.2+ thread, savedpc is the
	 * return point of the call the frame made (saved before every call), in its own
	 * proto's code: the proto remembered for it, if any (lua_sites), names the frame
	 * once proved, without reading the closure (LREC_FRAME_FROM_SITE). */
	__u64 pt = 0;
	int lua = tt == c->tag_lcl;
	struct lua_site *site = 0;
	int cached = 0, below = 0; /* below: a frame below the innermost (savedpc a site) */
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
				site = lua_site_find(savedpc, w->tgid);
			cached = site && puc_site_proved(w, site);
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
	if (cached) {
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
			lua_site_fill(savedpc, code, w->tgid, f);
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
	    (c->ci_tailcalls && PUC_U32(w->cib, PUC_CI, c->ci_tailcalls)))
		f->link |= LREC_PUC_TAIL;
	w->prev_lua = 1;
emitted:
	w->out += sizeof(struct lrec_lua_frame);
	w->n++;
	if (c->version == 501)
		w->ci -= c->ci_size;
	else
		w->ci = PUC_U64(w->cib, PUC_CI, c->ci_previous);
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
	bpf_loop(LREC_LUA_MAX_STEPS, puc_step, NULL, 0);
	if (w->n >= LREC_LUA_MAX_FRAMES && (w->ci != w->base_ci || w->t > 0))
		w->flags |= LREC_LUA_TRUNCATED;

	struct lrec_lua_stack *h = (void *)&b->data[offset & (LREC_DATA_SIZE - 1)];
	h->g = w->g;
	h->l = w->threads[(n - 1) & (LREC_PUC_MAX_THREADS - 1)];
	h->cframe = 0;
	h->vmstate = -1; /* as LuaJIT's LJ_VMST_INTERP: interpreted */
	h->nframes = w->n;
	h->flags = w->flags | LREC_LUA_PUC;
	h->stale = w->stale;
	h->pad = 0;
	return sizeof(struct lrec_lua_stack) + w->n * sizeof(struct lrec_lua_frame);
}

#endif

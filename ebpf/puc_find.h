/* Finding the lua_State a sampled thread runs: the VM it ran last, a register or stack
 * slot that holds a state, then the coroutine it resumes, down to the innermost; and the
 * resumers' chains above it. */
#ifndef LREC_PUC_FIND_H
#define LREC_PUC_FIND_H

#include "puc_work.h"
#include "luajit_read.h"

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
	__u32 tt = PUC_TT(w->tv);
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
		    PUC_TT(w->tv) == c->tag_thread)
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

#endif

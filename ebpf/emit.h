/* A sample's record completed and handed to the ring (emit), for the CPU sampler and for
 * the off-CPU and Lua-wait records alike: registers, the user stack copied page by page,
 * the Lua stack walked by luajit.h or puc.h. */
#ifndef LREC_EMIT_H
#define LREC_EMIT_H

#include "common.h"
#include "luajit.h"
#include "puc.h"

/* Where the thread's stack ends above sp: above the outermost frame a stack holds nothing
 * an unwinder reads. The main thread's initial stack continues with argc, argv, envp and
 * auxv (mm->start_stack is where argc is), and a glibc or musl thread's stack ends below
 * its static TLS and thread control block (at fsbase): whichever lies just above sp, with
 * slack. */
#define LREC_BOUND_SLACK 256

static __u64 stack_end(__u64 sp)
{
	struct task_struct___lrec *task = (void *)bpf_get_current_task();
	__u64 bounds[2] = {
		BPF_CORE_READ(task, mm, start_stack) + LREC_BOUND_SLACK,
		BPF_CORE_READ(task, thread.fsbase),
	};
	/* Neither lies above sp (a stack of its own, e.g. sigaltstack): 8 MiB, a default
	 * thread stack. */
	__u64 end = sp + (8 << 20);
	for (int i = 0; i < 2; i++)
		if (bounds[i] > sp && bounds[i] < end)
			end = bounds[i];
	return end;
}

struct copy_ctx {
	__u64 sp;
	__u32 cpu;
	__u32 copied;
	__u32 faulted;
	__u32 limit;
};

/* One bpf_loop step: copy up to the end of the current page. A single large read would
 * fail as a whole at the guard page that ends every pthread stack. */
static long copy_page(__u64 i, struct copy_ctx *c)
{
	__u32 key = c->cpu;
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &key);
	if (!b)
		return 1;
	__u32 off = c->copied;
	if (off >= c->limit)
		return 1;
	__u64 addr = c->sp + off;
	__u32 len = LREC_PAGE_SIZE - (addr & (LREC_PAGE_SIZE - 1));
	if (len > c->limit - off)
		len = c->limit - off;
	/* Bounds the verifier can see: offset below 64 KiB, length at most a page. */
	off &= LREC_MAX_STACK - 1;
	if (len == 0 || len > LREC_PAGE_SIZE)
		return 1;
	if (bpf_probe_read_user(&b->data[off], len, (void *)addr)) {
		c->faulted = 1;
		return 1;
	}
	c->copied += len;
	return 0;
}

/* Completes the record in b (its header up to the kernel stack filled by the caller)
 * with registers r, the user stack and the Lua stack of the current thread, and hands it
 * to the ring buffer. */
static __always_inline void emit(struct sample_buf *b, struct pt_regs *r, __u32 cpu)
{
	struct lrec_sample *s = &b->s;
	if (s->flags & LREC_NO_USER_REGS)
		__builtin_memset(r, 0, sizeof(*r));
	s->regs = (struct lrec_regs){
		.ip = r->rip, .sp = r->rsp, .bp = r->rbp, .ax = r->rax, .bx = r->rbx,
		.cx = r->rcx, .dx = r->rdx, .si = r->rsi, .di = r->rdi, .r8 = r->r8, .r9 = r->r9,
		.r10 = r->r10, .r11 = r->r11, .r12 = r->r12, .r13 = r->r13, .r14 = r->r14,
		.r15 = r->r15, .flags = r->eflags,
	};

	/* Copy the user stack page by page, stopping at the first fault. Copying stops at
	 * the stack's end or after stack_size bytes; the PUC walker checks that a Lua state
	 * runs on this stack against the same end. */
	__u64 end = stack_end(s->regs.sp);
	struct copy_ctx c = { .sp = s->regs.sp, .cpu = cpu, .limit = stack_size };
	if (end - s->regs.sp < stack_size)
		c.limit = end - s->regs.sp;
	if (!(s->flags & LREC_NO_USER_REGS) && c.sp)
		bpf_loop(LREC_MAX_STACK / LREC_PAGE_SIZE + 1, copy_page, &c, 0);
	if (c.faulted)
		s->flags |= LREC_STACK_FAULTED;
	s->stack_len = c.copied;

	/* The Lua stack, when this process runs a Lua VM (LuaJIT or PUC) lrec has identified. */
	s->lua_offset = (c.copied + 7) & ~7U;
	s->lua_len = 0;
	if (!(s->flags & LREC_NO_USER_REGS))
		s->lua_len = lua_stack(b, &s->regs, s->pid, s->tid, cpu, s->lua_offset);
	if (!(s->flags & LREC_NO_USER_REGS) && !s->lua_len)
		s->lua_len = puc_stack(b, &s->regs, end, s->pid, s->tid, cpu, s->lua_offset);
	__u32 data_len = s->lua_len ? s->lua_offset + s->lua_len : c.copied;
	__u64 size = sizeof(struct lrec_sample) + (data_len & (LREC_DATA_SIZE - 1));
	__u64 flags = bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) >= wakeup_bytes
			      ? BPF_RB_FORCE_WAKEUP
			      : BPF_RB_NO_WAKEUP;
	long err = bpf_ringbuf_output(&samples, b, size, flags);
	if (err)
		count_lost();
	/* A walk's memo is used once lrec has the frames it names. */
	struct lua_work *lw = lua_work();
	if (lw)
		lua_memo_commit(&lw->memo, !err);
	struct puc_work *pw = puc_work();
	if (pw)
		lua_memo_commit(&pw->memo, !err);
}

/* The scratch record of this CPU with its header begun for the current thread. */
static __always_inline struct sample_buf *begin(__u64 id, __u32 cpu, __u32 kind)
{
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &cpu);
	if (!b)
		return 0;
	struct lrec_sample *s = &b->s;
	s->time_ns = bpf_ktime_get_ns();
	s->pid = id >> 32;
	s->tid = (__u32)id;
	s->cpu = cpu;
	s->flags = 0;
	s->kstack_len = 0;
	s->kind = kind;
	s->off_state = 0;
	s->off_start = 0;
	s->off_ns = 0;
	return b;
}

#endif

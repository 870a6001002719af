// SPDX-License-Identifier: GPL-2.0
/* On every cpu-clock tick of the target process: copy its user registers, up to
 * stack_size bytes of user stack and the kernel stack into the ring buffer. Nothing is
 * interpreted here; lanalyze does the unwinding offline. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "sample.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by lrec before load. */
const volatile __u32 stack_size = 16384;
/* Also record the processes the targets fork (pre-fork servers work in children). */
const volatile __u32 follow_children = 1;

/* The processes recorded (tgid → 1): filled by lrec, and by fork() below. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} targets SEC(".maps");

/* Userspace wakes only past a quarter full: per-record wakeups cost ~6 us each. */
const volatile __u64 wakeup_bytes = 1 << 20;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 32 << 20); /* resized by lrec */
} samples SEC(".maps");

/* Bytes after the sample header: the stack copy, then the Lua stack. A power of two, so
 * that masking an offset bounds it for the verifier. */
#define LREC_DATA_SIZE (128 * 1024)

/* Scratch buffer per CPU: an ARRAY, since a PERCPU value is capped at 32 KiB. The
 * slack past LREC_DATA_SIZE lets the verifier bound a page copy or a frame record at
 * any masked offset. */
struct sample_buf {
	struct lrec_sample s;
	__u8 data[LREC_DATA_SIZE + LREC_PAGE_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* set to the number of CPUs by lrec */
	__type(key, __u32);
	__type(value, struct sample_buf);
} scratch SEC(".maps");

/* Word i of the user stack copied into CPU cpu's scratch buffer, counting from sp: 1 with
 * the word in *v, 0 past the copy. The stack searches of the Lua walkers read it so. */
static __always_inline int copied_stack_word(__u32 cpu, __u64 i, __u64 *v)
{
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &cpu);
	__u64 off = i * 8;
	if (!b || off + 8 > b->s.stack_len)
		return 0;
	*v = *(__u64 *)&b->data[off & (LREC_DATA_SIZE - 1) & ~7U];
	return 1;
}

/* Samples dropped because the ring buffer was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Kernel fields read with CO-RE (relocated against the running kernel's BTF). */
struct mm_struct___lrec {
	unsigned long start_stack;
} __attribute__((preserve_access_index));

struct thread_struct___lrec {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct thread_info___lrec {
	unsigned int cpu; /* the CPU the task runs or is queued on */
} __attribute__((preserve_access_index));

struct task_struct___lrec {
	int pid;
	int tgid;
	unsigned int __state;
	int exit_state;
	int on_cpu;
	struct thread_info___lrec thread_info;
	struct mm_struct___lrec *mm;
	struct thread_struct___lrec thread;
} __attribute__((preserve_access_index));

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

/* Remembers g as the VM thread tid ran (map: lua_thread_vm or puc_thread_vm). Most
 * samples find it there already: a lookup then, no LRU update. */
static __always_inline void note_thread_vm(void *map, __u32 tid, __u64 g)
{
	__u64 *v = bpf_map_lookup_elem(map, &tid);
	if (v) {
		if (*v != g)
			*v = g;
		return;
	}
	bpf_map_update_elem(map, &tid, &g, BPF_ANY);
}

#include "luajit.h"
#include "puc.h"

static void count_lost(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&lost, &zero);
	if (n)
		*n += 1;
}

/* The user registers of the current task saved on entry to the kernel, or 0. */
static __always_inline int task_user_regs(struct pt_regs *r)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *ur = (struct pt_regs *)bpf_task_pt_regs(task);
	return ur && !bpf_probe_read_kernel(r, sizeof(*r), ur);
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
	if (bpf_ringbuf_output(&samples, b, size, flags))
		count_lost();
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

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	/* Per-CPU events see every process: keep the targets' threads only. */
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&targets, &tgid))
		return 0;

	__u32 cpu = bpf_get_smp_processor_id();
	struct sample_buf *b = begin(id, cpu, LREC_KIND_CPU);
	if (!b)
		return 0;
	struct lrec_sample *s = &b->s;

	/* In kernel mode ctx->regs are kernel registers: take the user ones saved on entry. */
	struct pt_regs r;
	if ((__s64)ctx->regs.rip < 0) {
		s->flags |= LREC_KERNEL_MODE;
		if (!task_user_regs(&r))
			s->flags |= LREC_NO_USER_REGS;
		long n = bpf_get_stack(ctx, s->kstack, sizeof(s->kstack), 0);
		if (n > 0)
			s->kstack_len = n / sizeof(__u64);
	} else {
		/* Field by field: passing &ctx->regs to a helper yields garbage. */
		r.rip = ctx->regs.rip;
		r.rsp = ctx->regs.rsp;
		r.rbp = ctx->regs.rbp;
		r.rax = ctx->regs.rax;
		r.rbx = ctx->regs.rbx;
		r.rcx = ctx->regs.rcx;
		r.rdx = ctx->regs.rdx;
		r.rsi = ctx->regs.rsi;
		r.rdi = ctx->regs.rdi;
		r.r8 = ctx->regs.r8;
		r.r9 = ctx->regs.r9;
		r.r10 = ctx->regs.r10;
		r.r11 = ctx->regs.r11;
		r.r12 = ctx->regs.r12;
		r.r13 = ctx->regs.r13;
		r.r14 = ctx->regs.r14;
		r.r15 = ctx->regs.r15;
		r.eflags = ctx->regs.eflags;
	}
	emit(b, &r, cpu);
	return 0;
}

#include "offcpu.h"
#include "lua_wait.h"
#include "latency.h"

/* A target forked a process: record it from its first instruction on. (Here, not in a
 * file of its own, because it shares the targets map with the sampler.) */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	struct task_struct___lrec *p = (void *)parent, *c = (void *)child;
	__u32 ptgid = BPF_CORE_READ(p, tgid), ctgid = BPF_CORE_READ(c, tgid);
	if (!follow_children || ptgid == ctgid || !bpf_map_lookup_elem(&targets, &ptgid))
		return 0;
	__u32 one = 1;
	bpf_map_update_elem(&targets, &ctgid, &one, BPF_ANY);
	return 0;
}

/* A recorded process exited: forget it, so a process that reuses its pid is not
 * recorded. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	struct task_struct___lrec *t = (void *)task;
	__u32 pid = BPF_CORE_READ(t, pid), tgid = BPF_CORE_READ(t, tgid);
	struct lrec_task *st = bpf_task_storage_get(&tasks, task, 0, 0);
	if (st)
		flush_task_totals(st);
	if (pid == tgid)
		bpf_map_delete_elem(&targets, &tgid);
	return 0;
}

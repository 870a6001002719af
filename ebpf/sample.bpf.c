// SPDX-License-Identifier: GPL-2.0
/* On every cpu-clock tick of the target process: copy its user registers, up to
 * stack_size bytes of user stack and the kernel stack into the ring buffer. Nothing is
 * interpreted here; lanalyze does the unwinding offline. */
#include "common.h"
#include "emit.h"
#include "offcpu.h"
#include "lua_wait.h"
#include "latency.h"

char LICENSE[] SEC("license") = "GPL";

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
	if (pid == tgid) {
		bpf_map_delete_elem(&targets, &tgid);
		lua_frees_forget(tgid);
	}
	return 0;
}

/* A process exec'd: its protos' count no longer proves its call sites. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task)
{
	lua_frees_forget(bpf_get_current_pid_tgid() >> 32);
	return 0;
}

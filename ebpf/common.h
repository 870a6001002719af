/* What every program of sample.bpf.c shares: lrec's settings, the targets, the sample ring
 * and its per-CPU scratch record, the loss counter and the CO-RE views of the kernel's
 * structs. Included first by each of its headers. */
#ifndef LREC_COMMON_H
#define LREC_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "sample.h"

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

/* The 8 bytes off bytes above sp of the user stack copied into CPU cpu's scratch buffer:
 * 1 with them in *v, 0 past the copy. The same bytes a read of the stack gives, the thread
 * being stopped in this interrupt; no read of the process's memory. */
static __always_inline int copied_stack_at(__u32 cpu, __u64 off, __u64 *v)
{
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &cpu);
	if (!b || off + 8 > b->s.stack_len)
		return 0;
	*v = *(__u64 *)&b->data[off & (LREC_DATA_SIZE - 1)];
	return 1;
}

/* Word i of the copied user stack, counting from sp (copied_stack_at). The stack searches
 * of the Lua walkers read it so. */
static __always_inline int copied_stack_word(__u32 cpu, __u64 i, __u64 *v)
{
	return copied_stack_at(cpu, i * 8, v);
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

#endif

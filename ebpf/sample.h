/* The one ABI shared by sample.bpf.c and record/src/raw.rs (which mirrors it with
 * #[repr(C)] types and asserts sizes and offsets). Change both together. */
#ifndef LREC_SAMPLE_H
#define LREC_SAMPLE_H

#define LREC_PAGE_SIZE 4096
/* Most user-stack bytes a sample can carry (--stack-size is capped to this). */
#define LREC_MAX_STACK (64 * 1024)
/* Kernel return addresses kept per sample (the kernel's own limit is 127). */
#define LREC_MAX_KSTACK 127

/* sample.flags */
#define LREC_KERNEL_MODE 1   /* interrupted kernel code; regs are the saved user regs */
#define LREC_STACK_FAULTED 2 /* the stack copy stopped at a fault before stack_size */
#define LREC_NO_USER_REGS 4  /* user registers unavailable */

struct lrec_regs {
	__u64 ip, sp, bp, ax, bx, cx, dx, si, di;
	__u64 r8, r9, r10, r11, r12, r13, r14, r15, flags;
};

/* One ring-buffer record: this header, then stack_len bytes of user stack from regs.sp. */
struct lrec_sample {
	__u64 time_ns;
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u32 flags;
	__u32 stack_len;
	__u32 kstack_len; /* entries used in kstack */
	struct lrec_regs regs;
	__u64 kstack[LREC_MAX_KSTACK];
	/* stack_len bytes of user stack follow */
};

#endif

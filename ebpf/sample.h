/* The one ABI shared by sample.bpf.c and record/src/raw.rs (which mirrors it with
 * #[repr(C)] types and asserts sizes and offsets). Change both together. */
#ifndef LREC_SAMPLE_H
#define LREC_SAMPLE_H

#include <linux/types.h>

#define LREC_PAGE_SIZE 4096
/* Most user-stack bytes a sample can carry (--stack-size is capped to this). */
#define LREC_MAX_STACK (64 * 1024)
/* Kernel return addresses kept per sample (the kernel's own limit is 127). */
#define LREC_MAX_KSTACK 127

/* sample.flags */
#define LREC_KERNEL_MODE 1   /* interrupted kernel code; regs are the saved user regs */
#define LREC_STACK_FAULTED 2 /* the stack copy stopped at a fault before stack_size */
#define LREC_NO_USER_REGS 4  /* user registers unavailable */

/* lrec_sample.kind */
#define LREC_KIND_CPU 0     /* a cpu-clock sample */
/* lrec_sample.off_state of a Lua coroutine's wait between lua_yield and lua_resume (no
 * task state has this bit) */
#define LREC_OFF_LUA_YIELD 0x80000000u
#define LREC_KIND_OFF_CPU 1 /* a blocked interval: registers and stacks at switch-out */

struct lrec_regs {
	__u64 ip, sp, bp, ax, bx, cx, dx, si, di;
	__u64 r8, r9, r10, r11, r12, r13, r14, r15, flags;
};

/* One ring-buffer record: this header, then stack_len bytes of user stack from regs.sp,
 * then (at lua_offset, when lua_len > 0) a struct lrec_lua_stack and its frames. */
struct lrec_sample {
	__u64 time_ns;
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u32 flags;
	__u32 stack_len;
	__u32 kstack_len; /* entries used in kstack */
	__u32 lua_offset; /* bytes after this header */
	__u32 lua_len;
	struct lrec_regs regs;
	__u32 kind;       /* LREC_KIND_* */
	__u32 off_state;  /* off-CPU: the task's __state at switch-out, or
			   * LREC_OFF_LUA_YIELD */
	__u64 off_start;  /* off-CPU: switched out at (CLOCK_MONOTONIC ns) */
	__u64 off_ns;     /* off-CPU: how long it was off CPU (the intervals of one system
			   * call add up) */
	__u64 kstack[LREC_MAX_KSTACK];
	/* stack_len bytes of user stack follow, then the Lua stack */
};

/* ---- Off-CPU and thread states ------------------------------------------------------ */

/* What lrec keeps per recorded thread (in the thread_totals map, by tid): the intervals
 * off CPU that were counted rather than recorded with a stack. The layout of the format's
 * ThreadOffCpuTotals (#[repr(C)]), read as is. */
struct lrec_thread_totals {
	__u32 pid;
	__u32 tid;
	__u64 short_count; /* blocked for less than off_cpu_min */
	__u64 short_ns;
	__u64 runnable_count; /* preempted: waiting for a CPU, not blocked */
	__u64 runnable_ns;
	__u64 unpaired_count; /* blocked, but its stack could not be taken (the thread ran
			       * user code before lrec saw it again, or the recording ended
			       * first) */
	__u64 unpaired_ns;
};

/* One thread as the task iterator saw it (written with bpf_seq_write), followed by
 * kstack_len kernel return addresses. */
struct lrec_thread_state {
	__u64 time_ns;
	__u32 pid;
	__u32 tid;
	__u32 state;       /* task->__state */
	__u32 exit_state;  /* task->exit_state */
	__u32 on_cpu;      /* running on a CPU now */
	__s32 syscall;     /* the system call it is in, -1 for none (needs sys_enter) */
	__u64 syscall_ns;  /* in it since (CLOCK_MONOTONIC ns) */
	__u64 off_since;   /* off CPU since (0: on a CPU or unknown) */
	__u64 user_ip;     /* saved user registers: valid while it is in the kernel */
	__u64 user_sp;
	__u32 kstack_len;
	__u32 pad;
	/* kstack_len __u64 follow */
};

/* ---- LuaJIT ------------------------------------------------------------------------ */

/* Most Lua frames walked per sample (across coroutines); deeper stacks are marked. */
#define LREC_LUA_MAX_FRAMES 512
/* Most VM code ranges per process. */
#define LREC_LUA_MAX_RANGES 4

/* lrec_lua_stack.flags */
#define LREC_LUA_TRUNCATED 1 /* more frames than LREC_LUA_MAX_FRAMES */
#define LREC_LUA_BROKEN 2    /* a frame could not be read */
#define LREC_LUA_JIT_MAPPED 4   /* in a trace: its snapshot gave the inlined frames and lines */
#define LREC_LUA_JIT_UNMAPPED 8 /* in a trace that could not be mapped: base frame only */
/* The frames of a suspended coroutine (an off-CPU Lua wait, lua_wait.h), not of the
 * state the thread runs: they go above the native stack, which is its resumer's. */
#define LREC_LUA_SUSPENDED 16
#define LREC_LUA_PUC 32 /* walked by PUC Lua's walker (puc.h), not LuaJIT's */
/* lrec_lua_frame.link: the frame ran as JIT-compiled code (a trace's start frame or a
 * function inlined into the trace). */
#define LREC_LUA_LINK_JIT 0x80

/* The layout of one LuaJIT build, validated by lrec against the live process and stored
 * per process in the lua_config map. Offsets in bytes. */
struct lrec_lua_config {
	__u64 vm_start[LREC_LUA_MAX_RANGES]; /* interpreter code, as mapped */
	__u64 vm_end[LREC_LUA_MAX_RANGES];
	__u32 gc64;       /* 1: 64-bit GC refs, two-slot frames (LJ_FR2) */
	__u32 g2disp;     /* DISPATCH - G (GG_G2DISP) */
	__u32 g_vmstate;  /* global_State */
	__u32 g_cur_l;
	__u32 g_jit_base;
	__u32 l_glref;    /* lua_State */
	__u32 l_base;
	__u32 l_stack;
	__u32 l_cframe;
	__u32 l_maxstack;
	__u32 cf_size;    /* C frame (CFRAME_*) */
	__u32 cf_l;
	__u32 cf_pc;
	__u32 cf_prev;
	__u32 cf_nres;
	__u32 fn_ffid;    /* GCfunc */
	__u32 fn_pc;
	__u32 fn_f;
	__u32 pt_size;    /* sizeof(GCproto); bytecode follows it */
	__u32 pt_sizebc;
	__u32 pt_chunkname;
	__u32 pt_firstline;
	__u32 pt_lineinfo;
	__u32 str_len;    /* GCstr */
	__u32 str_data;
	__u32 j_trace;    /* G to jit_State.trace (the trace array), found by lrec; 0: unknown */
	__u16 tr_nsnap;   /* GCtrace */
	__u16 tr_ir;
	__u16 tr_snap;
	__u16 tr_snapmap;
	__u16 tr_nsnapmap;
	__u16 tr_szmcode;
	__u16 tr_mcode;
	__u16 tr_traceno;
	/* CTState to two words, one of them CCallback.stack (lj_ctype.h): where an FFI
	 * callback's C frame is marked (its CTState differs by fork and release) */
	__u32 cts_stack;
	__u32 g_ctype_state; /* global_State: the FFI's CTState (0 until the FFI is loaded) */
	__u32 str_id;     /* GCstr: 8 bytes that identify a string (its id or hash, and more) */
	__u32 pt_numline; /* GCproto */
	__u32 pt_lo;      /* filled by lrec: the lowest of pt_sizebc, pt_chunkname, pt_firstline, */
	__u32 pt_span;    /* pt_numline, and the bytes from there that hold all four (< 128) */
	__u32 pad;
	/* Filled by lrec from the offsets above: bytes of lua_State read at once (its fields
	 * the walk reads), and the span of global_State's (vmstate, cur_L, jit_base,
	 * ctype_state) read at once; 0: each field read alone. */
	__u32 lh_size;
	__u32 gh_lo;
	__u32 gh_size;
};

/* Most chunk-name bytes and line-table bytes copied with a proto. */
#define LREC_LUA_CHUNKNAME 512
#define LREC_LUA_LINEINFO 4096
#define LREC_LUA_CODE_HEAD 7
/* PUC Lua 5.4+: the line deltas fill lineinfo up to here, the absolute lines follow. */
#define LREC_PUC_ABS_AT 3072

/* A proto's names and lines, copied once (per address, chunk name, lines and size) when a
 * sample first runs it: short-lived code is gone by the time lrec could read it. */
struct lrec_lua_proto {
	__u32 tgid;
	__u32 chunkname_len; /* the whole length; at most LREC_LUA_CHUNKNAME bytes copied */
	__u64 ptr;
	__u64 chunkname;
	__s32 firstline;
	__u32 numline;
	__u32 sizebc;
	__u32 lineinfo_len;  /* bytes copied */
	__u32 abs_len;       /* PUC Lua 5.4+: bytes of abslineinfo copied at LREC_PUC_ABS_AT */
	__u32 name_id;       /* the chunk name's identity (lrec_lua_frame.name_id) */
	__u32 code_words;    /* PUC Lua: instructions copied into code_head */
	__u32 code_head[LREC_LUA_CODE_HEAD]; /* PUC Lua: the first instructions, which prove
					      * lrec's later read of the code still is this
					      * proto's (a freed array's start is overwritten) */
	__u8 name[LREC_LUA_CHUNKNAME];
	__u8 lineinfo[LREC_LUA_LINEINFO];
};

/* One Lua frame. */
struct lrec_lua_frame {
	__u64 ptr;       /* Lua: GCproto; C and fast functions: the C function */
	__u64 chunkname; /* Lua: GCstr of the chunk name; ptr/chunkname/firstline/numline/
			  * sizebc tell a proto from another reusing its address */
	__u64 cframe;    /* the VM's native frame running this frame */
	__s32 firstline;
	__u32 numline;
	__u32 sizebc;
	__u32 pos;       /* current bytecode position, ~0 when unknown */
	__u8 ffid;       /* 0 Lua, 1 C, else a fast function */
	__u8 link;       /* FRAME_* type of this frame's link */
	__u8 check;      /* LREC_FRAME_FROM_SITE or 0 */
	__u8 pad;        /* 0: lrec compares frames whole */
	__u32 name_id;   /* the chunk name's identity, telling a new name at the address of a
			  * freed one apart (LuaJIT: the string's id and hash; PUC Lua: its
			  * length and last bytes) */
};

/* lrec_lua_frame.check: the frame's proto fields (ptr to name_id) were taken from a call
 * site remembered in an earlier sample (lua_sites), proved in this one: the proto at ptr,
 * read in this sample, has them, or no proto of the process was freed since (lua_frees.h). */
#define LREC_FRAME_FROM_SITE 1

struct lrec_lua_stack {
	__u64 g;         /* global_State: tells VMs apart */
	__u64 l;         /* running lua_State */
	__u64 cframe;    /* its innermost C frame (L->cframe) */
	__s32 vmstate;
	__u16 nframes;
	__u16 flags;
	/* Call sites remembered in earlier samples whose proto, read in this one, was no
	 * longer the one remembered (freed, another at its address): read in full. */
	__u32 stale;
	__u32 pad;
	/* A LuaJIT walk and its CPU's memo of frames (ebpf/luajit_memo.h): LREC_MEMO_TAKEN,
	 * memo_len frames of memo memo_seq, from its frame memo_from, stand at index memo_at
	 * of the walk, before the frames that follow them here (nframes counts those sent);
	 * LREC_MEMO_MADE, this walk's frames memo_at.. (memo_len of them) are memo memo_seq's,
	 * which later walks on this CPU may take from. */
	__u64 memo_seq;
	__u16 memo_at;
	__u16 memo_from;
	__u16 memo_len;
	__u8 memo;
	__u8 memo_pad;
	/* nframes struct lrec_lua_frame follow */
};

#define LREC_MEMO_NONE 0
#define LREC_MEMO_MADE 1
#define LREC_MEMO_TAKEN 2

/* ---- PUC Lua 5.1–5.5 ------------------------------------------------------------- */
/* PUC frames use struct lrec_lua_frame too: ptr is the closure's Proto (C
 * functions: the C function), chunkname the source TString, firstline/numline
 * linedefined/lastlinedefined, sizebc sizecode, pos the current instruction, ffid 0 Lua or
 * 1 C, link LREC_PUC_* bits, and cframe where the frame's coroutine began on the native
 * stack (its outermost lua_longjmp, set up by lua_resume; 0 for the outermost thread). */

/* lrec_lua_frame.link for PUC Lua */
#define LREC_PUC_FRESH 1 /* a native luaV_execute call began at this frame */
#define LREC_PUC_TAIL 2  /* reached by a tail call: its caller is gone */

/* lrec_puc_config.fresh_rule: how a CallInfo tells that luaV_execute began at it */
#define LREC_PUC_RULE_FRESH 0   /* callstatus & cist_fresh (5.3.2+, 5.4.2+, 5.5) */
#define LREC_PUC_RULE_REENTRY 1 /* !(callstatus & cist_fresh): CIST_REENTRY (5.2, 5.3.0-1) */
#define LREC_PUC_RULE_ALL 2     /* every Lua call recurses into luaV_execute (5.4.0-1) */
#define LREC_PUC_RULE_OPCODE 3  /* 5.1: unless the caller's instruction is a call */

/* lrec_puc_config.strings */
#define LREC_PUC_STR_LEN 0      /* 5.1, 5.2: a size_t length at str_len */
#define LREC_PUC_STR_SHORTLONG 1 /* 5.3, 5.4: shrlen byte for short strings, else lnglen */
#define LREC_PUC_STR_55 2       /* 5.5: shrlen < 0 marks a long string holding a pointer */

/* The layout of one PUC Lua release (x86_64, default luaconf), known to lrec by the
 * version string in the binary and stored per process in the puc_config map. */
struct lrec_puc_config {
	__u32 version;     /* 501 .. 505 */
	__u32 fresh_rule;
	__u32 cist_fresh;
	__u32 cist_tail;
	__u32 callstatus_size; /* bytes of ci->callstatus: 1, 2 or 4 */
	__u32 l_g;         /* lua_State */
	__u32 l_ci;
	__u32 l_status;    /* a byte */
	__u32 l_base_ci;   /* 5.2+: the embedded base CallInfo; 5.1: a pointer to the array */
	__u32 l_savedpc;   /* 5.1: the current Lua function's pc */
	__u32 l_errorjmp;
	__u32 g_mainthread;
	__u32 ci_func;     /* CallInfo */
	__u32 ci_previous; /* 5.1: none, CallInfos are an array of ci_size */
	__u32 ci_savedpc;
	__u32 ci_callstatus;
	__u32 ci_size;     /* sizeof(CallInfo) */
	__u32 tag_lcl;     /* type tags as stored in a TValue (tt at +8) */
	__u32 tag_ccl;
	__u32 tag_lcf;
	__u32 tag_thread;
	__u32 cl_isc;      /* 5.1: Closure.isC */
	__u32 cl_p;        /* LClosure.p */
	__u32 ccl_f;       /* CClosure.f */
	__u32 ccl_upvalue; /* CClosure.upvalue[0] */
	__u32 p_source;    /* Proto */
	__u32 p_linedefined;
	__u32 p_lastlinedefined;
	__u32 p_code;
	__u32 p_sizecode;
	__u32 p_lineinfo;
	__u32 p_sizelineinfo;
	__u32 p_abslineinfo; /* 5.4+, else 0 */
	__u32 p_sizeabslineinfo;
	__u32 strings;     /* LREC_PUC_STR_* */
	__u32 str_len;     /* TString: length or lnglen */
	__u32 str_shrlen;
	__u32 str_data;    /* text, or (5.5 long strings) a pointer to it */
	__u32 op_call;     /* 5.1 */
	__u32 op_tailcall;
	__u32 l_size;      /* sizeof(lua_State), sizeof(Proto): reads stop there, as the */
	__u32 p_size;      /* heap may end right after an object */
	__u32 ci_tailcalls; /* 5.1: ci->tailcalls (no CIST_TAIL), else 0 */
	__u32 str_hdr;     /* bytes of a TString's header read: its type, lengths (<= 56) */
};

/* Timed calls (ebpf/latency.h), read by lrec (record/src/raw.rs asserts the layouts). */
struct lrec_lat_hist_key {
	__u32 tid;
	__u16 probe;
	__u16 bucket;
};

struct lrec_lat_stat_key {
	__u32 tid;
	__u32 probe;
};

struct lrec_lat_stat {
	__u32 pid;
	__u32 pad;
	__u64 count;
	__u64 sum_ns;
	__u64 min_ns;
	__u64 max_ns;
};

struct lrec_lat_event {
	__u32 probe;
	__u32 pid;
	__u32 tid;
	__u32 pad;
	__u64 start_ns;
	__u64 duration_ns;
};

#endif

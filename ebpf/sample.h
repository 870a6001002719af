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
	__u64 kstack[LREC_MAX_KSTACK];
	/* stack_len bytes of user stack follow, then the Lua stack */
};

/* ---- LuaJIT ------------------------------------------------------------------------ */

/* Most Lua frames walked per sample (across coroutines); deeper stacks are marked. */
#define LREC_LUA_MAX_FRAMES 512
/* Most VM code ranges per process. */
#define LREC_LUA_MAX_RANGES 4

/* lrec_lua_stack.flags */
#define LREC_LUA_TRUNCATED 1 /* more frames than LREC_LUA_MAX_FRAMES */
#define LREC_LUA_BROKEN 2    /* a frame could not be read */

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
	__u32 pt_firstline; /* numline follows it */
	__u32 pt_lineinfo;
	__u32 str_len;    /* GCstr */
	__u32 str_data;
	__u32 pad;
};

/* Most chunk-name bytes and line-table bytes copied with a proto. */
#define LREC_LUA_CHUNKNAME 512
#define LREC_LUA_LINEINFO 4096

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
	__u8 name[LREC_LUA_CHUNKNAME];
	__u8 lineinfo[LREC_LUA_LINEINFO];
};

/* One Lua frame. */
struct lrec_lua_frame {
	__u64 func;      /* GCfunc */
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
	__u8 pad[6];
};

struct lrec_lua_stack {
	__u64 g;         /* global_State: tells VMs apart */
	__u64 l;         /* running lua_State */
	__u64 cframe;    /* its innermost C frame (L->cframe) */
	__s32 vmstate;
	__u16 nframes;
	__u16 flags;
	/* nframes struct lrec_lua_frame follow */
};

#endif

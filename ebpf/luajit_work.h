/* LuaJIT's walk: what all its steps share, the build's layout (lua_config, from lrec) and
 * the work buffer (struct lua_work) each sample's walk fills. */
#ifndef LREC_LUAJIT_WORK_H
#define LREC_LUAJIT_WORK_H

#include "common.h"
#include "lua_protos.h"
#include "window.h"
#include "lua_memo.h"

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
	__u32 gen;          /* lua_proto_gen, read once per sample */
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
	/* The memory around the protos the walk reads (lj_proto_key), a window at a time:
	 * one chunk's protos lie near one another. Read in this sample, as the proof of a
	 * remembered call site must be. */
	struct window ptwin;
	__u64 pt_prev;      /* where the last proto's span read lies (0: none yet) */
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
	__u64 frees;        /* the process's protos freed, at the sample's start (lua_frees.h) */
	__u32 audit;        /* every site proved by a read too (lua_frees_audit) */
	__u32 pad_audit;
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
	/* The memo of full walks (luajit_memo.h). */
	struct lua_memo_state memo;
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

#endif

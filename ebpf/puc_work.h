/* PUC Lua's walk: what its steps share, the build's layout (puc_config, from lrec) and the
 * work buffer (struct puc_work) each sample's walk fills. */
#ifndef LREC_PUC_WORK_H
#define LREC_PUC_WORK_H

#include "common.h"
#include "lua_protos.h"
#include "window.h"
#include "lua_memo.h"

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
	__u32 gen;           /* lua_proto_gen, read once per sample */
	__u64 unnoted;       /* a proto read to prove a site, which it failed: not noted yet */
	__u32 prev_lua;  /* the frame emitted last is a Lua frame of this thread */
	__u32 stale;     /* call sites whose proto was no longer the one remembered */
	__u64 frees;     /* the process's protos freed, at the sample's start (lua_frees.h) */
	__u32 audit;     /* every site proved by a read too (lua_frees_audit) */
	__u32 pad_audit;
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
	/* The memory around the protos the walk reads (puc_read_proto), a window at a time:
	 * one chunk's protos lie near one another. Read in this sample, as the proof of a
	 * remembered call site must be. */
	struct window ptw;
	__u64 pt_prev;  /* the last proto read (0: none yet) */
	/* The memo of full walks (puc_memo.h). */
	struct lua_memo_state memo;
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
/* The type tag of the TValue at tv (its tt_ byte). */
#define PUC_TT(tv) (*(__u32 *)&(tv)[8] & 0xff)

/* A CallInfo's callstatus (at cib), to its size in this build. */
static __always_inline __u32 puc_ci_status(struct lrec_puc_config *c, __u8 *cib)
{
	__u32 status = PUC_U32(cib, PUC_CI, c->ci_callstatus);
	if (c->callstatus_size == 1)
		status &= 0xff;
	else if (c->callstatus_size == 2)
		status &= 0xffff;
	return status;
}

#endif

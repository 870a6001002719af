/* The protos (function prototypes) both Lua walkers (luajit.h, puc.h) copy out: each one
 * once per process, keyed by the fields that tell a proto apart from one a collected
 * proto's address was reused for (address, chunk name, first line, line count, size).
 * lrec reads the copies from the lua_protos ring before the samples that name them. */
#ifndef LREC_LUA_PROTOS_H
#define LREC_LUA_PROTOS_H

#include "common.h"
#include "lua_frees.h"

/* Protos already copied out: (tgid, address, chunk name, first line, line count, size),
 * in the generation they were copied in (lua_proto_gen). */
struct lua_proto_key {
	__u32 tgid;
	__s32 firstline;
	__u64 ptr;
	__u64 chunkname;
	__u32 numline;
	__u32 sizebc;
	__u32 name_id;
	__u32 gen;
};

/* The generation of copies: lrec forgets the keys of protos it received two generations
 * ago (a host whose VMs live for one request makes new ones for as long as it runs), and
 * counts a new generation here first, so that every proto a frame names from now on is
 * copied out again in it, or was copied in it (the call sites of lua_sites included). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} lua_proto_gen SEC(".maps");

/* The generation now: each walker reads it once per sample (w->gen). */
static __always_inline __u32 lua_proto_gen_now(void)
{
	__u32 zero = 0;
	__u32 *g = bpf_map_lookup_elem(&lua_proto_gen, &zero);
	return g ? *g : 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct lua_proto_key);
	__type(value, __u32);
} lua_protos_seen SEC(".maps");

/* In front of lua_protos_seen, per CPU: the keys seen last, direct-mapped by address. A
 * hit costs a few compares where the LRU hash costs a hash of the key and a lookup, for
 * each frame of each sample. (An entry the LRU evicted stays here: its proto was sent.) */
#define LUA_SEEN_CACHE 1024
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LUA_SEEN_CACHE);
	__type(key, __u32);
	__type(value, struct lua_proto_key);
} lua_seen_cache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* a proto's copy once: ~5 KiB each */
} lua_protos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lrec_lua_proto);
} lua_proto_buf SEC(".maps");

/* The key of frame f's proto (process tgid, generation gen). */
static __always_inline void lua_proto_key_of(struct lua_proto_key *k, __u32 tgid, __u32 gen,
					     struct lrec_lua_frame *f)
{
	*k = (struct lua_proto_key){
		.tgid = tgid, .firstline = f->firstline, .ptr = f->ptr,
		.chunkname = f->chunkname, .numline = f->numline, .sizebc = f->sizebc,
		.name_id = f->name_id, .gen = gen,
	};
}

/* Frame f's proto fields, from key k (lua_proto_key_of's inverse). */
static __always_inline void lua_frame_of_key(struct lrec_lua_frame *f, struct lua_proto_key *k)
{
	f->ptr = k->ptr;
	f->chunkname = k->chunkname;
	f->firstline = k->firstline;
	f->numline = k->numline;
	f->sizebc = k->sizebc;
	f->name_id = k->name_id;
}

/* Whether keys a and b name the same proto. */
static __always_inline int lua_proto_key_eq(struct lua_proto_key *a, struct lua_proto_key *b)
{
	return a->ptr == b->ptr && a->tgid == b->tgid && a->firstline == b->firstline &&
	       a->chunkname == b->chunkname && a->numline == b->numline &&
	       a->sizebc == b->sizebc && a->name_id == b->name_id && a->gen == b->gen;
}

/* This CPU's cache entry for key k. */
static __always_inline struct lua_proto_key *lua_seen_slot(struct lua_proto_key *k)
{
	__u32 i = ((__u32)(k->ptr >> 3) ^ (__u32)(k->ptr >> 13)) & (LUA_SEEN_CACHE - 1);
	return bpf_map_lookup_elem(&lua_seen_cache, &i);
}

/* Whether the proto of key k was copied out already. */
static __always_inline int lua_proto_seen(struct lua_proto_key *k)
{
	struct lua_proto_key *c = lua_seen_slot(k);
	if (c && lua_proto_key_eq(c, k))
		return 1;
	if (!bpf_map_lookup_elem(&lua_protos_seen, k))
		return 0;
	if (c)
		*c = *k;
	return 1;
}

/* The proto record to fill for frame f, or NULL when this proto was copied already; k
 * receives the proto's key for lua_proto_commit. Both VMs' walkers (here and puc.h) key
 * protos alike. */
static __always_inline struct lrec_lua_proto *lua_proto_begin(struct lua_proto_key *k,
							      __u32 tgid, __u32 gen,
							      struct lrec_lua_frame *f)
{
	lua_proto_key_of(k, tgid, gen, f);
	if (lua_proto_seen(k))
		return NULL;
	__u32 zero = 0;
	struct lrec_lua_proto *p = bpf_map_lookup_elem(&lua_proto_buf, &zero);
	if (!p)
		return NULL;
	p->tgid = tgid;
	p->ptr = f->ptr;
	p->chunkname = f->chunkname;
	p->firstline = f->firstline;
	p->numline = f->numline;
	p->sizebc = f->sizebc;
	p->name_id = f->name_id;
	p->chunkname_len = 0;
	p->lineinfo_len = 0;
	p->abs_len = 0;
	p->code_words = 0;
	return p;
}

/* Call sites, remembered across samples by both walkers so that a frame's caller is found
 * without reading its function and the bytecode of its call: the return PC (LuaJIT: of the
 * call; PUC 5.2+: a CallInfo's savedpc below the innermost frame), LuaJIT's call A operand
 * (the caller's frame lies 1 + A slots below) or PUC's Proto.code, and the proto the PC
 * lies in (a proto with these fields holds the same code: the identity lua_protos_seen
 * uses). An entry is used only when the sample proves it: by the count of the process's
 * protos freed (lua_frees.h) unchanged since the entry was made, else by one read of its
 * proto's fields, chunk name's identity included, finding them unchanged: nothing is left
 * for lrec to check after the sample, when the memory may belong to another VM. A proto
 * freed (its VM closed, or collected) and another allocated at its address fails both, and
 * the frame is read in full. (A VM generation counted by uprobes on lua_close, with the frame's
 * closure, is no proof: a VM that reloads collected code at the same addresses, as
 * tests/jit.rs's flush does, defeats it.) A frame named by an entry
 * goes out marked LREC_FRAME_FROM_SITE. Entries are made only for protos already sent, so
 * that every proto a frame names reached lrec.
 * Per CPU, in sets of LUA_SITE_WAYS entries chosen by a hash of the PC: sites of a deep
 * stack that hash alike would otherwise evict each other at every sample, and all be read
 * at every sample (1 frame in 4 of part 8's 200-deep chain was, with a direct-mapped
 * table). */
struct lua_site {
	__u64 pc;
	__u64 a;
	struct lua_proto_key k;
	__u64 frees; /* the process's protos freed when it was made (lua_frees_now) */
};

/* The entries of a set, the one filled last first. Four: with two, three sites of a deep
 * stack that hash alike (the bytecode's addresses decide) evicted one another at every
 * sample, and a clean-clone run read 15 % of a 200-deep chain's frames in full. */
#define LUA_SITE_WAYS 4
struct lua_site_set {
	struct lua_site e[LUA_SITE_WAYS];
};

#define LUA_SITES 1024 /* sets */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LUA_SITES);
	__type(key, __u32);
	__type(value, struct lua_site_set);
} lua_sites SEC(".maps");

/* This CPU's lua_sites set for PC pc (Fibonacci hashing: call sites lie at strides that
 * a few low bits of the PC would map to few sets). */
static __always_inline struct lua_site_set *lua_site_set(__u64 pc)
{
	__u32 i = (__u32)((pc * 0x9E3779B97F4A7C15ULL) >> 54) & (LUA_SITES - 1);
	return bpf_map_lookup_elem(&lua_sites, &i);
}

/* The remembered call site at PC pc in process tgid, or 0. A site remembered in an
 * earlier generation than gen names a proto lrec may have forgotten: it is not used. */
static __always_inline struct lua_site *lua_site_find(__u64 pc, __u32 tgid, __u32 gen)
{
	struct lua_site_set *set = lua_site_set(pc);
	if (!set)
		return 0;
	for (int i = 0; i < LUA_SITE_WAYS; i++)
		if (set->e[i].pc == pc && set->e[i].k.tgid == tgid && set->e[i].k.gen == gen)
			return &set->e[i];
	return 0;
}

/* Whether site s is proved without reading its proto: no proto of the process was freed
 * since it was made (frees: the count at this sample's start). */
static __always_inline int lua_site_unfreed(struct lua_site *s, __u64 frees)
{
	return frees != LUA_FREES_UNCOUNTED && s->frees == frees;
}

/* Site s was proved by a read of its proto in this sample: from now on, the count of
 * frees at its start (frees) proves it until a proto is freed (a site made before the
 * process's frees were counted, or proved by a read since one was freed, is proved so
 * too). */
static __always_inline void lua_site_proved(struct lua_site *s, __u64 frees)
{
	s->frees = frees;
}

/* Remembers the call site at PC pc with a (LuaJIT: the call's A; PUC: Proto.code) in the
 * proto frame f runs, once that proto was sent (lua_protos_seen): first in its set, the
 * others moved down one (the last one out), this PC's old entry dropped. frees: the
 * process's protos freed at this sample's start (f's proto was read after it). */
static __always_inline void lua_site_fill(__u64 pc, __u64 a, __u32 tgid, __u32 gen,
					  __u64 frees, struct lrec_lua_frame *f)
{
	struct lua_proto_key k;
	lua_proto_key_of(&k, tgid, gen, f);
	if (!lua_proto_seen(&k))
		return;
	struct lua_site_set *set = lua_site_set(pc);
	if (!set)
		return;
	/* Entries above this PC's old one (or all but the last) move down. */
	int keep = LUA_SITE_WAYS - 1;
	for (int i = 0; i < LUA_SITE_WAYS - 1; i++)
		if (set->e[i].pc == pc && keep == LUA_SITE_WAYS - 1)
			keep = i;
	for (int i = LUA_SITE_WAYS - 1; i > 0; i--)
		if (i <= keep)
			set->e[i] = set->e[i - 1];
	set->e[0].pc = pc;
	set->e[0].a = a;
	set->e[0].k = k;
	set->e[0].frees = frees;
}

/* Sends a filled proto record and remembers it (its key k) as copied. */
static __always_inline void lua_proto_commit(struct lrec_lua_proto *p, struct lua_proto_key *k)
{
	/* Only the bytes filled: the line table's (PUC 5.4+: up to its absolute lines). A
	 * small function's copy is ~600 bytes, not the whole record's ~4.7 KiB: a host making
	 * VMs per request sends thousands of copies a second, and the ring must hold them. */
	__u32 used = p->abs_len ? LREC_PUC_ABS_AT + p->abs_len : p->lineinfo_len;
	if (used > LREC_LUA_LINEINFO)
		used = LREC_LUA_LINEINFO;
	__u64 size = __builtin_offsetof(struct lrec_lua_proto, lineinfo) + used;
	if (size > sizeof(*p))
		size = sizeof(*p);
	if (bpf_ringbuf_output(&lua_protos, p, size, 0))
		return;
	__u32 one = 1;
	bpf_map_update_elem(&lua_protos_seen, k, &one, BPF_ANY);
	struct lua_proto_key *c = lua_seen_slot(k);
	if (c)
		*c = *k;
}

#endif

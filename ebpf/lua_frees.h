/* Protos freed, counted per process and VM: the proof that lets a remembered call site
 * (lua_sites, lua_protos.h) name its frame without reading the proto again.
 *
 * A proto is freed only by its VM's free function (LuaJIT's lj_func_freeproto, PUC's
 * luaF_freeproto: the GC's sweep and lua_close both call it). lrec finds that function in
 * the binary holding the VM, attaches a uprobe to it (on_luajit_free, on_puc_free), and
 * only then adds the process's entry here, starting at the time it was added (ns): a
 * count never reaches the start of a later entry for a reused pid, so a site remembered
 * by an earlier process never matches. A site remembers the count read at the start of
 * the sample that filled it; while the count is unchanged, no proto of the process was
 * freed since, so the proto at the site's address is still the one remembered and holds
 * the return PC (a frame's return PC lies in its own, live, proto). An entry ends when
 * its process exits or execs (lua_frees_forget), or when a sample audited finds it wrong
 * (lua_frees_wrong). A process without an
 * entry (its VM's free function not found, or not probed) has every site proved by a read
 * of its proto, as before. */
#ifndef LREC_LUA_FREES_H
#define LREC_LUA_FREES_H

#include "common.h"

#define LUA_VM_LUAJIT 0
#define LUA_VM_PUC 1

struct lua_frees_key {
	__u32 tgid;
	__u32 vm; /* LUA_VM_* */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct lua_frees_key);
	__type(value, __u64);
} lua_frees SEC(".maps");

/* No entry: the process's frees are not counted. */
#define LUA_FREES_UNCOUNTED (~0ULL)

/* The count of process tgid's protos freed now (read once per sample, before any proto),
 * or LUA_FREES_UNCOUNTED. */
static __always_inline __u64 lua_frees_now(__u32 tgid, __u32 vm)
{
	struct lua_frees_key k = {.tgid = tgid, .vm = vm};
	__u64 *n = bpf_map_lookup_elem(&lua_frees, &k);
	return n ? *n : LUA_FREES_UNCOUNTED;
}

/* Process tgid's counts end: it exited, or exec'd (the new program's protos may lie
 * where the old one's did, none of them freed): its sites are proved by reads until lrec
 * counts again. */
static __always_inline void lua_frees_forget(__u32 tgid)
{
	struct lua_frees_key k = {.tgid = tgid, .vm = LUA_VM_LUAJIT};
	bpf_map_delete_elem(&lua_frees, &k);
	k.vm = LUA_VM_PUC;
	bpf_map_delete_elem(&lua_frees, &k);
}

/* Samples whose every site is proved by a read as well, counted or not: 1 in this many. A
 * read that finds another proto where the count said none was freed shows a free the
 * uprobe did not see (a second free function, or not the one lrec found): the process's
 * count ends (its sites proved by reads), and lrec says so. */
#define LUA_FREES_AUDIT 32

static __always_inline int lua_frees_audit(void)
{
	return bpf_get_prandom_u32() % LUA_FREES_AUDIT == 0;
}

/* Counts found wrong by an audit, per VM (LUA_VM_*), read by lrec. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} lua_frees_missed SEC(".maps");

/* An audit found the count of process tgid wrong: it ends. */
static __always_inline void lua_frees_wrong(__u32 tgid, __u32 vm)
{
	struct lua_frees_key k = {.tgid = tgid, .vm = vm};
	bpf_map_delete_elem(&lua_frees, &k);
	__u64 *n = bpf_map_lookup_elem(&lua_frees_missed, &vm);
	if (n)
		__sync_fetch_and_add(n, 1);
}

/* A proto is being freed: counted on entry, before its memory can be reused. */
static __always_inline int lua_free_counted(__u32 vm)
{
	struct lua_frees_key k = {.tgid = bpf_get_current_pid_tgid() >> 32, .vm = vm};
	__u64 *n = bpf_map_lookup_elem(&lua_frees, &k);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

SEC("uprobe")
int on_luajit_free(struct pt_regs *ctx)
{
	return lua_free_counted(LUA_VM_LUAJIT);
}

SEC("uprobe")
int on_puc_free(struct pt_regs *ctx)
{
	return lua_free_counted(LUA_VM_PUC);
}

#endif

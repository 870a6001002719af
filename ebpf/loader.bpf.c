// SPDX-License-Identifier: GPL-2.0
/* A uprobe on the dynamic loader's _dl_debug_state, the breakpoint debuggers use: ld.so
 * calls it after mapping the libraries a program starts with and around every dlopen and
 * dlclose. It wakes lrec at once to re-read /proc/PID/maps while the libraries are mapped,
 * so a short-lived process cannot exit before lrec has seen them. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;

/* One timestamp per call; lrec only needs the wakeup. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 4096);
} loader_events SEC(".maps");

SEC("uprobe")
int dl_debug_state(void *ctx)
{
	/* The probe is on a shared file: keep the target's calls only. */
	if ((__u32)(bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;
	__u64 t = bpf_ktime_get_ns();
	bpf_ringbuf_output(&loader_events, &t, sizeof(t), BPF_RB_FORCE_WAKEUP);
	return 0;
}

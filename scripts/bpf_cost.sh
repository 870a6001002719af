#!/bin/bash
# What lrec's BPF sampler costs per sample (make bench, part 8; issue 23), from the kernel's
# own accounting (kernel.bpf_stats_enabled): steadier than the target's slowdown on a shared
# machine. The target runs on CPU 1, `lrec -p PID -F HZ -d SECS` on CPU 0; prints the
# sampler's run time over the samples it wrote, in µs.
#
# Usage: scripts/bpf_cost.sh [-l LREC] [-F HZ] [-d SECS] -- COMMAND ARGS...
set -euo pipefail
lrec=./target/release/lrec hz=4999 secs=4
while [ $# -gt 0 ]; do
  case "$1" in
    -l) lrec=$2; shift 2 ;;
    -F) hz=$2; shift 2 ;;
    -d) secs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-l LREC] [-F HZ] [-d SECS] -- COMMAND ARGS..." >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-l LREC] [-F HZ] [-d SECS] -- COMMAND ARGS..." >&2; exit 2; }
old=$(sysctl -n kernel.bpf_stats_enabled)
out=$(mktemp -d)
taskset -c 1 "$@" >/dev/null &
target=$!
trap 'kill $target 2>/dev/null || true; wait $target 2>/dev/null || true; sysctl -qw kernel.bpf_stats_enabled="$old"; rm -rf "$out"' EXIT
sysctl -qw kernel.bpf_stats_enabled=1
sleep 0.5
taskset -c 0 "$lrec" -p "$target" -F "$hz" -d "$secs" -o "$out/c.lrec" 2>"$out/err" >/dev/null ||
  { cat "$out/err" >&2; exit 1; }
grep -o '[0-9.]* us per sample' "$out/err" | awk '{ print $1 }'

#!/usr/bin/env python3
"""What each sample costs the target on its own CPU (make bench, part 8; issue 23).

The target runs forever on CPU 1, printing a line per fixed amount of work; this script
reads and timestamps the lines on CPU 0, where the profilers run too, and reads the
target's CPU time at each. In alternating windows of WINDOW seconds the target runs bare,
under `lrec -p`, under `lrec -p` of an idle process (lrec's floor: its per-CPU sampling
interrupt and the sampler's first check, which drops other processes' ticks), under
`perf record -p --call-graph dwarf,16384` and under `perf record -p` without call graphs
(perf's floor: its sampling interrupt alone), all at HZ. The target's CPU time per line in
each window (start-up and teardown excluded) over bare's, times lines per second, over the
samples taken per second, is the CPU time one sample costs it (the interrupt runs in its
context and is charged to it). Above each profiler's own floor is what its work adds.
"own" is the profiler process's own CPU (user + system) per sample, start-up included.
Median over ROUNDS rounds, the order of the windows rotating each round.

Usage: cost.py [--rounds N] [--window S] [--hz HZ] LABEL=COMMAND...
"""

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

LREC = "./target/release/lrec"
LANALYZE = "./target/release/lanalyze"
MODES = ["bare", "lrec", "lrec-floor", "perf", "floor"]
# Start-up (attach, BPF load, first maps) and teardown are left out of each window.
LEAD, TAIL = 1.0, 0.5


class Progress:
    """Timestamps of the target's progress lines, read on this (CPU 0) process, and the
    target's CPU time (ns, /proc/PID/schedstat) at each: the sampling interrupt runs in the
    target's context and is charged to it, while time the hypervisor takes from the VM
    (steal) is not, so CPU time per line is steadier than wall time per line."""

    def __init__(self, proc):
        self.times = []
        self.cpu = []
        self.stat = f"/proc/{proc.pid}/schedstat"
        self.thread = threading.Thread(target=self.read, args=(proc,), daemon=True)
        self.thread.start()

    def read(self, proc):
        for _ in proc.stdout:
            t = time.monotonic()
            try:
                with open(self.stat) as f:
                    c = int(f.read().split()[0])
            except OSError:
                return
            self.times.append(t)
            self.cpu.append(c)

    def rate(self, t0, t1):
        n = sum(1 for t in self.times if t0 <= t < t1)
        return n / (t1 - t0)

    def cpu_per_line(self, t0, t1):
        """The target's CPU time per line (ns) between its first and last line in [t0, t1)."""
        i = [k for k, t in enumerate(self.times) if t0 <= t < t1]
        if len(i) < 2:
            return float("nan")
        return (self.cpu[i[-1]] - self.cpu[i[0]]) / (i[-1] - i[0])


def sysctl(name, value=None):
    path = "/proc/sys/" + name.replace(".", "/")
    old = open(path).read().strip()
    if value is not None:
        with open(path, "w") as f:
            f.write(str(value))
    return old


def lrec_window(pid, args, out, count=True):
    """lrec recording pid; when pid is another, idle process, the target still pays lrec's
    sampling interrupt and the sampler's first check (not a recorded process): lrec's
    floor."""
    cmd = ["taskset", "-c", "0", LREC, "-p", str(pid), "-d", str(args.window)]
    cmd += ["-F", str(args.hz), "-o", out]
    c0, t0 = children_cpu(), time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    t1, cpu = time.monotonic(), children_cpu() - c0
    if p.returncode != 0:
        sys.exit(f"lrec failed: {p.stderr}")
    bpf = re.search(r"BPF sampler: .* ([0-9.]+) us per sample", p.stderr)
    if not count:
        return t0, t1, None, None, None
    total, lost, secs = lrec_counts(out)
    bpf = float(bpf.group(1)) if bpf else None
    return t0, t1, (total + lost) / secs, bpf, cpu / (total + lost) * 1e6


def lrec_counts(capture):
    """(samples, lost, seconds of samples) of an lrec capture, from `lanalyze --info`."""
    info = subprocess.run([LANALYZE, capture, "--info"], capture_output=True, text=True).stdout
    total = int(re.search(r"total:\s+(\d+)", info).group(1))
    lost = int(re.search(r"lost:\s+(\d+)", info).group(1))
    secs = float(re.search(r"duration:\s+([0-9.]+) s", info).group(1))
    return total, lost, secs


def perf_counts(data):
    """(samples, lost) of a perf.data file, from `perf report --stats`."""
    stats = subprocess.run(
        ["perf", "report", "-i", data, "--stats"], capture_output=True, text=True
    ).stdout
    # The aggregated counts come first (then per-thread ones).
    samples = int((re.findall(r"SAMPLE events:\s+(\d+)", stats) or ["0"])[0])
    lost = int((re.findall(r"LOST_SAMPLES events:\s+(\d+)", stats) or ["0"])[0])
    return samples, lost


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def perf_window(pid, args, out, dwarf):
    cmd = ["taskset", "-c", "0", "perf", "record", "-q", "-F", str(args.hz), "-p", str(pid)]
    if dwarf:
        cmd += ["--call-graph", "dwarf,16384"]
    cmd += ["-o", out, "--", "sleep", str(args.window)]
    c0, t0 = children_cpu(), time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    t1, cpu = time.monotonic(), children_cpu() - c0
    if p.returncode != 0:
        sys.exit(f"perf failed: {p.stderr}")
    samples, lost = perf_counts(out)
    return t0, t1, (samples + lost) / args.window, None, cpu / max(samples + lost, 1) * 1e6


def measure(label, command, args, tmp):
    target = subprocess.Popen(
        ["taskset", "-c", "1"] + shlex.split(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    progress = Progress(target)
    idle = subprocess.Popen(["sleep", "100000"])
    time.sleep(2)  # the target warms up (the JIT compiles its traces)
    rates = {m: [] for m in MODES}
    cpl = {m: [] for m in MODES}
    per_s = {m: [] for m in MODES}
    bpf, own = [], {"lrec": [], "perf": []}
    try:
        for r in range(args.rounds):
            order = MODES[r % len(MODES):] + MODES[: r % len(MODES)]
            for mode in order:
                out = os.path.join(tmp, "w." + mode)
                if mode == "bare":
                    t0 = time.monotonic()
                    time.sleep(args.window)
                    t1 = time.monotonic()
                    f = 0.0
                elif mode == "lrec":
                    t0, t1, f, b, c = lrec_window(target.pid, args, out)
                    if b is not None:
                        bpf.append(b)
                    own["lrec"].append(c)
                elif mode == "lrec-floor":
                    t0, t1, f, _, _ = lrec_window(idle.pid, args, out, count=False)
                else:
                    t0, t1, f, _, c = perf_window(target.pid, args, out, mode == "perf")
                    if mode == "perf":
                        own["perf"].append(c)
                rates[mode].append(progress.rate(t0 + LEAD, t0 + args.window - TAIL))
                cpl[mode].append(progress.cpu_per_line(t0 + LEAD, t0 + args.window - TAIL))
                if f is not None:
                    per_s[mode].append(f)
                if os.path.exists(out):
                    os.remove(out)
    finally:
        target.kill()
        target.wait()
        idle.kill()
        idle.wait()
    # lrec's floor ticks as often as perf's does: an idle process's tick costs the target
    # the interrupt and one check, well within a period, so no tick is skipped. (Not as
    # often as lrec's own: when an interrupt and the walk outlast the period, the timer
    # skips the ticks it missed, and lrec's rate falls; at 40 kHz, 25 us, it does at 200
    # frames. Dividing the floor's extra time by lrec's lower rate overstated the floor.)
    per_s["lrec-floor"] = per_s["floor"]
    cost = costs(cpl, rates, per_s, statistics.median)
    perf_above, lrec_above = above(cost)
    nan = float("nan")
    paired = paired_ratios(cpl, rates, per_s)
    print(
        f"{label:<20} {cost['floor']:6.2f} {cost['perf']:6.2f} {perf_above:6.2f} "
        f"{cost['lrec-floor']:6.2f} {cost['lrec']:6.2f} {lrec_above:6.2f} "
        f"{lrec_above / perf_above if perf_above > 0 else nan:6.2f} "
        f"{cost['lrec'] / cost['perf'] if cost['perf'] > 0 else nan:6.2f} "
        f"{statistics.median(bpf) if bpf else nan:6.2f} "
        f"{statistics.median(per_s['lrec']):7.0f} {statistics.median(per_s['perf']):7.0f} "
        f"{statistics.median(per_s['floor']):7.0f} "
        f"{statistics.median(own['lrec']):6.2f} {statistics.median(own['perf']):6.2f} "
        f"{statistics.median(paired) if paired else nan:6.2f}",
        flush=True,
    )
    print(f"{'':<20} paired ratios by round: {' '.join(f'{r:.2f}' for r in paired)}", flush=True)


def costs(cpl, rates, per_s, pick):
    """Per mode: the target's extra CPU time per line over bare, times lines per second,
    over samples per second: the CPU time one sample costs the target (us), from the value
    pick takes of each mode's rounds (their median, or one round's)."""
    c0 = pick(cpl["bare"])
    return {
        mode: (pick(cpl[mode]) - c0) * pick(rates[mode]) / pick(per_s[mode]) / 1e3
        for mode in MODES[1:]
    }


def above(cost):
    """perf's and lrec's cost above each one's own floor."""
    return cost["perf"] - cost["floor"], cost["lrec"] - cost["lrec-floor"]


def paired_ratios(cpl, rates, per_s):
    """lrec's cost above its floor over perf's, from each round's own five windows (the
    machine's speed drifts over minutes: a round's windows lie within half a minute of one
    another). Rounds where perf's cost above its floor is not positive are left out."""
    out = []
    for r in range(len(cpl["bare"])):
        perf_above, lrec_above = above(costs(cpl, rates, per_s, lambda xs: xs[r]))
        if perf_above > 0:
            out.append(lrec_above / perf_above)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=6)
    ap.add_argument("--hz", type=int, default=10000)
    ap.add_argument("cases", nargs="+", metavar="LABEL=COMMAND")
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    # The kernel must not lower the sampling rate under us, and BPF counts its run time.
    # The rate can be written only while the kernel throttles (a percent other than 0 and
    # 100): a run that was killed leaves 0 behind, and the next one starts from 25 (the
    # kernel's default) instead of failing.
    old_pct = sysctl("kernel.perf_cpu_time_max_percent")
    if old_pct in ("0", "100"):
        old_pct = "25"
        sysctl("kernel.perf_cpu_time_max_percent", old_pct)
    old_rate = sysctl("kernel.perf_event_max_sample_rate", max(100000, args.hz))
    sysctl("kernel.perf_cpu_time_max_percent", 0)
    old_stats = sysctl("kernel.bpf_stats_enabled", 1)
    print(
        f"Per-sample cost on the target's CPU: {args.hz} Hz, {args.window:g} s windows, "
        f"{args.rounds} rounds, medians; us of the target's CPU time per sample.\n"
        "p-floor: perf record without call graphs; l-floor: lrec recording an idle process "
        "(its interrupt and the sampler's first check);\nabove: over each one's floor; "
        "ratio: lrec's above over perf's; total: lrec over perf dwarf, floors included; "
        "own: the profiler's own CPU; floor/s: perf's floor's ticks per second, lrec's floor's too;\n"
        "paired: the median over rounds of the ratio from each round's own windows"
    )
    print(
        f"{'target':<20} {'p-floor':>6} {'perf':>6} {'above':>6} {'l-floor':>6} {'lrec':>6} "
        f"{'above':>6} {'ratio':>6} {'total':>6} {'BPF':>6} {'lrec/s':>7} {'perf/s':>7} "
        f"{'floor/s':>7} "
        f"{'lown':>6} {'pown':>6} {'paired':>6}"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="lrec-cost-") as tmp:
            for case in args.cases:
                label, command = case.split("=", 1)
                measure(label, command, args, tmp)
    finally:
        sysctl("kernel.perf_cpu_time_max_percent", old_pct)
        sysctl("kernel.perf_event_max_sample_rate", old_rate)
        sysctl("kernel.bpf_stats_enabled", old_stats)


if __name__ == "__main__":
    main()

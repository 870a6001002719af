#!/usr/bin/env python3
"""The profiler's own CPU per sample at steady state (make bench, part 9; issue 23).

The target runs on CPU 1; `lrec -p` and `perf record -p --call-graph dwarf,16384` each
record it on CPU 0 for SECS seconds at HZ, one after the other. The profiler's CPU time
(user + system, summed over its threads from /proc/PID/task/*/schedstat, in ns) is read
at LEAD seconds, after start-up (attach, BPF load, the first /proc reads and binaries
embedded), and again just before the end: the difference, divided by the samples taken
meanwhile, is its steady-state cost per sample. Start-up is reported apart, as the CPU
used before LEAD; teardown (lrec's final flush and binary sections) is left out of both.
Median over ROUNDS rounds.

Usage: own_cpu.py [--rounds N] [--secs S] [--hz HZ] LABEL=COMMAND...
"""

import argparse
import glob
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from cost import LREC, lrec_counts, perf_counts
LEAD, TAIL = 4.0, 1.0


def cpu_ns(pid):
    """User + system time of every thread of `pid`, in ns (0 once it is gone)."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def run(cmd, args):
    """Runs a profiler; returns (CPU before LEAD, CPU between LEAD and the end - TAIL) in ns."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    time.sleep(LEAD)
    c0 = cpu_ns(p.pid)
    time.sleep(args.secs - LEAD - TAIL)
    c1 = cpu_ns(p.pid)
    steady = time.monotonic() - t0 - LEAD
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {err}")
    return c0, c1 - c0, steady


def lrec_round(pid, args, out):
    cmd = ["taskset", "-c", "0", LREC, "-q", "-p", str(pid), "-d", str(args.secs)]
    cmd += ["-F", str(args.hz), "-o", out]
    start, steady, secs = run(cmd, args)
    total, _, dur = lrec_counts(out)
    return start, steady / (total / dur * secs)


def perf_round(pid, args, out):
    cmd = ["taskset", "-c", "0", "perf", "record", "-q", "-F", str(args.hz), "-p", str(pid)]
    cmd += ["--call-graph", "dwarf,16384", "-o", out, "--", "sleep", str(args.secs)]
    start, steady, secs = run(cmd, args)
    samples, _ = perf_counts(out)
    return start, steady / (samples / args.secs * secs)


def measure(label, command, args, tmp):
    target = subprocess.Popen(
        ["taskset", "-c", "1"] + shlex.split(command),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(2)
    res = {"lrec": [], "perf": []}
    try:
        for r in range(args.rounds):
            for name in (["lrec", "perf"] if r % 2 == 0 else ["perf", "lrec"]):
                out = os.path.join(tmp, "o." + name)
                f = lrec_round if name == "lrec" else perf_round
                res[name].append(f(target.pid, args, out))
                os.remove(out)
    finally:
        target.kill()
        target.wait()
    med = {n: [statistics.median(x[i] for x in v) for i in (0, 1)] for n, v in res.items()}
    print(
        f"{label:<22} {med['lrec'][1] / 1e3:9.2f} {med['perf'][1] / 1e3:9.2f} "
        f"{med['lrec'][1] / med['perf'][1]:7.2f} "
        f"{med['lrec'][0] / 1e6:10.0f} {med['perf'][0] / 1e6:10.0f}",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=15)
    ap.add_argument("--hz", type=int, default=999)
    ap.add_argument("cases", nargs="+", metavar="LABEL=COMMAND")
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    print(
        f"Profiler's own CPU at steady state: {args.hz} Hz, {args.secs:g} s runs, "
        f"seconds {LEAD:g} to {args.secs - TAIL:g}, {args.rounds} rounds, medians"
    )
    print(
        f"{'target':<22} {'lrec us':>9} {'perf us':>9} {'ratio':>7} "
        f"{'lrec st ms':>10} {'perf st ms':>10}"
    )
    with tempfile.TemporaryDirectory(prefix="lrec-own-") as tmp:
        for case in args.cases:
            label, command = case.split("=", 1)
            measure(label, command, args, tmp)


if __name__ == "__main__":
    main()

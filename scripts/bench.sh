#!/usr/bin/env bash
# lrec vs perf, side by side on the same process at the same time (ratios, not absolute
# times: these machines are shared and noisy).
#   1. bytes per sample: lrec capture (embedded sections included) vs
#      `perf record --call-graph dwarf,16384 -z`
#   2. analysis throughput: `lanalyze --folded` vs `perf script`, samples per second.
#   1 and 2 record a 30 s native capture (NATIVE_SECS); ONLY=native runs just them.
#   3. Lua overhead, LuaJIT and PUC Lua (below). SKIP_NATIVE=1 or any other ONLY skips 1 and 2.
#   4. Off-CPU overhead. 5. Latency (uprobe) overhead. 6. JIT attribution vs luajit -jp
#      (ONLY=jp). 7. lrec's own CPU, peak memory and system calls in a big host (ONLY=host).
#   8. Per-sample cost on the target's own CPU beside perf's, floor subtracted (ONLY=cost).
#   9. The profilers' own CPU per sample at steady state, 999 and 4999 Hz, start-up apart, and
#      nginx's requests per second under each at 4999 Hz (ONLY=own).
#  10. A Lua heap snapshot of a ~230 MiB LuaJIT heap: time stopped, capture size, analysis (ONLY=heap).
#  11. lrec's memory over a 10-minute recording and flight recorder of a busy host (ONLY=soak).
#  12. What lrec runs when it meets a binary, on every ELF file of the machine: the number of
#      binaries, the slowest and the largest, failures and budgets run out (ONLY=sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
HZ=${HZ:-999}
NATIVE_SECS=${NATIVE_SECS:-30}
OUT=${OUT:-target/bench}
mkdir -p "$OUT"
rm -f "$OUT"/{lrec.lrec,perf.data}

now() { date +%s.%N; }
if [ -z "${SKIP_NATIVE:-}" ] && { [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = native ]; }; then
fixtures/build/native $((NATIVE_SECS + 4)) >/dev/null &
target=$!
trap 'kill $target 2>/dev/null || true' EXIT
sleep 0.5

./target/release/lrec -q -F "$HZ" -d "$NATIVE_SECS" -p "$target" -o "$OUT/lrec.lrec" &
lrec=$!
perf record -q -F "$HZ" --call-graph dwarf,16384 -z -p "$target" -o "$OUT/perf.data" -- sleep "$NATIVE_SECS" 2>/dev/null &
perf=$!
wait $lrec $perf
kill $target 2>/dev/null || true

# Best of $RUNS wall-clock times of a command, in seconds (the least disturbed run).
best_of() {
  local best=""
  for _ in $(seq "$RUNS"); do
    local t0 t1
    t0=$(now)
    "$@" >/dev/null 2>&1
    t1=$(now)
    best=$(awk -v a="$t0" -v b="$t1" -v best="$best" 'BEGIN { d = b - a; print (best == "" || d < best) ? d : best }')
  done
  echo "$best"
}
RUNS=${RUNS:-3}

lrec_bytes=$(stat -c %s "$OUT/lrec.lrec")
./target/release/lanalyze "$OUT/lrec.lrec" --folded --offline >"$OUT/lrec.folded" 2>/dev/null
lrec_samples=$(awk '{s += $NF} END {print s}' "$OUT/lrec.folded")
lt=$(best_of ./target/release/lanalyze "$OUT/lrec.lrec" --folded --offline)

perf_bytes=$(stat -c %s "$OUT/perf.data")
perf_samples=$(perf script -i "$OUT/perf.data" -F tid 2>/dev/null | wc -l)
pt=$(best_of perf script -i "$OUT/perf.data")

awk -v lb="$lrec_bytes" -v ls="$lrec_samples" -v lt="$lt" \
    -v pb="$perf_bytes" -v ps="$perf_samples" -v pt="$pt" \
    -v hz="$HZ" -v secs="$NATIVE_SECS" -v runs="$RUNS" 'BEGIN {
  printf "workload: fixtures/build/native (2 busy threads), %d Hz, %d s, lrec and perf at once\n", hz, secs
  printf "analysis: lanalyze --folded --offline vs perf script, best of %d runs each\n\n", runs
  printf "%-28s %14s %14s %10s\n", "", "lrec", "perf", "lrec/perf"
  printf "%-28s %14d %14d\n", "samples", ls, ps
  printf "%-28s %14d %14d %10.2f\n", "capture bytes", lb, pb, lb / pb
  printf "%-28s %14.0f %14.0f %10.2f  (target <= 0.8)\n", "bytes/sample", lb / ls, pb / ps, (lb / ls) / (pb / ps)
  printf "%-28s %14.2f %14.2f\n", "analysis seconds", lt, pt
  printf "%-28s %14.0f %14.0f %10.1f  (target >= 20)\n", "analysis samples/s", ls / lt, ps / pt, (ls / lt) / (ps / pt)
}'

fi

# 3. Overhead on Lua (issues #6, #7): a fixed-work run of chains.lua under LuaJIT (JIT on
#    and -joff) and under Debian's lua5.4, bare, under `lrec -F 999` and under
#    `perf record --call-graph dwarf,16384 -F 999`, alternating, whole-command wall time; the
#    median of $LUA_RUNS runs each. With kernel.bpf_stats_enabled lrec also reports its BPF
#    program's cost per sample. Then the same attached: the target's own wall time, from its
#    start to its exit, bare and with `lrec -p` or `perf record -p` attached right after it
#    started (the profilers' own start-up and teardown then run beside it, not before and
#    after it). ONLY=luajit or ONLY=puc runs one of them; ONLY=offcpu only section 4, ONLY=latency
#    only section 5.
LUA_RUNS=${LUA_RUNS:-5}
CHAINS=fixtures/workloads/lua/chains.lua
CASES=()
case "${ONLY:-}" in native|offcpu|latency|jp|host|cost|own|heap|soak) LUA_CASES=0 ;; *) LUA_CASES=1 ;; esac
[ "$LUA_CASES" = 1 ] && [ "${ONLY:-}" != puc ] && CASES+=("luajit jit on|fixtures/bin/luajit-gc64|12000" "luajit -joff|fixtures/bin/luajit-gc64 -joff|8000")
[ "$LUA_CASES" = 1 ] && [ "${ONLY:-}" != luajit ] && command -v lua5.4 >/dev/null && CASES+=("lua5.4|lua5.4|5000")
[ "${ONLY:-}" = offcpu ] && CASES=()
wall() { local t0 t1; t0=$(now); "$@" >/dev/null 2>&1; t1=$(now); awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
old_stats=$(sysctl -n kernel.bpf_stats_enabled 2>/dev/null || echo 0)
sysctl -qw kernel.bpf_stats_enabled=1 2>/dev/null || true
[ ${#CASES[@]} -gt 0 ] && echo &&
printf "Lua overhead: %s, fixed work, %d runs each, alternating, median wall time\n" "$CHAINS" "$LUA_RUNS"
[ ${#CASES[@]} -gt 0 ] && printf "%-14s %10s %10s %10s %12s %12s %14s\n" "runtime" "bare s" "lrec s" "perf s" "lrec slowdown" "perf slowdown" "BPF us/sample"
for case in "${CASES[@]}"; do
  IFS='|' read -r label cmd rounds <<<"$case"
  : >"$OUT/bare.t"; : >"$OUT/lrec.t"; : >"$OUT/perf.t"; : >"$OUT/bpf.t"
  for _ in $(seq "$LUA_RUNS"); do
    wall $cmd $CHAINS 0 "$rounds" >>"$OUT/bare.t"
    t0=$(now)
    ./target/release/lrec -F 999 -o "$OUT/lua.lrec" -- $cmd $CHAINS 0 "$rounds" >/dev/null 2>"$OUT/lrec.err"
    t1=$(now); awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }' >>"$OUT/lrec.t"
    grep 'BPF sampler' "$OUT/lrec.err" | grep -o '[0-9.]* us per sample' | awk '{print $1}' >>"$OUT/bpf.t" || true
    wall perf record -q -F 999 --call-graph dwarf,16384 -o "$OUT/lua.perf" -- $cmd $CHAINS 0 "$rounds" >>"$OUT/perf.t"
  done
  b=$(median <"$OUT/bare.t"); l=$(median <"$OUT/lrec.t"); p=$(median <"$OUT/perf.t")
  c=$( [ -s "$OUT/bpf.t" ] && median <"$OUT/bpf.t" || echo "-")
  awk -v m="$label" -v b="$b" -v l="$l" -v p="$p" -v c="$c" 'BEGIN {
    printf "%-14s %10.3f %10.3f %10.3f %11.1f%% %11.1f%% %14s\n", m, b, l, p, 100 * (l / b - 1), 100 * (p / b - 1), c }'
done

# The target's wall time with a profiler (none, lrec, perf) attached after it started.
attached() {
  local tool=$1 cmd=$2 rounds=$3 t0 t1 pid rp=""
  t0=$(now)
  $cmd $CHAINS 0 "$rounds" >/dev/null 2>&1 &
  pid=$!
  case $tool in
    lrec) ./target/release/lrec -q -F 999 -p "$pid" -o "$OUT/att.lrec" >/dev/null 2>&1 & rp=$! ;;
    perf) perf record -q -F 999 --call-graph dwarf,16384 -p "$pid" -o "$OUT/att.perf" >/dev/null 2>&1 & rp=$! ;;
  esac
  wait "$pid"
  t1=$(now)
  [ -n "$rp" ] && wait "$rp"
  awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'
}
[ ${#CASES[@]} -gt 0 ] && echo &&
printf "Lua overhead, attached: the target's own wall time, %d runs each, alternating, median\n" "$LUA_RUNS"
[ ${#CASES[@]} -gt 0 ] && printf "%-14s %10s %10s %10s %12s %12s\n" "runtime" "bare s" "lrec s" "perf s" "lrec slowdown" "perf slowdown"
for case in "${CASES[@]}"; do
  IFS='|' read -r label cmd rounds <<<"$case"
  : >"$OUT/bare.t"; : >"$OUT/lrec.t"; : >"$OUT/perf.t"
  for _ in $(seq "$LUA_RUNS"); do
    for tool in bare lrec perf; do attached "$tool" "$cmd" "$rounds" >>"$OUT/$tool.t"; done
  done
  b=$(median <"$OUT/bare.t"); l=$(median <"$OUT/lrec.t"); p=$(median <"$OUT/perf.t")
  awk -v m="$label" -v b="$b" -v l="$l" -v p="$p" 'BEGIN {
    printf "%-14s %10.3f %10.3f %10.3f %11.1f%% %11.1f%%\n", m, b, l, p, 100 * (l / b - 1), 100 * (p / b - 1) }'
done

# 4. Off-CPU overhead (issue 10): fixtures/build/pingpong, two threads passing a byte over
#    pipes, each block far shorter than --off-cpu-min, a fixed number of rounds: with no
#    work between switches (~130 k context switches/s, the worst case) and with WORK steps
#    of computation per message (a server-like mix, ~55-60 k switches/s); bare, under `lrec`
#    (CPU samples only) and under `lrec --off-cpu`, both at their defaults, alternating,
#    whole-command wall time, median of $OFF_RUNS; then what lrec --off-cpu counted and
#    recorded, and its BPF programs' cost.
OFF_RUNS=${OFF_RUNS:-5}
if [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = offcpu ]; then
  echo
  echo "Off-CPU overhead: fixtures/build/pingpong ROUNDS [WORK], $OFF_RUNS runs each, alternating, median wall time"
  printf "%-28s %10s %10s %10s %14s %14s\n" "" "bare s" "lrec s" "--off-cpu s" "lrec slowdown" "--off-cpu slowdown"
  for spec in "${PP_IDLE:-600000 0}" "${PP_WORK:-300000 8000}"; do
    # shellcheck disable=SC2086 # ROUNDS WORK, split on purpose
    set -- $spec
    : >"$OUT/bare.t"; : >"$OUT/lrec.t"; : >"$OUT/off.t"
    # The kernel's BPF run-time accounting costs two clock reads per program run: off while
    # timing, on for the run that reports the programs' cost.
    sysctl -qw kernel.bpf_stats_enabled=0 2>/dev/null || true
    for _ in $(seq "$OFF_RUNS"); do
      wall fixtures/build/pingpong "$@" >>"$OUT/bare.t"
      wall ./target/release/lrec -q -o "$OUT/pp.lrec" -- fixtures/build/pingpong "$@" >>"$OUT/lrec.t"
      wall ./target/release/lrec -q --off-cpu -o "$OUT/ppoff.lrec" -- fixtures/build/pingpong "$@" >>"$OUT/off.t"
    done
    b=$(median <"$OUT/bare.t"); l=$(median <"$OUT/lrec.t"); o=$(median <"$OUT/off.t")
    rate=$(fixtures/build/pingpong 50000 "$2" | grep -o '([0-9]*/s)')
    awk -v m="pingpong $1 $2 $rate" -v b="$b" -v l="$l" -v o="$o" 'BEGIN {
      printf "%-28s %10.3f %10.3f %10.3f %13.1f%% %13.1f%%\n", m, b, l, o, 100 * (l / b - 1), 100 * (o / b - 1) }'
    sysctl -qw kernel.bpf_stats_enabled=1 2>/dev/null || true
    ./target/release/lrec --off-cpu -o "$OUT/ppoff.lrec" -- fixtures/build/pingpong "$@" 2>&1 >/dev/null | grep -E 'off-CPU|BPF' || true
  done
fi
# 5. Latency overhead (issue 11): fixtures/build/latency hot, a function called hundreds of
#    millions of times a second, counting its calls each second: bare, under
#    `lrec --latency tiny` (the default --latency-max-rate stops probing it within a second)
#    and with no limit; the median calls/s over seconds 3 to LAT_SECS (after the cap), and
#    with no limit the cost per call. Then node's loop: immediates of 1 ms run in 4 s of
#    fixtures/workloads/node/loop.js, bare and under `lrec --node-loop`.
LAT_SECS=${LAT_SECS:-8}
if [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = latency ]; then
  sysctl -qw kernel.bpf_stats_enabled=0 2>/dev/null || true
  echo
  echo "Latency overhead: fixtures/build/latency hot $LAT_SECS, median calls/s over seconds 3..$LAT_SECS"
  rates() { grep -o 'calls/s [0-9]*' | awk 'NR >= 3 { print $2 }' | median; }
  bare=$(fixtures/build/latency hot "$LAT_SECS" | rates)
  capped=$(./target/release/lrec -q --latency tiny -o "$OUT/lat.lrec" -- fixtures/build/latency hot "$LAT_SECS" 2>/dev/null | rates)
  unlimited=$(./target/release/lrec -q --latency tiny --latency-max-rate 0 -o "$OUT/lat0.lrec" -- fixtures/build/latency hot "$LAT_SECS" 2>/dev/null | rates)
  awk -v b="$bare" -v c="$capped" -v u="$unlimited" 'BEGIN {
    printf "%-44s %16.0f\n", "bare calls/s", b
    printf "%-44s %16.0f %+9.1f%%\n", "lrec --latency tiny (capped) calls/s", c, 100 * (c / b - 1)
    printf "%-44s %16.0f %+9.1f%%  %.2f us per call\n", "lrec --latency tiny --latency-max-rate 0", u, 100 * (u / b - 1), 1e6 / u - 1e6 / b }'
  node_imm() { grep -o 'truth check calls=[0-9]*' | grep -o '[0-9]*$'; }
  if command -v node >/dev/null; then
    nb=$(node fixtures/workloads/node/loop.js 4 | node_imm)
    nl=$(./target/release/lrec -q --node-loop -o "$OUT/node.lrec" -- node fixtures/workloads/node/loop.js 4 2>/dev/null | node_imm)
    awk -v b="$nb" -v l="$nl" 'BEGIN { printf "%-44s %16d %16d %+9.1f%%\n", "node loop.js 4: 1 ms immediates, bare/--node-loop", b, l, 100 * (l / b - 1) }'
    ./target/release/lanalyze "$OUT/node.lrec" --latency 2>/dev/null | sed -n '/Node.js event loop/,$p' | head -20
  fi
fi

# 6. JIT-compiled Lua vs LuaJIT's own profiler (issue 8): fixtures/workloads/lua/inlined.lua
#    (run's loop calls hash, which calls mix twice; both are inlined into run's trace) under
#    `luajit -jp=f` and `-jp=l` and under `lrec -F 999 --`: the share of samples per leaf Lua
#    function and per line, side by side, with Debian's luajit and the fixtures' GC64 and
#    GC32 builds (their -jp uses the jit/*.lua of their own build tree). -jp compiles other traces than the
#    process runs without it: a profiling guard and a snapshot at every function (-jp=f) or
#    line (-jp=l) change; lrec reads the traces as they are.
JP_SECS=${JP_SECS:-6}
if [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = jp ]; then
  # "NN%  KEY" lines of -jp (or of lrec's shares, printed the same way) into "KEY NN".
  jp_shares() { awk '$1 ~ /%$/ { sub(/%/, "", $1); print $2, $1 }'; }
  # Leaf Lua frame of each folded stack: by function ($1 = f) or by chunk:line ($1 = l).
  lrec_shares() {
    awk -v by="$1" '{ n = $NF; $NF = ""; k = split($0, f, ";"); leaf = ""
      for (i = k; i >= 1; i--) if (f[i] ~ /\.lua:[0-9]+@[0-9]+ *$/) { leaf = f[i]; break }
      if (leaf == "") next
      split(leaf, w, " "); sub(/ *$/, "", w[2]); m = split(w[2], p, "/"); split(p[m], q, "@")
      sub(/:[0-9]+$/, "", q[1]); key = (by == "f") ? w[1] : q[1] ":" q[2]
      c[key] += n; t += n }
      END { for (key in c) printf "%s %.1f\n", key, 100 * c[key] / t }'
  }
  for lj in /usr/bin/luajit fixtures/bin/luajit-gc64 fixtures/bin/luajit-gc32; do
    [ -x "$lj" ] || continue
    case $lj in
      /usr/bin/*) JP_LIB=$(ls -d /usr/share/luajit-2.1*/ 2>/dev/null | head -1) ;;
      *) JP_LIB=fixtures/build/$(basename "$lj")/src/ ;;
    esac
    ./target/release/lrec -q -F 999 -o "$OUT/jp.lrec" -- "$lj" fixtures/workloads/lua/inlined.lua "$JP_SECS" >/dev/null 2>&1
    for mode in f l; do
      LUA_PATH="${JP_LIB}?.lua;;" "$lj" -jp="$mode" fixtures/workloads/lua/inlined.lua "$JP_SECS" 2>&1 | jp_shares >"$OUT/jp.$mode"
      ./target/release/lanalyze "$OUT/jp.lrec" --folded --lines 2>/dev/null | lrec_shares "$mode" >"$OUT/lrec.$mode"
      echo
      echo "$lj inlined.lua, -jp=$mode vs lrec (% of samples with a Lua leaf)"
      printf "%-22s %8s %8s %8s\n" "$([ $mode = f ] && echo function || echo line)" "-jp" "lrec" "diff"
      awk 'FNR == NR { jp[$1] = $2; k[$1] = 1; next } { lr[$1] = $2; k[$1] = 1 }
        END { for (x in k) if (jp[x] + lr[x] >= 1) { d = lr[x] - jp[x]; if (d < 0) d = -d; if (d > m) m = d
                printf "%-22s %8.1f %8.1f %8.1f\n", x, jp[x], lr[x], lr[x] - jp[x] }
              printf "%-22s %26.1f points\n", "largest difference", m }' "$OUT/jp.$mode" "$OUT/lrec.$mode"
    done
    ./target/release/lanalyze "$OUT/jp.lrec" --info 2>/dev/null | grep 'in traces'
  done
fi

# 7. lrec's own cost in a big host (issue 27): tshark running a Lua tap
#    (fixtures/workloads/hosts/tshark.lua, Lua 5.2 from a shared library among ~60 mapped
#    libraries, libwireshark's 110 MB among them). `lrec -p -d HOST_SECS` and
#    `perf record -p --call-graph dwarf,16384 -- sleep HOST_SECS`, one after the other on the
#    same process, $HOST_RUNS times each: their own CPU time (user + system, /usr/bin/time)
#    and peak RSS, medians; then lrec's system calls per sample (strace -c, one run).
HOST_SECS=${HOST_SECS:-5}
HOST_RUNS=${HOST_RUNS:-3}
if { [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = host ]; } && command -v tshark >/dev/null; then
  python3 - "$OUT/udp.pcap" <<'PY'
import struct, sys
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<IHHiIII', 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1))
    for i in range(400000):
        udp = struct.pack('>HHHH', 1000 + i % 50, 2000, 40, 0) + bytes([i & 0xff]) * 32
        ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), i & 0xffff, 0, 64, 17, 0,
                         bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])) + udp
        eth = bytes(range(6)) + bytes([0, 1, 2, 3, 4, 6, 8, 0]) + ip
        f.write(struct.pack('<IIII', i // 1000, i % 1000 * 1000, len(eth), len(eth)) + eth)
PY
  tshark -r "$OUT/udp.pcap" -q -X lua_script:fixtures/workloads/hosts/tshark.lua >/dev/null 2>&1 &
  host=$!
  sleep 2
  median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  : >"$OUT/host.lrec.cost"; : >"$OUT/host.perf.cost"
  for _ in $(seq "$HOST_RUNS"); do
    /usr/bin/time -f "%U %S %M" -o "$OUT/t" ./target/release/lrec -q -F 499 -d "$HOST_SECS" -p "$host" -o "$OUT/host.lrec" >/dev/null 2>&1
    cat "$OUT/t" >>"$OUT/host.lrec.cost"
    /usr/bin/time -f "%U %S %M" -o "$OUT/t" perf record -q -F 499 --call-graph dwarf,16384 -p "$host" -o "$OUT/host.data" -- sleep "$HOST_SECS" >/dev/null 2>&1
    cat "$OUT/t" >>"$OUT/host.perf.cost"
  done
  echo
  echo "7. lrec's own cost in tshark with a Lua tap, ${HOST_SECS} s at 499 Hz (median of $HOST_RUNS)"
  printf "%-34s %12s %12s\n" "" "CPU (s)" "peak RSS (MB)"
  for who in lrec perf; do
    cpu=$(awk '{ print $1 + $2 }' "$OUT/host.$who.cost" | median)
    rss=$(awk '{ print $3 / 1024 }' "$OUT/host.$who.cost" | median)
    printf "%-34s %12.2f %12.1f\n" "$([ $who = lrec ] && echo "lrec" || echo "perf record --call-graph dwarf")" "$cpu" "$rss"
  done
  if command -v strace >/dev/null; then
    strace -f -c -o "$OUT/strace" ./target/release/lrec -q -F 499 -d "$HOST_SECS" -p "$host" -o "$OUT/host.lrec" >/dev/null 2>&1
    calls=$(awk '$NF == "total" { print $4 }' "$OUT/strace")
    samples=$(./target/release/lanalyze "$OUT/host.lrec" --info 2>/dev/null | awk '/^  total:/ { print $2; exit }')
    echo "lrec system calls: $calls for $samples samples ($(awk -v c="$calls" -v s="$samples" 'BEGIN { printf "%.2f", c / s }') per sample, start-up included)"
    sort -k4 -nr "$OUT/strace" | awk 'NR > 2 && NF >= 5 && $NF != "total" { print "  " $NF, $4 }' | head -6
  fi
  ./target/release/lanalyze "$OUT/host.lrec" --info 2>/dev/null | grep -E 'duration:|Lua 5'
  kill $host 2>/dev/null || true
fi

# 8. What each sample costs the target on its own CPU (issue 23): scripts/cost.py. The
#    target (fixtures/workloads/lua/cost.lua or fixtures/build/cost: a chain of DEPTH frames
#    doing fixed work, printing its progress) on CPU 1, the profilers and the progress reader
#    on CPU 0, COST_HZ sampling (40 kHz: at 10 kHz this machine's noise was as large as
#    the costs), alternating COST_WINDOW s windows bare / lrec -p / lrec -p of an idle
#    process (lrec's floor) / perf record -p --call-graph dwarf,16384 / perf record -p
#    (perf's floor), COST_ROUNDS rounds, medians of the target's CPU time per line of
#    progress. ONLY=cost runs this part only.
# Parts 8 and 9's targets: LABEL=COMMAND, a chain of DEPTH distinct functions each.
COST=fixtures/workloads/lua/cost.lua
cases=()
for depth in 20 200; do
  cases+=("luajit jit on, $depth=fixtures/bin/luajit-gc64 $COST $depth"
          "luajit -joff, $depth=fixtures/bin/luajit-gc64 -joff $COST $depth"
          "lua5.4, $depth=fixtures/bin/lua5.4-static $COST $depth"
          "native, $depth=fixtures/build/cost $depth")
done
if { [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = cost ]; } && [ "$(nproc)" -ge 2 ]; then
  echo
  python3 scripts/cost.py --rounds "${COST_ROUNDS:-3}" --window "${COST_WINDOW:-5}" \
    --hz "${COST_HZ:-40000}" "${cases[@]}"
  # The BPF sampler's own time per sample, from the kernel's accounting (scripts/bpf_cost.sh),
  # median of 3 runs: steadier than the slowdown above.
  echo
  printf "lrec's BPF time per sample at 4999 Hz (kernel.bpf_stats_enabled), median of 3\n"
  for c in "${cases[@]}"; do
    label=${c%%=*}
    read -r -a cmd <<<"${c#*=}"
    t=$(for _ in 1 2 3; do scripts/bpf_cost.sh -- "${cmd[@]}"; done | median)
    printf "%-24s %8s us\n" "$label" "$t"
  done
fi

# 9. lrec's own CPU per sample at steady state against perf record's (scripts/own_cpu.py):
#    the same targets, 999 and 4999 Hz, the profiler's CPU from its 4th second to its last
#    but one, start-up (the CPU before) reported apart; then nginx + lua under wrk, bare and
#    recorded by each at 4999 Hz, interleaved (scripts/nginx_load.sh). ONLY=own: this part.
if { [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = own ]; } && [ "$(nproc)" -ge 2 ]; then
  echo
  python3 scripts/own_cpu.py --rounds "${OWN_ROUNDS:-3}" --secs "${OWN_SECS:-12}" "${cases[@]}"
  python3 scripts/own_cpu.py --rounds "${OWN_ROUNDS:-3}" --secs "${OWN_SECS:-12}" --hz 4999 "${cases[@]}"
  # What a busy server loses to each profiler at 4999 Hz: nginx + lua under wrk (issue 40).
  echo
  scripts/nginx_load.sh -F 4999 -w "${NGINX_WINDOW:-8}" -r "${NGINX_ROUNDS:-3}"
fi

# 10. A Lua heap snapshot of a ~230 MiB LuaJIT heap (scripts/heap_bench.sh): the time the
#     process stood stopped (--freeze), the capture's size and the analysis time.
if [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = heap ]; then
  echo
  scripts/heap_bench.sh
fi

# 11. lrec's memory over a long recording (issue 40; scripts/soak.sh): a busy
#     multi-threaded Lua host (fixtures/workloads/churn.c with LuaJIT: 4 threads, each
#     request a new VM) recorded at 999 Hz for SOAK_SECS (600), then its flight recorder for
#     as long; lrec's RSS at minute 1, at the end and its peak. ONLY=soak runs this part only.
if [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = soak ]; then
  soak=${SOAK_SECS:-600}
  echo
  scripts/soak.sh -s "$soak" -- fixtures/bin/churn-luajit $((soak + 30)) 4 3
  scripts/soak.sh -s "$soak" --flight -- fixtures/bin/churn-luajit $((soak + 30)) 4 3
fi

# 12. The sweep (inspect/examples/sweep.rs, issue 53): identification, layout learning, the
#     proto-free search and the embedding, one child process per ELF file under /usr and
#     /opt (and the fixtures' and lupa's Lua binaries), each within 30 s and 2 GiB.
if [ -z "${ONLY:-}" ] || [ "${ONLY:-}" = sweep ]; then
  echo
  echo "== 12. the sweep: every ELF file met as lrec meets it"
  ./target/release/examples/sweep --list "$OUT/sweep.tsv" /usr /opt fixtures/bin \
    fixtures/build/lupa/lib > "$OUT/sweep.txt" || true
  # The summary, the slowest and the largest, and what failed or ran out (the binaries
  # holding Lua are in $OUT/sweep.txt).
  sed '/^Lua:/,$d' "$OUT/sweep.txt"
fi
sysctl -qw kernel.bpf_stats_enabled="$old_stats" 2>/dev/null || true

#!/usr/bin/env bash
# make bench part 10 (ONLY=heap): a Lua heap snapshot of a big LuaJIT heap.
# fixtures/workloads/lua/heap.lua builds HEAP_STRINGS (1,500,000) strings of 100 bytes
# (~230 MiB of objects) under fixtures/bin/luajit-gc64; then, ROUNDS (3) times each,
# `lrec -p PID --lua-heap --freeze` (the time the process stood stopped, as lrec reports
# it, lrec's wall time and peak memory) and `lanalyze --heap` on the capture (wall time,
# peak memory). Prints the medians and the capture's size.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${HEAP_STRINGS:-1500000}
rounds=${ROUNDS:-3}
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
fixtures/bin/luajit-gc64 fixtures/workloads/lua/heap.lua "$n" 100 0 "$dir/never" >"$dir/out" &
pid=$!
until grep -q "ready 1" "$dir/out"; do sleep 0.2; done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
stopped=() lrec_s=() lrec_kb=() an_s=() an_kb=()
for _ in $(seq "$rounds"); do
  /usr/bin/time -f "%e %M" -o "$dir/t" target/release/lrec -p "$pid" --lua-heap --freeze \
    -o "$dir/heap.lrec" 2>"$dir/lrec.err"
  stopped+=("$(grep -o 'stopped [0-9.]* ms' "$dir/lrec.err" | awk '{print $2}')")
  read -r s kb <"$dir/t"; lrec_s+=("$s"); lrec_kb+=("$kb")
  /usr/bin/time -f "%e %M" -o "$dir/t" target/release/lanalyze "$dir/heap.lrec" --heap \
    >"$dir/report"
  read -r s kb <"$dir/t"; an_s+=("$s"); an_kb+=("$kb")
done
grep -E "copied|census" "$dir/report"
echo "heap snapshot, median of $rounds: process stopped $(printf '%s\n' "${stopped[@]}" | median) ms;" \
  "lrec $(printf '%s\n' "${lrec_s[@]}" | median) s, peak $(( $(printf '%s\n' "${lrec_kb[@]}" | median) / 1024 )) MiB;" \
  "capture $(( $(stat -c %s "$dir/heap.lrec") / 1048576 )) MiB;" \
  "lanalyze --heap $(printf '%s\n' "${an_s[@]}" | median) s, peak $(( $(printf '%s\n' "${an_kb[@]}" | median) / 1024 )) MiB"

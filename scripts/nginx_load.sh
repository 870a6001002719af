#!/bin/bash
# What recording costs a busy server (make bench, part 9; issue 40): nginx with the lua
# module (fixtures/nginx: two workers, every request Lua work) under wrk, its requests per
# second in windows of WINDOW seconds, bare, recorded by `lrec -p MASTER` (the workers come
# along) and by `perf record --call-graph dwarf,16384 -p MASTER,WORKERS`, both at HZ,
# interleaved over ROUNDS rounds (the order rotating), each window starting 4 s into the
# recording. Prints the median requests per second of each and the loss of each profiler
# against bare.
#
# Usage: scripts/nginx_load.sh [-F HZ] [-w WINDOW] [-r ROUNDS]
set -euo pipefail
hz=4999 window=8 rounds=3 lead=4
while [ $# -gt 0 ]; do
  case "$1" in
    -F) hz=$2; shift 2 ;;
    -w) window=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    *) echo "usage: $0 [-F HZ] [-w WINDOW] [-r ROUNDS]" >&2; exit 2 ;;
  esac
done
for tool in nginx wrk perf; do
  command -v "$tool" >/dev/null || { echo "nginx_load: $tool is not installed" >&2; exit 1; }
done
lrec=./target/release/lrec
port=18480
prefix=$(mktemp -d)
trap 'nginx -p "$prefix" -c "$prefix/nginx.conf" -s stop 2>/dev/null || true; sleep 0.5; rm -rf "$prefix"' EXIT
mkdir -p "$prefix/tmp" "$prefix/lua"
cp fixtures/nginx/lua/*.lua "$prefix/lua/"
sed "s|@PREFIX@|$prefix|g; s|@PORT@|$port|g" fixtures/nginx/nginx.conf >"$prefix/nginx.conf"
nginx -p "$prefix" -c "$prefix/nginx.conf"
for _ in $(seq 50); do [ -s "$prefix/nginx.pid" ] && break; sleep 0.1; done
master=$(cat "$prefix/nginx.pid")
workers=$(pgrep -P "$master" | paste -sd,)
url="http://127.0.0.1:$port/"
curl -sf "$url" >/dev/null || { echo "nginx_load: nginx does not answer on $url" >&2; exit 1; }
wrk -t2 -c8 -d2s "$url" >/dev/null # warm-up

# One window: wrk's requests per second while MODE records (or not).
window_rps() {
  local mode=$1 prof=
  case "$mode" in
    lrec) "$lrec" -q -p "$master" -F "$hz" -d $((window + lead + 1)) -o "$prefix/c.lrec" 2>/dev/null & prof=$! ;;
    perf) perf record -q -F "$hz" --call-graph dwarf,16384 -p "$master,$workers" \
            -o "$prefix/perf.data" -- sleep $((window + lead + 1)) 2>/dev/null & prof=$! ;;
  esac
  # The profiler's start (BPF load, attach; lrec's copies of the binaries' sections) is
  # left out of the window: its steady state is what a server pays for a long recording.
  [ -n "$prof" ] && sleep "$lead"
  wrk -t2 -c8 -d"${window}s" "$url" | awk '/^Requests\/sec:/ { print $2 }'
  [ -n "$prof" ] && { wait "$prof" 2>/dev/null || true; }
  rm -f "$prefix/c.lrec" "$prefix/perf.data"
}

modes=(bare lrec perf)
declare -A rps
for r in $(seq "$rounds"); do
  for i in 0 1 2; do
    m=${modes[$(((i + r) % 3))]}
    rps[$m]+="$(window_rps "$m") "
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
bare=$(echo "${rps[bare]}" | median)
echo "nginx + lua, 2 workers under wrk -t2 -c8, ${window} s windows, $rounds rounds at $hz Hz (medians, req/s):"
printf "  %-6s %10s %8s   windows: %s\n" bare "$bare" "" "${rps[bare]}"
for m in lrec perf; do
  v=$(echo "${rps[$m]}" | median)
  printf "  %-6s %10s %7.1f%%   windows: %s\n" "$m" "$v" "$(echo "100 * ($bare - $v) / $bare" | bc -l)" "${rps[$m]}"
done

#!/bin/bash
# lrec's memory over a long recording (make bench, part 11; issue 40): `lrec -p` of COMMAND
# at 999 Hz for SECS seconds (or its flight recorder, keeping the last 30 s: --flight),
# lrec's resident memory (VmRSS) read every 10 s. Prints it at minute 1, at the end and
# its peak, and the growth after minute 1 (the issue's bound: 10 %).
#
# Usage: scripts/soak.sh [-s SECS] [--flight] -- COMMAND ARGS...
set -euo pipefail
lrec=${LREC:-./target/release/lrec} secs=600 flight=
while [ $# -gt 0 ]; do
  case "$1" in
    -s) secs=$2; shift 2 ;;
    --flight) flight=1; shift ;;
    --) shift; break ;;
    *) echo "usage: $0 [-s SECS] [--flight] -- COMMAND ARGS..." >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] && [ "$secs" -ge 70 ] ||
  { echo "usage: $0 [-s SECS (70 or more)] [--flight] -- COMMAND ARGS..." >&2; exit 2; }
out=$(mktemp -d)
"$@" >/dev/null 2>&1 &
target=$!
trap 'kill $target $rec 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$out"' EXIT
sleep 1
if [ -n "$flight" ]; then
  "$lrec" -q -p "$target" -F 999 --flight 30 -o "$out/c.lrec" 2>"$out/err" &
else
  "$lrec" -q -p "$target" -F 999 -d "$secs" -o "$out/c.lrec" 2>"$out/err" &
fi
rec=$!
rss() { awk '/^VmRSS:/ { print $2 / 1024 }' "/proc/$rec/status" 2>/dev/null; }
: >"$out/rss"
for ((t = 10; t < secs; t += 10)); do
  sleep 10
  kill -0 "$rec" 2>/dev/null || break
  echo "$t $(rss)" >>"$out/rss"
done
[ -n "$flight" ] && kill -INT "$rec"
wait "$rec" || { echo "soak: lrec failed:" >&2; cat "$out/err" >&2; exit 1; }
awk -v what="$([ -n "$flight" ] && echo "flight recorder (--flight 30)" || echo "recording")" \
    -v secs="$secs" '
  $1 == 60 { m1 = $2 } { last = $2; if ($2 > peak) peak = $2 }
  $1 % 60 == 0 { minutes = minutes sprintf(" %.1f", $2) }
  END {
    printf "lrec %s, %d s at 999 Hz: RSS %.1f MB at minute 1, %.1f MB at the end, peak %.1f MB: %+.1f %% after minute 1 (each minute, MB:%s)\n",
      what, secs, m1, last, peak, 100 * (last - m1) / m1, minutes
  }' "$out/rss"

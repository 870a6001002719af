#!/usr/bin/env bash
# Opens lanalyze's shareable outputs in the real apps (headless Chromium; speedscope's web
# app from its npm package; the Firefox Profiler if FFP_DIST names a build of it) and checks
# them: scripts/check_apps.mjs says what. Records `fixtures/bin/lua-host 4 3` (LuaJIT on
# three threads; root: BPF) twice for the outputs and the diff, unless CAPTURE and
# CAPTURE2 are given. Installs Chromium (Debian) and the npm packages on first use.
#
#   sudo scripts/check_apps.sh                 # outputs and screenshots in target/apps/out
#   FFP_DIST=/path/to/profiler/dist sudo scripts/check_apps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
APPS=target/apps
OUT=$APPS/out
mkdir -p "$OUT"

if ! command -v chromium >/dev/null; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -d "$APPS/node_modules/speedscope" ] || [ ! -d "$APPS/node_modules/playwright-core" ]; then
	(cd "$APPS" && { [ -f package.json ] || npm init -y >/dev/null; } &&
		npm install --no-audit --no-fund speedscope@1.25.0 playwright-core@1.65.1 >/dev/null)
fi

LREC=target/release/lrec
LANALYZE=target/release/lanalyze
if [ -z "${CAPTURE:-}" ]; then
	CAPTURE=$OUT/lua-host.lrec
	CAPTURE2=$OUT/lua-host-2.lrec
	$LREC -q -F 499 -o "$CAPTURE" -- fixtures/bin/lua-host 4 3
	$LREC -q -F 499 -o "$CAPTURE2" -- fixtures/bin/lua-host 4 3
fi
$LANALYZE "$CAPTURE" --flamegraph --force -o "$OUT/flamegraph.svg"
$LANALYZE --diff "$CAPTURE" "${CAPTURE2:-$CAPTURE}" --flamegraph --force -o "$OUT/diff.svg"
$LANALYZE "$CAPTURE" --speedscope --force -o "$OUT/speedscope.json"
$LANALYZE "$CAPTURE" --firefox --force -o "$OUT/firefox.json"
# One thread other than the main thread: the process track must still be the process's.
WORKER=$($LANALYZE "$CAPTURE" --info | awk '/^threads/ {t=1; next} t && NF >= 4 && $1 != $2 {print $2; exit}')
$LANALYZE "$CAPTURE" --firefox -t "$WORKER" --force -o "$OUT/firefox-worker.json"
node scripts/check_apps.mjs "$OUT" "$APPS/node_modules" ${FFP_DIST:+"$FFP_DIST"}
echo "screenshots: $OUT/*.png"

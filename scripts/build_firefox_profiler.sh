#!/usr/bin/env bash
# Builds the Firefox Profiler web app from its sources, for scripts/check_apps.sh:
#
#   git clone https://github.com/firefox-devtools/profiler /tmp/ffp/profiler
#   scripts/build_firefox_profiler.sh /tmp/ffp/profiler
#   FFP_DIST=/tmp/ffp/profiler/dist sudo scripts/check_apps.sh
#
# Two packages of its lockfile are not on the npm registry (iongraph-web, json-slabs): they
# are replaced by stubs (the Ion graph viewer and the binary JsonSlabs container are not
# needed to open JSON profiles). Built with yarn 1 (installed beside it, not globally),
# engines ignored (it asks for a newer Node.js than Debian's; it builds on 20). Checked
# on commit df31314e16bf (2026-11).
set -euo pipefail
SRC=$(cd "${1:?usage: $0 PROFILER_SOURCE_DIR}" && pwd)
WORK=$(dirname "$SRC")/ffp-build
mkdir -p "$WORK/stubs/iongraph-web" "$WORK/stubs/json-slabs" "$WORK/tools"

cat >"$WORK/stubs/iongraph-web/package.json" <<'EOF'
{ "name": "iongraph-web", "version": "0.2.1-stub", "main": "index.js",
  "exports": { ".": "./index.js", "./react": "./react.js", "./style.css": "./style.css" } }
EOF
echo 'exports.migrate = function (x) { return x; };' >"$WORK/stubs/iongraph-web/index.js"
cat >"$WORK/stubs/iongraph-web/react.js" <<'EOF'
const React = require('react');
exports.migrate = function (x) { return x; };
exports.GraphViewerReact = function () {
  return React.createElement('div', null, 'IonGraph viewer unavailable in this build');
};
EOF
echo '/* stub */' >"$WORK/stubs/iongraph-web/style.css"
echo '{ "name": "json-slabs", "version": "0.4.0-stub", "main": "index.js" }' \
	>"$WORK/stubs/json-slabs/package.json"
cat >"$WORK/stubs/json-slabs/index.js" <<'EOF'
exports.isJsonSlabsFile = function () { return false; };
exports.decode = function () { throw new Error('json-slabs stub: decode unsupported'); };
exports.encode = function () { throw new Error('json-slabs stub: encode unsupported'); };
EOF

[ -x "$WORK/tools/node_modules/.bin/yarn" ] || npm install --prefix "$WORK/tools" yarn@1 >/dev/null
export PATH=$WORK/tools/node_modules/.bin:$PATH YARN_CACHE_FOLDER=$WORK/yarn-cache
# The nested yarn runs of build-prod read this, not the flag.
export YARN_IGNORE_ENGINES=true
cd "$SRC"
sed -i -e "s#\"iongraph-web\": \"[^\"]*\"#\"iongraph-web\": \"file:$WORK/stubs/iongraph-web\"#" \
	-e "s#\"json-slabs\": \"[^\"]*\"#\"json-slabs\": \"file:$WORK/stubs/json-slabs\"#" package.json
nice -n 19 yarn install --ignore-engines --ignore-scripts --network-timeout 600000
nice -n 19 yarn --ignore-engines build-prod
[ -f dist/index.html ] || { echo "no dist/index.html: the build failed (see above)" >&2; exit 1; }
echo "built: $SRC/dist"

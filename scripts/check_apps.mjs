// Opens lanalyze's shareable outputs in the apps people open them in, in headless Chromium
// (driven by playwright-core), and checks what a user would: each loads without an error,
// the flame graph's title fits, search and zoom work, speedscope opens on the busiest
// thread and its thread selector, sandwich view and search work, and the Firefox Profiler
// (when a build of it is given) shows the process and its threads with Lua frames.
//
// node scripts/check_apps.mjs OUT_DIR MODULES_DIR [FIREFOX_PROFILER_DIST]
//   OUT_DIR: flamegraph.svg, diff.svg, speedscope.json, firefox.json (scripts/check_apps.sh
//   makes them); screenshots are written there too. MODULES_DIR: a node_modules with
//   playwright-core and speedscope. Exit status 1 if any check fails.

import { createRequire } from "node:module";
import http from "node:http";
import fs from "node:fs";
import path from "node:path";

const [outDir, modulesDir, ffpDist] = process.argv.slice(2);
if (!outDir || !modulesDir) {
  console.error("usage: node scripts/check_apps.mjs OUT_DIR MODULES_DIR [FIREFOX_PROFILER_DIST]");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modulesDir), "x.js"));
const { chromium } = require("playwright-core");
const speedscopeDir = path.join(path.resolve(modulesDir), "speedscope/dist/release");

let failures = 0;
function check(ok, what, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${detail ? `: ${detail}` : ""}`);
  if (!ok) failures++;
}

// One loopback server: /out/ the outputs, /speedscope/ its web app, /ffp/ the Firefox
// Profiler's build (any unknown path under it is its index.html: a single-page app).
const types = {
  ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".json": "application/json",
  ".svg": "image/svg+xml", ".wasm": "application/wasm", ".png": "image/png", ".woff2": "font/woff2",
};
function serveFile(res, file) {
  fs.readFile(file, (err, data) => {
    if (err) {
      res.writeHead(404);
      res.end();
      return;
    }
    res.writeHead(200, {
      "Content-Type": types[path.extname(file)] || "application/octet-stream",
      "Access-Control-Allow-Origin": "*",
    });
    res.end(data);
  });
}
const server = http.createServer((req, res) => {
  const url = decodeURIComponent(new URL(req.url, "http://x").pathname);
  const under = (prefix, dir, spa) => {
    if (!url.startsWith(prefix) || !dir) return false;
    const file = path.join(dir, url.slice(prefix.length));
    if (!file.startsWith(dir)) return false;
    const exists = fs.existsSync(file) && fs.statSync(file).isFile();
    serveFile(res, exists ? file : spa ? path.join(dir, "index.html") : file);
    return true;
  };
  if (under("/out/", path.resolve(outDir), false)) return;
  if (under("/speedscope/", speedscopeDir, false)) return;
  // No service worker: it would cache the app between runs.
  if (ffpDist && url !== "/sw.js" && under("/", path.resolve(ffpDist), true)) return;
  res.writeHead(404);
  res.end();
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const base = `http://127.0.0.1:${server.address().port}`;

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});

/// A page that records its errors.
async function open(url, width = 1400, height = 900) {
  const page = await browser.newPage({ viewport: { width, height } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  await page.goto(url, { waitUntil: "load" });
  return { page, errors };
}

async function checkSvg(name) {
  const { page, errors } = await open(`${base}/out/${name}`);
  const title = await page.evaluate(() => {
    const t = document.getElementById("title");
    return t ? { text: t.textContent, width: t.getBBox().width } : null;
  });
  check(title !== null, `${name}: has a title`);
  if (title) {
    check(title.width <= 1200, `${name}: title fits 1,200 px`, `${Math.round(title.width)} px "${title.text}"`);
  }
  // Search: inferno asks for a term in a prompt, then colours matches and says "Matched:".
  page.once("dialog", (d) => d.accept("worker"));
  await page.click("#search");
  const matched = await page.evaluate(() => document.getElementById("matched")?.textContent || "");
  check(/Matched: [1-9]/.test(matched), `${name}: search for "worker" matches`, matched.trim());
  await page.screenshot({ path: path.join(outDir, `${name}.search.png`) });
  // Zoom: a click on a frame zooms to it; "Reset Zoom" appears.
  const frame = await page.$("#frames > g:nth-child(5)");
  if (frame) {
    await frame.click();
    const unzoom = await page.evaluate(() => !document.getElementById("unzoom").classList.contains("hide"));
    check(unzoom, `${name}: a click zooms (Reset Zoom shown)`);
    await page.screenshot({ path: path.join(outDir, `${name}.zoom.png`) });
  } else {
    check(false, `${name}: has frames to click`);
  }
  check(errors.length === 0, `${name}: no errors`, errors.join("; "));
  await page.close();
}

async function checkSpeedscope() {
  const profile = JSON.parse(fs.readFileSync(path.join(outDir, "speedscope.json"), "utf8"));
  const names = profile.profiles.map((p) => p.name);
  const url = `${base}/speedscope/index.html#profileURL=${encodeURIComponent(`${base}/out/speedscope.json`)}`;
  const { page, errors } = await open(url);
  await page.waitForSelector("canvas", { timeout: 30000 });
  await page.waitForTimeout(1500);
  const text = await page.evaluate(() => document.body.innerText);
  const busiest = profile.profiles.reduce((a, p) => (p.samples.length > a.samples.length ? p : a));
  check(text.includes(names[0]), "speedscope: opens on the first profile", names[0]);
  check(busiest.name === names[0], "speedscope: the first profile is the busiest thread", busiest.name);
  check(text.includes(`(1/${names.length})`), `speedscope: thread selector shows 1/${names.length}`);
  await page.screenshot({ path: path.join(outDir, "speedscope.png") });
  // The next profile (thread selector, key "n").
  await page.keyboard.press("n");
  await page.waitForTimeout(500);
  const next = await page.evaluate(() => document.body.innerText);
  check(next.includes(`(2/${names.length})`) && next.includes(names[1]), "speedscope: key n selects the next thread", names[1]);
  // Sandwich view: a table of functions.
  await page.keyboard.press("3");
  await page.waitForTimeout(800);
  const sandwich = await page.evaluate(() => document.body.innerText);
  const frames = profile.shared.frames.map((f) => f.name);
  const listed = frames.filter((f) => sandwich.includes(f)).length;
  check(listed >= 3, "speedscope: sandwich view lists functions", `${listed} of ${frames.length} frame names visible`);
  await page.screenshot({ path: path.join(outDir, "speedscope.sandwich.png") });
  check(errors.length === 0, "speedscope: no errors", errors.join("; "));
  await page.close();
}

async function checkFirefoxProfiler(file) {
  const json = `${base}/out/${file}`;
  const { page, errors } = await open(`${base}/from-url/${encodeURIComponent(json)}/calltree/`);
  const loaded = await page
    .waitForSelector(".treeViewBody, .appErrorBoundary, .homeSectionError", { timeout: 60000 })
    .then(() => true, () => false);
  check(loaded, `Firefox Profiler: ${file} loads`);
  await page.waitForTimeout(1500);
  const text = await page.evaluate(() => document.body.innerText);
  const profile = JSON.parse(fs.readFileSync(path.join(outDir, file), "utf8"));
  const processNames = [...new Set(profile.threads.map((t) => t.processName))];
  for (const p of processNames) check(text.includes(p), `Firefox Profiler: process ${p} shown`);
  const threadNames = profile.threads.map((t) => t.name);
  const shown = threadNames.filter((t) => text.includes(t)).length;
  check(shown === threadNames.length, "Firefox Profiler: every thread has a track", `${shown} of ${threadNames.length}`);
  const body = await page.$(".treeViewBody");
  check(body !== null, "Firefox Profiler: the call tree is shown");
  // The process's own track (its main thread's, or an empty one when the main thread
  // has no samples) and a track per thread, each named as lanalyze named them.
  const rows = await page.$$eval(".timelineTrackGlobalRow, .timelineTrackLocalRow", (ts) =>
    ts.map((t) => `${t.className.includes("Global") ? "process" : "  thread"} ${t.innerText.split("\n")[0]}`));
  console.log(`     tracks:\n       ${rows.join("\n       ")}`);
  check(rows[0] === `process ${processNames[0]}`, "Firefox Profiler: the first track is the process's", rows[0]);
  await page.screenshot({ path: path.join(outDir, `${file}.png`) });
  // The app reports the service worker this server refuses to serve.
  const real = errors.filter((e) => !/ServiceWorker|sw\.js|service worker|when fetching the script/i.test(e));
  check(real.length === 0, "Firefox Profiler: no errors", real.join("; "));
  await page.close();
}

try {
  await checkSvg("flamegraph.svg");
  await checkSvg("diff.svg");
  await checkSpeedscope();
  if (ffpDist) {
    await checkFirefoxProfiler("firefox.json");
    if (fs.existsSync(path.join(outDir, "firefox-worker.json"))) await checkFirefoxProfiler("firefox-worker.json");
  }
  else console.log("skip Firefox Profiler: no build given (scripts/check_apps.sh FFP_DIST=…)");
} finally {
  await browser.close();
  server.close();
}
console.log(failures === 0 ? "all checks passed" : `${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);

//! `--latency SPEC` and `--node-loop`: finds the functions to time in the binaries the
//! targets map, says where to attach uprobes (per process), stops probing what is called
//! too often, and gathers what BPF measured into the capture's `Latency` record.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lrec_format::{latency_kind, Latency, LatencyProbe};
use lrec_inspect::elf::{self, DebugInfo};

use crate::procfs::{self, MapsEntry};
use crate::sampler::{RawMark, Role, Sampler, MAX_LATENCY_PROBES, NO_PROBE};

/// Call rates are measured over windows this long.
const RATE_WINDOW: Duration = Duration::from_millis(500);

/// One `--latency` argument: `SYMBOL`, `BINARY:SYMBOL` or `BINARY:0xADDRESS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub text: String,
    /// A path, or a file name that a mapped file's name equals or begins with followed by
    /// `.` (`libc.so` is `libc.so.6`).
    pub binary: Option<String>,
    pub what: What,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    Symbol(String),
    /// An address as `nm` and `objdump` print it (SVMA), of a function's first instruction.
    Address(u64),
}

impl std::str::FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Spec, String> {
        // The first lone ':' separates a binary (C++ names hold '::').
        let bytes = s.as_bytes();
        let split = (0..bytes.len()).find(|&i| {
            bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':')
        });
        let (binary, what) = match split {
            Some(i) => (Some(&s[..i]), &s[i + 1..]),
            None => (None, s),
        };
        if what.is_empty() || binary == Some("") {
            return Err("expected SYMBOL, BINARY:SYMBOL or BINARY:0xADDRESS".into());
        }
        let what = match what.strip_prefix("0x").or_else(|| what.strip_prefix("0X")) {
            Some(hex) => match (binary, u64::from_str_radix(hex, 16)) {
                (Some(_), Ok(a)) => What::Address(a),
                (None, Ok(_)) => return Err("an address needs its binary: BINARY:0xADDRESS".into()),
                (_, Err(_)) => return Err(format!("bad hexadecimal address {what}")),
            },
            None => What::Symbol(what.into()),
        };
        Ok(Spec {
            text: s.into(),
            binary: binary.map(Into::into),
            what,
        })
    }
}

impl Spec {
    fn matches(&self, path: &str) -> bool {
        let Some(want) = &self.binary else {
            return true;
        };
        if want.contains('/') {
            return path == want;
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        name == want
            || name
                .strip_prefix(want.as_str())
                .is_some_and(|r| r.starts_with('.'))
    }
}

/// A uprobe to attach: `role` at `file_offset` of `path`, in process `pid`.
pub struct Attach {
    pub role: Role,
    pub path: PathBuf,
    pub file_offset: u64,
    pub pid: u32,
}

/// The functions of libuv's loop (`uv_run`, libuv ≥ 1.45) that bound its phases.
const NODE_FUNCTIONS: [&str; 5] = [
    "uv__run_timers",
    "uv__run_idle",
    "uv__run_prepare",
    "uv__io_poll",
    "uv__run_check",
];

/// Boundary events of the loop: (function index, at its return), in the order uv_run
/// reaches them; each ends the phase named with it, when the event before it came last.
const NODE_EVENTS: [(usize, bool, &str, &str); 8] = [
    // uv__run_pending is inlined into uv_run, before uv__run_idle.
    (
        1,
        false,
        "pending",
        "from uv__run_timers' return to uv__run_idle",
    ),
    (2, false, "idle", "from uv__run_idle to uv__run_prepare"),
    (3, false, "prepare", "from uv__run_prepare to uv__io_poll"),
    (3, true, "poll", "uv__io_poll, entry to return"),
    (
        4,
        false,
        "pending (after poll)",
        "from uv__io_poll's return to uv__run_check (uv__run_pending, inlined)",
    ),
    (4, true, "check", "uv__run_check, entry to return"),
    (
        0,
        false,
        "closing",
        "from uv__run_check's return to uv__run_timers (uv__run_closing_handles, inlined)",
    ),
    (0, true, "timers", "uv__run_timers, entry to return"),
];

/// What is known of one binary: each spec's function offsets, or why none.
#[derive(Default)]
struct Resolved {
    /// Per spec: (SVMA, file offset), or a reason it matched nothing here (None: the
    /// spec does not name this binary and the symbol is simply absent).
    functions: Vec<Result<(u64, u64), Option<String>>>,
    /// The node loop's functions' file offsets, if all are here.
    node: Option<[u64; 5]>,
    build_id: Option<Vec<u8>>,
}

pub struct Tracker {
    specs: Vec<Spec>,
    node_loop: bool,
    debug_dir: PathBuf,
    probes: Vec<LatencyProbe>,
    /// Probe id per (spec, binary key).
    functions: HashMap<(usize, Vec<u8>), u32>,
    /// The node loop's first probe id (its phases, then its iteration).
    node_probes: Option<u32>,
    /// Per process, the binaries (keys) already looked at.
    seen: HashMap<u32, HashSet<Vec<u8>>>,
    resolved: HashMap<Vec<u8>, Resolved>,
    /// Per spec, why it matched nothing where it was looked for.
    misses: Vec<Vec<String>>,
    pub attach: Vec<Attach>,
    pub messages: Vec<String>,
    window: Option<(Instant, Vec<u64>)>,
    marks_written: bool,
}

impl Tracker {
    pub fn new(specs: Vec<Spec>, node_loop: bool, debug_dir: PathBuf) -> Tracker {
        Tracker {
            misses: vec![Vec::new(); specs.len()],
            specs,
            node_loop,
            debug_dir,
            probes: Vec::new(),
            functions: HashMap::new(),
            node_probes: None,
            seen: HashMap::new(),
            resolved: HashMap::new(),
            attach: Vec::new(),
            messages: Vec::new(),
            window: None,
            marks_written: false,
        }
    }

    /// An executable file mapping of process `pid` (`key`: its build-id or path): queues
    /// uprobes on what it holds of the specs, once per process and binary.
    pub fn on_mapping(&mut self, pid: u32, entry: &MapsEntry, key: &[u8]) {
        let Some(path) = entry.file_path() else {
            return;
        };
        // Called on every read of the maps: known binaries cost a lookup, no allocation.
        let seen = self.seen.entry(pid).or_default();
        if seen.contains(key) {
            return;
        }
        seen.insert(key.to_vec());
        let wanted = self.node_loop || self.specs.iter().any(|s| s.matches(path));
        if !wanted {
            return;
        }
        let r = match self.resolved.remove(key) {
            Some(r) => r,
            None => self.resolve(pid, entry, path),
        };
        let attach_path = PathBuf::from(format!("/proc/{pid}/root{path}"));
        // Where the probes found here are.
        let place = LatencyProbe {
            binary: path.into(),
            build_id: r.build_id.clone(),
            ..LatencyProbe::default()
        };
        let mut jobs = Vec::new();
        for (i, f) in r.functions.iter().enumerate() {
            match f {
                Ok((addr, offset)) => {
                    let probe = self.function_probe(i, key, &place, *addr, *offset);
                    if let Some(probe) = probe {
                        jobs.push((Role::Function { probe }, *offset));
                    }
                }
                Err(Some(why)) if !self.misses[i].contains(why) => self.misses[i].push(why.clone()),
                Err(_) => {}
            }
        }
        if let Some(offsets) = r.node {
            if self.node_probes.is_none() {
                self.node_probes = self.new_node_probes(&place);
            }
            if self.node_probes.is_some() {
                for (event, &(f, at_return, _, _)) in NODE_EVENTS.iter().enumerate() {
                    let role = Role::Mark {
                        event: event as u32,
                        at_return,
                    };
                    jobs.push((role, offsets[f]));
                }
            }
        }
        self.resolved.insert(key.to_vec(), r);
        for (role, file_offset) in jobs {
            self.attach.push(Attach {
                role,
                path: attach_path.clone(),
                file_offset,
                pid,
            });
        }
    }

    /// Looks for every spec's function, and the node loop's, in one binary.
    fn resolve(&self, pid: u32, entry: &MapsEntry, path: &str) -> Resolved {
        let data = match procfs::open_mapped_file(pid, entry).and_then(|mut f| {
            let mut d = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut d).map(|_| d)
        }) {
            Ok(d) => d,
            Err(e) => {
                return Resolved {
                    functions: self
                        .specs
                        .iter()
                        .map(|s| {
                            Err(s
                                .binary
                                .is_some()
                                .then(|| format!("cannot read {path}: {e}")))
                        })
                        .collect(),
                    ..Resolved::default()
                }
            }
        };
        // Symbols a stripped binary lacks may be in its separate debug file.
        let this = lrec_format::Binary {
            path: path.to_owned(),
            build_id: elf::build_id(&data),
            ..Default::default()
        };
        let debug = crate::embedder::separate_debug_file(&self.debug_dir, &this);
        let lookup = |name: &str| -> Result<Vec<(u64, u64)>, String> {
            let found = elf::function_symbols(&data, name)?;
            match (&debug, found.is_empty()) {
                (Some(d), true) => elf::function_symbols(&d.data, name),
                _ => Ok(found),
            }
        };
        let unique = |name: &str| -> Result<u64, Option<String>> {
            let found = lookup(name).map_err(Some)?;
            match found.as_slice() {
                [] => Err(None),
                [(addr, _)] => Ok(*addr),
                many => Err(Some(format!(
                    "{name} names {} functions in {path} (at {}): give one as {}:0xADDRESS",
                    many.len(),
                    many.iter()
                        .map(|(a, _)| format!("{a:#x}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    path.rsplit('/').next().unwrap_or(path)
                ))),
            }
        };
        // Its unwind tables, parsed once if an address is to be checked.
        let binary = std::cell::OnceCell::new();
        let functions = self
            .specs
            .iter()
            .map(|spec| {
                if !spec.matches(path) {
                    return Err(None);
                }
                let explicit = spec.binary.is_some();
                let addr = match &spec.what {
                    What::Symbol(name) => unique(name).map_err(|e| match e {
                        None if explicit => Some(format!("no function {name} in {path}")),
                        e => e,
                    })?,
                    What::Address(a) => {
                        let binary =
                            binary.get_or_init(|| elf::binary_record(path, &data, DebugInfo::None));
                        if elf::starts_function(binary, &data, *a) == Some(false) {
                            return Err(Some(format!(
                                "no function begins at {a:#x} in {path} (by its symbols and \
                                 unwind tables): a return probe elsewhere would corrupt \
                                 the stack; give the address of a function's first \
                                 instruction"
                            )));
                        }
                        *a
                    }
                };
                let offset = elf::code_file_offset(&data, addr).map_err(Some)?;
                Ok((addr, offset))
            })
            .collect();
        let node = self
            .node_loop
            .then(|| {
                let mut offsets = [0u64; 5];
                for (i, name) in NODE_FUNCTIONS.iter().enumerate() {
                    let addr = unique(name).ok()?;
                    offsets[i] = elf::code_file_offset(&data, addr).ok()?;
                }
                Some(offsets)
            })
            .flatten();
        Resolved {
            functions,
            node,
            build_id: this.build_id,
        }
    }

    /// The probe of spec `i` in binary `key` (`place`: its path and build-id), created the
    /// first time.
    fn function_probe(
        &mut self,
        i: usize,
        key: &[u8],
        place: &LatencyProbe,
        addr: u64,
        offset: u64,
    ) -> Option<u32> {
        if let Some(&id) = self.functions.get(&(i, key.to_vec())) {
            return Some(id);
        }
        let spec = &self.specs[i];
        let base = match &spec.what {
            What::Symbol(name) if spec.binary.is_none() => name.clone(),
            _ => spec.text.clone(),
        };
        let path = &place.binary;
        let name = match self.probes.iter().any(|p| p.name == base) {
            true => format!("{base} ({})", path.rsplit('/').next().unwrap_or(path)),
            false => base,
        };
        let id = self.new_probe(LatencyProbe {
            name,
            kind: latency_kind::FUNCTION,
            spec: spec.text.clone(),
            address: addr,
            file_offset: offset,
            how: "entry to return".into(),
            ..place.clone()
        })?;
        self.functions.insert((i, key.to_vec()), id);
        Some(id)
    }

    fn new_probe(&mut self, mut p: LatencyProbe) -> Option<u32> {
        let id = self.probes.len() as u32;
        if id >= MAX_LATENCY_PROBES {
            self.messages.push(format!(
                "warning: more than {MAX_LATENCY_PROBES} timed functions: {} is not timed",
                p.name
            ));
            return None;
        }
        p.id = id;
        self.probes.push(p);
        Some(id)
    }

    /// The node loop's phase probes (in NODE_EVENTS order) and its iteration probe.
    fn new_node_probes(&mut self, place: &LatencyProbe) -> Option<u32> {
        let mut first = None;
        for &(_, _, phase, how) in &NODE_EVENTS {
            let id = self.new_probe(LatencyProbe {
                name: format!("node loop: {phase}"),
                kind: latency_kind::PHASE,
                spec: "--node-loop".into(),
                how: how.into(),
                ..place.clone()
            })?;
            first.get_or_insert(id);
        }
        self.new_probe(LatencyProbe {
            name: "node loop: iteration".into(),
            kind: latency_kind::ITERATION,
            spec: "--node-loop".into(),
            how: "from one return of uv__run_timers to the next".into(),
            ..place.clone()
        })?;
        first
    }

    /// What each boundary event ends, for BPF: once, when the node loop's probes exist.
    pub fn take_node_marks(&mut self) -> Vec<(u32, RawMark)> {
        let Some(first) = self.node_probes else {
            return Vec::new();
        };
        if std::mem::replace(&mut self.marks_written, true) {
            return Vec::new();
        }
        let n = NODE_EVENTS.len() as u32;
        (0..n)
            .map(|event| {
                let mark = RawMark {
                    phase: first + event,
                    after: (event + n - 1) % n,
                    iteration: if event == n - 1 { first + n } else { NO_PROBE },
                    pad: 0,
                };
                (event, mark)
            })
            .collect()
    }

    /// Stops probing what was called more than `max_rate` times a second over the last
    /// window (0: no limit); says so in `messages`.
    pub fn limit(&mut self, sampler: &mut Sampler, max_rate: u64) {
        if max_rate == 0 || self.probes.is_empty() {
            return;
        }
        // The counters are read once a window, not on every turn of lrec's loop.
        if self
            .window
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < RATE_WINDOW)
        {
            return;
        }
        let hits: Vec<u64> = sampler
            .latency_counters(self.probes.len() as u32)
            .iter()
            .map(|c| c.hits)
            .collect();
        let Some((at, before)) = self.window.take() else {
            self.window = Some((Instant::now(), hits));
            return;
        };
        let secs = at.elapsed().as_secs_f64();
        self.window = Some((Instant::now(), hits.clone()));
        for (id, &n) in hits.iter().enumerate() {
            let rate = (n - before.get(id).copied().unwrap_or(0)) as f64 / secs;
            let p = &self.probes[id];
            if rate <= max_rate as f64 || p.stopped_ns.is_some() {
                continue;
            }
            let now = procfs::monotonic_ns();
            let node = p.kind != latency_kind::FUNCTION;
            let what = match node {
                true => "the node loop".to_string(),
                false => p.name.clone(),
            };
            if node {
                sampler.detach_latency(|r| matches!(r, Role::Mark { .. }));
                for q in self
                    .probes
                    .iter_mut()
                    .filter(|q| q.kind != latency_kind::FUNCTION)
                {
                    q.stopped_ns = Some(now);
                    q.stopped_rate = rate as u64;
                }
            } else {
                let probe = id as u32;
                sampler.detach_latency(|r| r == Role::Function { probe });
                self.probes[id].stopped_ns = Some(now);
                self.probes[id].stopped_rate = rate as u64;
            }
            self.messages.push(format!(
                "warning: {what} ran {rate:.0} times/s, above --latency-max-rate {max_rate}: \
                 timing it costs the target a few microseconds per call; stopped, later \
                 calls are not timed (raise the limit, or 0 for none, to go on)"
            ));
        }
    }

    /// The record for the capture: every probe with its counts, every histogram.
    pub fn finish(&mut self, sampler: &Sampler, max_rate: u64) -> Latency {
        let counters = sampler.latency_counters(self.probes.len() as u32);
        for (p, c) in self.probes.iter_mut().zip(&counters) {
            p.hits = c.hits;
            p.unmatched_returns = c.unmatched;
            p.abandoned = c.abandoned;
            p.too_deep = c.too_deep;
            p.dropped = c.dropped;
        }
        let histograms = sampler.latency_histograms();
        for p in &mut self.probes {
            // A function's entries not accounted for otherwise are still open. (A phase
            // has no entry: it is timed when it ends.)
            if p.kind == latency_kind::FUNCTION {
                let timed: u64 = histograms
                    .iter()
                    .filter(|h| h.probe == p.id)
                    .map(|h| h.count)
                    .sum();
                p.open = p
                    .hits
                    .saturating_sub(p.too_deep + p.abandoned + timed + p.dropped);
            }
        }
        let mut unresolved = Vec::new();
        for (i, spec) in self.specs.iter().enumerate() {
            if self.functions.keys().any(|(s, _)| *s == i) {
                continue;
            }
            match self.misses[i].is_empty() {
                true => unresolved.push(format!(
                    "--latency {}: no such function in the target's binaries",
                    spec.text
                )),
                false => unresolved.extend(
                    self.misses[i]
                        .iter()
                        .map(|m| format!("--latency {}: {m}", spec.text)),
                ),
            }
        }
        if self.node_loop && self.node_probes.is_none() {
            unresolved.push(format!(
                "--node-loop: no libuv loop in the target's binaries (looked for {})",
                NODE_FUNCTIONS.join(", ")
            ));
        }
        Latency {
            max_rate,
            probes: self.probes.clone(),
            histograms,
            unresolved,
        }
    }
}

/// Lines of lrec's summary: per probe, calls timed and their rate, and what went wrong.
pub fn print_summary(l: &Latency, elapsed: Duration) {
    for p in &l.probes {
        let timed: u64 = l
            .histograms
            .iter()
            .filter(|h| h.probe == p.id)
            .map(|h| h.count)
            .sum();
        let mut line = format!(
            "lrec: latency {}: {timed} calls timed, {} hits ({:.0}/s)",
            p.name,
            p.hits,
            p.hits as f64 / elapsed.as_secs_f64().max(1e-9)
        );
        for (n, what) in [
            (p.unmatched_returns, "returns without their entry"),
            (p.abandoned, "never returned"),
            (p.open, "still open"),
            (p.too_deep, "too deep"),
            (p.dropped, "dropped: table full"),
        ] {
            if n > 0 {
                line += &format!(", {n} {what}");
            }
        }
        if p.stopped_ns.is_some() {
            line += &format!(", STOPPED at {}/s", p.stopped_rate);
        }
        eprintln!("{line}");
    }
    for u in &l.unresolved {
        eprintln!("lrec: warning: {u}");
    }
    if !l.probes.is_empty() {
        eprintln!("lrec: read the durations with: lanalyze CAPTURE --latency");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let s: Spec = "uv__io_poll".parse().unwrap();
        assert_eq!(
            (s.binary, s.what),
            (None, What::Symbol("uv__io_poll".into()))
        );
        let s: Spec = "libfoo.so:bar".parse().unwrap();
        assert_eq!(s.binary.as_deref(), Some("libfoo.so"));
        assert!(s.matches("/usr/lib/libfoo.so.1"));
        assert!(!s.matches("/usr/lib/libfoo.sox"));
        let s: Spec = "/usr/bin/node:0x18c0120".parse().unwrap();
        assert_eq!(s.what, What::Address(0x18c0120));
        assert!(s.matches("/usr/bin/node") && !s.matches("/opt/node"));
        let s: Spec = "ns::f".parse().unwrap();
        assert_eq!((s.binary, s.what), (None, What::Symbol("ns::f".into())));
        assert!("0x10".parse::<Spec>().is_err());
        assert!(":f".parse::<Spec>().is_err());
        assert!("bin:0xzz".parse::<Spec>().is_err());
    }
}

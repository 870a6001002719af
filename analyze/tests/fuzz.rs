//! A fuzz target over whole captures: valid captures of every record kind (the committed
//! ones, a stripped one, and one of off-CPU, thread-state and latency records), their
//! records damaged *inside* valid chunks (so that the checksum lets them through to the
//! decoders), read by lanalyze and written by every renderer. Nothing may panic, and no
//! allocation may be larger than the capture could justify.
//!
//! `make test` runs a short round (64 cases); `make fuzz` a long one
//! (`PROPTEST_CASES=20000`). Fixed cases, and any the proptest fails on, are replayed
//! in `regressions` below.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lanalyze::render::{self, StackOptions};
use lanalyze::{analyze, read_latencies, strip, Mode, Options};
use lrec_format::{
    Capture, CaptureWriter, Chunk, Header, Latency, LatencyCall, OffCpu, OffCpuTotals, Record,
    Sample, ThreadStates, MAGIC,
};
use proptest::prelude::*;

/// No single allocation may exceed this: the captures fuzzed are below 4 MiB, so a larger
/// one comes from a length field believed beyond the chunk that holds it.
const MAX_ALLOCATION: usize = 256 << 20;

struct Bounded;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > MAX_ALLOCATION {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        if new > MAX_ALLOCATION {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Bounded = Bounded;

fn committed(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/captures")
        .join(name);
    std::fs::read(path).unwrap()
}

/// `capture`'s records written again by this writer: its deep Lua stacks share frames
/// (`LUA_STACK_SHARED`), which the committed capture predates.
fn rewritten(capture: &[u8]) -> Vec<u8> {
    let (records, _) = Capture::from_bytes(capture.to_vec()).unwrap().read_all();
    let Some(Record::Header(header)) = records.first() else {
        panic!("no header first");
    };
    let mut w = CaptureWriter::new(Vec::new(), header).unwrap();
    for r in &records[1..] {
        w.push(r).unwrap();
    }
    w.finish().unwrap()
}

/// A capture of the record kinds the committed ones lack: time off CPU, thread states,
/// timed calls.
fn synthetic() -> Vec<u8> {
    let header = Header {
        arch: "x86_64".into(),
        frequency_hz: 99,
        ..Header::default()
    };
    let mut w = CaptureWriter::new(Vec::new(), &header).unwrap();
    let sample = Sample {
        time_ns: 10,
        pid: 3,
        tid: 3,
        regs: lrec_format::Regs {
            ip: 0x1000,
            sp: 0x7fff_0000,
            ..Default::default()
        },
        user_stack: vec![1; 64],
        kernel_stack: vec![0xffff_ffff_8100_0000],
        ..Sample::default()
    };
    let records = [
        Record::Sample(sample.clone()),
        Record::OffCpu(OffCpu {
            start_ns: 5,
            duration_ns: 2_000_000,
            state: 1,
            sample,
        }),
        Record::ThreadStates(ThreadStates::default()),
        Record::OffCpuTotals(OffCpuTotals::default()),
        Record::Latency(Latency::default()),
        Record::LatencyCall(LatencyCall::default()),
        Record::Lost(lrec_format::Lost {
            time_ns: 11,
            count: 2,
        }),
        Record::KernelSymbols(lrec_format::KernelSymbols {
            symbols: vec![(0xffff_ffff_8100_0000, 0xffff_ffff_8100_1000, "k".into())],
        }),
        Record::Process(lrec_format::Process::default()),
        Record::LuaRuntime(lrec_format::LuaRuntime::default()),
    ];
    for r in &records {
        w.push(r).unwrap();
    }
    w.finish().unwrap()
}

/// The seeds: every record kind, in valid captures.
fn seeds() -> Vec<Vec<u8>> {
    let luajit = committed("luajit-small.lrec");
    let capture = Capture::from_bytes(luajit.clone()).unwrap();
    let profile = analyze(&capture, &Options::default()).unwrap();
    let mut stripped = Vec::new();
    strip::write_stripped(&profile, &[], &mut stripped).unwrap();
    vec![
        rewritten(&luajit),
        luajit,
        committed("native-small.lrec"),
        stripped,
        synthetic(),
    ]
}

/// What is done to one chunk's records.
#[derive(Debug, Clone)]
enum Damage {
    /// Bytes xored at positions (fractions of the length).
    Flip(Vec<(f64, u8)>),
    /// A little-endian u32 written at a position: a length field made huge or small.
    Word(f64, u32),
    /// The records cut at a position.
    Cut(f64),
    /// A span copied over another (records duplicated, reordered, spliced).
    Splice(f64, f64, f64),
}

fn damage() -> impl Strategy<Value = Damage> {
    let at = 0.0..1.0f64;
    prop_oneof![
        prop::collection::vec((at.clone(), 1..=255u8), 1..8).prop_map(Damage::Flip),
        (
            at.clone(),
            prop_oneof![Just(u32::MAX), Just(1 << 30), Just(0), any::<u32>()]
        )
            .prop_map(|(a, v)| Damage::Word(a, v)),
        at.clone().prop_map(Damage::Cut),
        (at.clone(), at.clone(), at).prop_map(|(a, b, c)| Damage::Splice(a, b, c)),
    ]
}

fn apply(records: &mut Vec<u8>, d: &Damage) {
    let n = records.len();
    if n == 0 {
        return;
    }
    let pos = |f: f64| ((f * n as f64) as usize).min(n - 1);
    match d {
        Damage::Flip(flips) => {
            for &(at, x) in flips {
                records[pos(at)] ^= x;
            }
        }
        Damage::Word(at, v) => {
            let at = pos(*at).min(n.saturating_sub(4));
            let len = 4.min(n - at);
            records[at..at + len].copy_from_slice(&v.to_le_bytes()[..len]);
        }
        Damage::Cut(at) => records.truncate(pos(*at)),
        Damage::Splice(from, to, len) => {
            let (from, to) = (pos(*from), pos(*to));
            let len = ((len * 256.0) as usize).min(n - from).min(n - to);
            let span = records[from..from + len].to_vec();
            records[to..to + len].copy_from_slice(&span);
        }
    }
}

/// `capture` with the records of chunk `which` (modulo the count) damaged and the chunk
/// re-encoded with a valid checksum.
fn damaged(capture: &[u8], which: usize, d: &Damage) -> Vec<u8> {
    let cap = Capture::from_bytes(capture.to_vec()).unwrap();
    let chunks = cap.chunks();
    let target = which % chunks.len();
    let mut out = capture[..12].to_vec();
    assert_eq!(out[..8], MAGIC);
    for (i, c) in chunks.iter().enumerate() {
        let mut records = cap.inflate_chunk(c).unwrap();
        if i == target {
            apply(&mut records, d);
        }
        let chunk = Chunk::from_encoded(&records, c.records, c.kinds, 1).unwrap();
        out.extend_from_slice(chunk.as_bytes());
    }
    out
}

/// Reads a capture the way lanalyze does and renders it every way; errors are fine,
/// panics are not.
fn read_and_render(bytes: Vec<u8>) {
    let Ok(capture) = Capture::from_bytes(bytes) else {
        return;
    };
    let _ = read_latencies(&capture, &Options::default()).map(|l| {
        let mut out = Vec::new();
        let _ = render::write_latency(&l, true, &mut out);
        let _ = render::write_latency_csv(&l, false, &mut out);
    });
    for mode in [Mode::Cpu, Mode::OffCpu, Mode::Wall, Mode::States] {
        let opts = Options {
            mode,
            offline: true,
            ..Options::default()
        };
        let Ok(p) = analyze(&capture, &opts) else {
            continue;
        };
        let o = StackOptions::default();
        let mut out = Vec::new();
        let _ = render::write_folded(&p, o, &mut out);
        let _ = render::write_flamegraph(&p, o, &mut out);
        let _ = render::write_top(&p, 10, &mut out);
        let _ = render::write_info(&p, &mut out);
        let _ = render::write_pprof(&p, &mut out);
        let _ = render::write_speedscope(&p, &mut out);
        let _ = render::write_firefox(&p, &mut out);
        let _ = render::write_states(&p, &[], &mut out);
        let _ = render::write_states_csv(&p, &mut out);
        let _ = render::write_diff_folded(&p, &p, o, &mut out);
        let _ = render::write_diff_top(&p, &p, 10, &mut out);
        let mut stripped = Vec::new();
        if strip::write_stripped(&p, &[], &mut stripped).is_ok() {
            if let Ok(c) = Capture::from_bytes(stripped) {
                let _ = analyze(&c, &opts);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn damaged_records_of_every_kind_neither_panic_nor_allocate_unbounded(
        seed in 0..4usize,
        chunk in 0..64usize,
        d in damage(),
    ) {
        let seeds = SEEDS.with(|s| s.clone());
        read_and_render(damaged(&seeds[seed], chunk, &d));
        let largest = LARGEST.load(Ordering::Relaxed);
        prop_assert!(largest <= MAX_ALLOCATION, "an allocation of {largest} bytes");
    }
}

thread_local! {
    static SEEDS: Vec<Vec<u8>> = seeds();
}

#[test]
fn the_seeds_render_and_hold_every_record_kind() {
    let mut kinds = 0u32;
    for s in seeds() {
        let cap = Capture::from_bytes(s.clone()).unwrap();
        kinds |= cap.chunks().iter().fold(0, |k, c| k | c.kinds);
        read_and_render(s);
    }
    // Every kind this format writes (the two kinds of bit 31 included).
    use lrec_format::kind::*;
    for k in [
        HEADER,
        PROCESS,
        THREAD_NAME,
        MAPPING,
        BINARY,
        SAMPLE,
        LOST,
        END,
        KERNEL_SYMBOLS,
        LUA_STACK,
        LUA_STACK_SHARED,
        LUA_PROTO,
        LUA_RUNTIME,
        RESOLVED_FRAMES,
        RESOLVED_SAMPLE,
        RESOLVED_SUMMARY,
        OFF_CPU,
        THREAD_STATES,
        OFF_CPU_TOTALS,
        LATENCY,
        LATENCY_CALL,
    ] {
        assert!(
            kinds & lrec_format::kind_bit(k) != 0,
            "no seed holds record kind {k}"
        );
    }
}

#[test]
fn regressions() {
    // Fixed damage replayed on every run (length words near u32::MAX and 2^30, a cut
    // chunk, flipped bytes); a case the proptest ever fails on is added here.
    let seeds = seeds();
    let cases: Vec<(usize, usize, Damage)> = vec![
        (0, 3, Damage::Word(0.5, u32::MAX)),
        (1, 1, Damage::Word(0.1, 1 << 30)),
        (2, 0, Damage::Cut(0.3)),
        (3, 0, Damage::Flip(vec![(0.2, 0xff), (0.7, 0x80)])),
    ];
    for (seed, chunk, d) in cases {
        read_and_render(damaged(&seeds[seed], chunk, &d));
    }
}

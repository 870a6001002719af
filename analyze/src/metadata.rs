//! First pass over a capture: everything but samples (headers, mappings, binaries, names).

use std::collections::HashMap;

use lrec_format::{
    kind, kind_bit, Binary, Capture, End, Header, LuaProto, LuaRuntime, Mapping, OffCpuTotals,
    Process, ReadWarning, Record, RecordRef, ResolvedFrame, ResolvedSample, ResolvedSummary,
    ThreadStates,
};
use rayon::prelude::*;

/// The few non-sample records of a capture.
#[derive(Debug, Default)]
pub struct Metadata {
    pub header: Option<Header>,
    pub processes: Vec<Process>,
    /// Latest name recorded per (pid, tid).
    pub thread_names: HashMap<(u32, u32), String>,
    pub mappings: Vec<Mapping>,
    /// First record per build-id (or per path when there is none), in capture order.
    pub binaries: Vec<Binary>,
    pub kernel_symbols: Vec<(u64, u64, String)>,
    pub lost: u64,
    pub end: Option<End>,
    /// Lua VMs found, per process.
    pub lua_runtimes: HashMap<u32, LuaRuntime>,
    /// Lua function prototypes by (pid, id).
    pub lua_protos: HashMap<(u32, u32), LuaProto>,
    /// Opening damage, then per-chunk warnings in capture order.
    pub read_warnings: Vec<ReadWarning>,
    /// A stripped capture's frames (by id), samples and summary.
    pub resolved_frames: Vec<ResolvedFrame>,
    pub resolved_samples: Vec<ResolvedSample>,
    pub resolved_summary: Option<ResolvedSummary>,
    /// `lrec --off-cpu`: time counted per thread without stacks.
    pub off_cpu_totals: Option<OffCpuTotals>,
    /// `lrec --states`: every thread's state, in capture order.
    pub thread_states: Vec<ThreadStates>,
}

/// Decodes every chunk (in parallel) and keeps all records except samples.
pub fn read_metadata(capture: &Capture) -> Metadata {
    let per_chunk: Vec<(Vec<Record>, Vec<ReadWarning>)> = capture
        .chunks()
        .par_iter()
        .map(|chunk| {
            // Chunks of samples (and their Lua stacks) only need not be inflated here.
            let samples =
                kind_bit(kind::SAMPLE) | kind_bit(kind::LUA_STACK) | kind_bit(kind::OFF_CPU);
            if chunk.kinds & !samples == 0 {
                return (Vec::new(), Vec::new());
            }
            let mut kept = Vec::new();
            // Samples are skipped undecoded here; the unwinding pass visits them.
            let warnings = capture.visit_chunk(
                chunk,
                |k| k != kind::SAMPLE && k != kind::LUA_STACK && k != kind::OFF_CPU,
                |r| {
                    if let RecordRef::Other(r) = r {
                        if !matches!(r, Record::Unknown { .. }) {
                            kept.push(r);
                        }
                    }
                },
            );
            (kept, warnings)
        })
        .collect();
    let mut meta = Metadata {
        read_warnings: capture.warnings().to_vec(),
        ..Metadata::default()
    };
    for (records, warnings) in per_chunk {
        meta.read_warnings.extend(warnings);
        for record in records {
            meta.add(record);
        }
    }
    if meta.end.is_none() {
        meta.read_warnings.push(ReadWarning::NoEnd);
    }
    meta
}

impl Metadata {
    fn add(&mut self, record: Record) {
        match record {
            Record::Header(h) => {
                self.header.get_or_insert(h);
            }
            Record::Process(p) => self.processes.push(p),
            Record::ThreadName(t) => {
                self.thread_names.insert((t.pid, t.tid), t.name);
            }
            Record::Mapping(m) => self.mappings.push(m),
            Record::Binary(b) => {
                let key = BinaryKey::of(&b.build_id, &b.path);
                if !self
                    .binaries
                    .iter()
                    .any(|have| BinaryKey::of_binary(have) == key)
                {
                    self.binaries.push(b);
                }
            }
            Record::KernelSymbols(k) => self.kernel_symbols.extend(k.symbols),
            Record::Lost(l) => self.lost += l.count,
            Record::End(e) => self.end = Some(e),
            Record::LuaRuntime(r) => {
                // A runtime that validated wins over an earlier failure.
                let keep = self
                    .lua_runtimes
                    .get(&r.pid)
                    .is_none_or(|have| have.layout.is_empty());
                if keep {
                    self.lua_runtimes.insert(r.pid, r);
                }
            }
            Record::LuaProto(p) => {
                self.lua_protos.insert((p.pid, p.id), p);
            }
            Record::ResolvedFrames(f) => {
                let first = f.first as usize;
                if self.resolved_frames.len() < first + f.frames.len() {
                    self.resolved_frames
                        .resize(first + f.frames.len(), ResolvedFrame::default());
                }
                for (slot, frame) in self.resolved_frames[first..].iter_mut().zip(f.frames) {
                    *slot = frame;
                }
            }
            Record::ResolvedSample(r) => self.resolved_samples.push(r),
            Record::ResolvedSummary(r) => self.resolved_summary = Some(r),
            Record::OffCpuTotals(t) => self.off_cpu_totals = Some(t),
            Record::ThreadStates(t) => self.thread_states.push(t),
            Record::Sample(_)
            | Record::OffCpu(_)
            | Record::LuaStack(_)
            | Record::Unknown { .. } => {}
        }
    }

    /// Index into `binaries` of the binary a mapping maps (see [`BinaryKey`]).
    pub fn binary_index(&self) -> impl Fn(&Mapping) -> Option<usize> + '_ {
        let mut index: HashMap<BinaryKey<'_>, usize> = HashMap::new();
        for (i, b) in self.binaries.iter().enumerate() {
            index.entry(BinaryKey::of_binary(b)).or_insert(i);
        }
        move |m: &Mapping| index.get(&BinaryKey::of(&m.build_id, &m.path)).copied()
    }
}

/// Which binary a mapping maps: the one with its build-id, or, for files without one,
/// the one with its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryKey<'a> {
    BuildId(&'a [u8]),
    Path(&'a str),
}

impl<'a> BinaryKey<'a> {
    pub fn of(build_id: &'a Option<Vec<u8>>, path: &'a str) -> BinaryKey<'a> {
        match build_id {
            Some(id) => BinaryKey::BuildId(id),
            None => BinaryKey::Path(path),
        }
    }

    pub fn of_binary(b: &'a Binary) -> BinaryKey<'a> {
        BinaryKey::of(&b.build_id, &b.path)
    }
}

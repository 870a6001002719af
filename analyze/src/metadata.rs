//! First pass over a capture: everything but samples (headers, mappings, binaries, names).

use std::collections::HashMap;

use lrec_format::{
    kind, kind_bit, Binary, Capture, End, Header, Latency, LatencyCall, LostCauses, LuaProto,
    LuaRuntime, Mapping, OffCpuTotals, OffCpuWindow, Process, ReadWarning, Record, RecordRef,
    ResolvedDetails, ResolvedFrame, ResolvedSample, ResolvedSummary, ThreadStates,
};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::profile::{Latencies, Thread};
use crate::Options;

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
    pub lost_causes: Option<LostCauses>,
    pub end: Option<End>,
    /// Lua VMs found, per process and binary (a process may hold LuaJIT and PUC Lua).
    pub lua_runtimes: HashMap<(u32, String), LuaRuntime>,
    /// Lua function prototypes by (pid, id).
    /// Looked up for every Lua frame of every sample: a fast hash, not SipHash.
    pub lua_protos: FxHashMap<(u32, u32), LuaProto>,
    /// Opening damage, then per-chunk warnings in capture order.
    pub read_warnings: Vec<ReadWarning>,
    /// A stripped capture's frames (by id), samples and summary.
    pub resolved_frames: Vec<ResolvedFrame>,
    pub resolved_samples: Vec<ResolvedSample>,
    pub resolved_summary: Option<ResolvedSummary>,
    pub resolved_details: Option<ResolvedDetails>,
    /// `lrec --off-cpu`: time counted per thread without stacks.
    pub off_cpu_totals: Option<OffCpuTotals>,
    /// `lrec --off-cpu`, `--states`: the recording's window and the intervals it cut.
    pub off_cpu_window: Option<OffCpuWindow>,
    /// `lrec --states`: every thread's state, in capture order.
    pub thread_states: Vec<ThreadStates>,
    /// `lrec --latency`, `--node-loop`: the last record of what was timed (one is written
    /// when the recording ends).
    pub latency: Option<Latency>,
    /// `lrec --latency-events`: each timed call, in capture order.
    pub latency_calls: Vec<LatencyCall>,
}

/// Decodes every chunk (in parallel) and keeps all records except samples.
pub fn read_metadata(capture: &Capture) -> Metadata {
    let per_chunk: Vec<(Vec<Record>, Vec<ReadWarning>)> = capture
        .chunks()
        .par_iter()
        .map(|chunk| {
            // Chunks of samples (and their Lua stacks) or of heap memory only need not be
            // inflated here.
            let samples = kind_bit(kind::SAMPLE)
                | kind_bit(kind::LUA_STACK)
                | kind_bit(kind::LUA_STACK_SHARED)
                | kind_bit(kind::OFF_CPU)
                | kind_bit(kind::LUA_HEAP_MEMORY);
            if chunk.kinds & !samples == 0 {
                return (Vec::new(), Vec::new());
            }
            let mut kept = Vec::new();
            // Samples are skipped undecoded here; the unwinding pass visits them.
            let warnings = capture.visit_chunk(
                chunk,
                |k| {
                    k != kind::SAMPLE
                        && k != kind::LUA_STACK
                        && k != kind::LUA_STACK_SHARED
                        && k != kind::OFF_CPU
                        && k != kind::LUA_HEAP_MEMORY
                },
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
    /// The name of each process of `threads`: its main thread's (tid = pid).
    pub fn process_names(&self, threads: &[Thread]) -> std::collections::BTreeMap<u32, String> {
        threads
            .iter()
            .map(|t| (t.pid, self.thread_name(t.pid, t.pid)))
            .collect()
    }

    /// A thread's name: as recorded, else (a main thread) its executable's, else `[tid N]`.
    pub fn thread_name(&self, pid: u32, tid: u32) -> String {
        if let Some(name) = self.thread_names.get(&(pid, tid)) {
            return name.clone();
        }
        if pid == tid {
            if let Some(p) = self.processes.iter().find(|p| p.pid == pid) {
                let name = crate::image::basename(&p.exe);
                if !name.is_empty() {
                    return name.to_owned();
                }
            }
        }
        format!("[tid {tid}]")
    }

    /// The runtime that walked a Lua stack of process `pid` (`flags`: the stack's): its
    /// PUC Lua or its LuaJIT, whichever validated. Captures before the stacks said which
    /// walker made them hold one runtime per process.
    pub fn lua_runtime(&self, pid: u32, flags: u32) -> Option<&LuaRuntime> {
        let puc = flags & lrec_format::lua_flags::PUC != 0;
        let of_pid = || {
            self.lua_runtimes
                .values()
                .filter(move |r| r.pid == pid && !r.layout.is_empty())
        };
        of_pid()
            .find(|r| crate::lua::is_puc(r) == puc)
            .or_else(|| of_pid().find(|r| !puc && crate::lua::is_puc(r)))
    }

    /// The interpreter code of process `pid`'s LuaJIT VM, also when lrec could not read
    /// its layout (its samples then carry no Lua stack, and unwinding looks for its C
    /// frames itself).
    pub fn luajit_code(&self, pid: u32) -> Option<(u64, u64)> {
        self.lua_runtimes
            .values()
            .find(|r| r.pid == pid && !crate::lua::is_puc(r) && r.vm_end > r.vm_start)
            .map(|r| (r.vm_start, r.vm_end))
    }

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
            Record::LostCauses(c) => self.lost_causes = Some(c),
            Record::End(e) => self.end = Some(e),
            Record::LuaRuntime(r) => {
                // A runtime that validated wins over an earlier failure.
                let key = (r.pid, r.path.clone());
                let keep = self
                    .lua_runtimes
                    .get(&key)
                    .is_none_or(|have| have.layout.is_empty());
                if keep {
                    self.lua_runtimes.insert(key, r);
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
            Record::ResolvedDetails(r) => self.resolved_details = Some(r),
            Record::OffCpuTotals(t) => self.off_cpu_totals = Some(t),
            Record::OffCpuWindow(w) => self.off_cpu_window = Some(w),
            Record::ThreadStates(t) => self.thread_states.push(t),
            Record::Latency(l) => self.latency = Some(l),
            Record::LatencyCall(c) => self.latency_calls.push(c),
            Record::Sample(_)
            | Record::OffCpu(_)
            | Record::LuaStack(_)
            | Record::LuaHeap(_)
            | Record::LuaHeapCopy(_)
            | Record::LuaHeapMemory(_)
            | Record::ResolvedHeap(_)
            | Record::Unknown { .. } => {}
        }
    }

    /// What `lrec --latency` or `--node-loop` measured, filtered by `opts`; `None` when
    /// the capture holds no [`Latency`] record.
    pub fn latencies(&self, opts: &Options) -> Option<Latencies> {
        let mut record = self.latency.clone()?;
        // A histogram covers the whole recording: only --pid and --tid apply.
        let (pid, tid) = (opts.pid, opts.tid);
        record
            .histograms
            .retain(|h| pid.is_none_or(|p| p == h.pid) && tid.is_none_or(|t| t == h.tid));
        let start_ns = self.header.as_ref().map_or(0, |h| h.monotonic_start_ns);
        let calls: Vec<LatencyCall> = self
            .latency_calls
            .iter()
            .filter(|c| opts.keeps(start_ns, c.pid, c.tid, c.start_ns))
            .cloned()
            .collect();
        let threads = record.histograms.iter().map(|h| (h.pid, h.tid));
        let thread_names = threads
            .chain(calls.iter().map(|c| (c.pid, c.tid)))
            .map(|(pid, tid)| ((pid, tid), self.thread_name(pid, tid)))
            .collect();
        Some(Latencies {
            record,
            calls,
            thread_names,
            start_ns,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use lrec_format::{CaptureWriter, LatencyHistogram, Sample, ThreadName};

    /// Two latency records (the last one counts), calls in chunks of samples, and filters.
    #[test]
    fn latency_records_are_kept_and_filtered() {
        let header = Header {
            monotonic_start_ns: 1_000,
            ..Header::default()
        };
        let mut w = CaptureWriter::new(Vec::new(), &header).unwrap();
        let latency = |max_rate| Latency {
            max_rate,
            histograms: [(7, 7), (7, 8)]
                .map(|(pid, tid)| LatencyHistogram {
                    pid,
                    tid,
                    ..LatencyHistogram::default()
                })
                .to_vec(),
            ..Latency::default()
        };
        w.push(&Record::Latency(latency(1))).unwrap();
        let name = "app".to_string();
        w.push(
            &ThreadName {
                pid: 7,
                tid: 7,
                name,
            }
            .into(),
        )
        .unwrap();
        for (tid, start_ns) in [(7, 1_500), (8, 3_000)] {
            let call = LatencyCall {
                tid,
                pid: 7,
                start_ns,
                ..LatencyCall::default()
            };
            w.push(&Record::LatencyCall(call)).unwrap();
            w.push(&Sample::default().into()).unwrap();
        }
        w.flush().unwrap();
        w.push(&Record::Latency(latency(2))).unwrap();
        let capture = Capture::from_bytes(w.finish().unwrap()).unwrap();
        let meta = read_metadata(&capture);
        assert_eq!(meta.latency.as_ref().map(|l| l.max_rate), Some(2));
        assert_eq!(meta.latency_calls.len(), 2);

        let all = meta.latencies(&Options::default()).unwrap();
        assert_eq!((all.record.histograms.len(), all.calls.len()), (2, 2));
        assert_eq!(all.start_ns, 1_000);
        let names: Vec<&str> = all.thread_names.values().map(String::as_str).collect();
        assert_eq!(names, ["app", "[tid 8]"]);
        let opts = Options {
            tid: Some(8),
            ..Options::default()
        };
        let one = meta.latencies(&opts).unwrap();
        assert_eq!((one.record.histograms.len(), one.calls.len()), (1, 1));
        // --time keeps the calls that started in it, and every histogram.
        let opts = Options {
            time: Some("0..0.000001".parse().unwrap()),
            ..Options::default()
        };
        let early = meta.latencies(&opts).unwrap();
        assert_eq!((early.record.histograms.len(), early.calls.len()), (2, 1));
        assert!(Metadata::default().latencies(&opts).is_none());
    }
}

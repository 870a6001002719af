//! The BPF side of `--latency` and `--node-loop` (ebpf/latency.h): attaching and detaching
//! the uprobes that time calls, and reading what they counted.

use std::collections::HashMap;
use std::path::Path;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachPoint, UProbeLinkId, UProbeScope};
use aya::programs::UProbe;
use lrec_format::{LatencyCall, LatencyHistogram};

use super::{Sampler, SamplerError};

/// `LAT_MAX_PROBES` of ebpf/latency.h: probe ids and boundary events are below it.
pub const MAX_PROBES: u32 = 256;
/// Histogram buckets and (thread, probe) pairs BPF keeps.
pub const HIST_ENTRIES: u32 = 1 << 16;
pub const STAT_ENTRIES: u32 = 1 << 14;
/// `--latency-events`' ring buffer.
pub const EVENT_RING_BYTES: u32 = 8 << 20;

/// How a uprobe takes part in timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A function's entry and return: times `probe` (the cookie).
    Function { probe: u32 },
    /// A boundary event (index in `lat_marks`) at a function's entry, or its return.
    Mark { event: u32, at_return: bool },
}

/// What the BPF counters say about one probe (`enum` in ebpf/latency.h).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub hits: u64,
    pub unmatched: u64,
    pub abandoned: u64,
    pub too_deep: u64,
    pub dropped: u64,
}

const COUNTERS: u32 = 8;

/// `struct lat_mark` of ebpf/latency.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawMark {
    pub phase: u32,
    pub after: u32,
    pub iteration: u32,
    pub pad: u32,
}

/// `LAT_NONE`.
pub const NONE: u32 = u32::MAX;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct RawHistKey {
    tid: u32,
    probe: u16,
    bucket: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct RawStatKey {
    tid: u32,
    probe: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawStat {
    pid: u32,
    pad: u32,
    count: u64,
    sum_ns: u64,
    min_ns: u64,
    max_ns: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawEvent {
    probe: u32,
    pid: u32,
    tid: u32,
    pad: u32,
    start_ns: u64,
    duration_ns: u64,
}

// SAFETY: plain old data of u16/u32/u64 fields without padding (asserted below).
unsafe impl aya::Pod for RawMark {}
// SAFETY: as above.
unsafe impl aya::Pod for RawHistKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RawStatKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RawStat {}

/// The attached latency uprobes.
#[derive(Default)]
pub struct LatencyLinks {
    /// (probe or boundary event, program, link).
    links: Vec<(Role, &'static str, UProbeLinkId)>,
    events: Option<RingBuf<MapData>>,
}

impl Sampler {
    /// Attaches one latency uprobe at `file_offset` of the binary at `path`, for process
    /// `pid` only.
    pub fn attach_latency(
        &mut self,
        role: Role,
        path: &Path,
        file_offset: u64,
        pid: u32,
    ) -> Result<(), SamplerError> {
        // The return probe first, and detached last: every entry timed has its return
        // probe. (A uprobe on a function that runs hot takes long to add or remove: the
        // target's traps starve the kernel's lock on its memory map.)
        let (progs, cookie): (&[&'static str], u32) = match role {
            Role::Function { probe } => (&["lat_return", "lat_entry"], probe),
            Role::Mark {
                event,
                at_return: false,
            } => (&["lat_mark_entry"], event),
            Role::Mark {
                event,
                at_return: true,
            } => (&["lat_mark_return"], event),
        };
        let scope = match std::num::NonZeroU32::new(pid) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        for &prog in progs {
            let point = UProbeAttachPoint {
                location: file_offset.into(),
                cookie: Some(u64::from(cookie)),
            };
            let link = self
                .uprobe(prog)?
                .attach(point, path, scope)
                .map_err(SamplerError::Program)?;
            self.latency.links.push((role, prog, link));
        }
        Ok(())
    }

    /// Tells BPF what boundary event `event` ends.
    pub fn set_latency_mark(&mut self, event: u32, mark: RawMark) -> Result<(), SamplerError> {
        let map = self
            .ebpf
            .map_mut("lat_marks")
            .ok_or(SamplerError::MissingMap("lat_marks"))?;
        let mut marks =
            aya::maps::Array::<_, RawMark>::try_from(map).map_err(|source| SamplerError::Map {
                name: "lat_marks",
                source,
            })?;
        marks
            .set(event, mark, 0)
            .map_err(|source| SamplerError::Map {
                name: "lat_marks",
                source,
            })
    }

    /// Detaches every latency uprobe for which `which` holds.
    pub fn detach_latency(&mut self, which: impl Fn(Role) -> bool) {
        let (gone, kept) = std::mem::take(&mut self.latency.links)
            .into_iter()
            .partition::<Vec<_>, _>(|(role, _, _)| which(*role));
        self.latency.links = kept;
        for (_, prog, link) in gone.into_iter().rev() {
            if let Some(Ok(p)) = self.ebpf.program_mut(prog).map(<&mut UProbe>::try_from) {
                let _ = p.detach(link);
            }
        }
    }

    /// The BPF counters of probes `0..n`, summed over the CPUs.
    pub fn latency_counters(&self, n: u32) -> Vec<Counters> {
        let Some(Ok(map)) = self
            .ebpf
            .map("lat_counters")
            .map(PerCpuArray::<_, u64>::try_from)
        else {
            return vec![Counters::default(); n as usize];
        };
        let get = |i: u32| map.get(&i, 0).map_or(0, |v| v.iter().sum::<u64>());
        (0..n.min(MAX_PROBES))
            .map(|p| {
                let c = |k: u32| get(p * COUNTERS + k);
                Counters {
                    hits: c(0),
                    unmatched: c(1),
                    abandoned: c(2),
                    too_deep: c(3),
                    dropped: c(4),
                }
            })
            .collect()
    }

    /// Per thread and probe, the durations BPF counted.
    pub fn latency_histograms(&self) -> Vec<LatencyHistogram> {
        let mut out: HashMap<(u32, u32), LatencyHistogram> = HashMap::new();
        if let Some(Ok(stats)) = self
            .ebpf
            .map("lat_stats")
            .map(BpfHashMap::<_, RawStatKey, RawStat>::try_from)
        {
            for (k, s) in stats.iter().filter_map(Result::ok) {
                out.insert(
                    (k.tid, k.probe),
                    LatencyHistogram {
                        probe: k.probe,
                        pid: s.pid,
                        tid: k.tid,
                        count: s.count,
                        sum_ns: s.sum_ns,
                        min_ns: s.min_ns,
                        max_ns: s.max_ns,
                        buckets: Vec::new(),
                    },
                );
            }
        }
        if let Some(Ok(hist)) = self
            .ebpf
            .map("lat_hist")
            .map(BpfHashMap::<_, RawHistKey, u64>::try_from)
        {
            for (k, n) in hist.iter().filter_map(Result::ok) {
                if let Some(h) = out.get_mut(&(k.tid, u32::from(k.probe))) {
                    h.buckets.push((k.bucket, n));
                }
            }
        }
        let mut out: Vec<LatencyHistogram> = out.into_values().collect();
        for h in &mut out {
            h.buckets.sort_unstable();
        }
        out.sort_by_key(|h| (h.probe, h.pid, h.tid));
        out
    }

    /// Hands each timed call BPF wrote since the last call (`--latency-events`) to `f`.
    pub fn drain_latency_events(&mut self, mut f: impl FnMut(LatencyCall)) {
        if self.latency.events.is_none() {
            self.latency.events = self
                .ebpf
                .take_map("lat_events")
                .and_then(|m| RingBuf::try_from(m).ok());
        }
        let Some(ring) = &mut self.latency.events else {
            return;
        };
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<RawEvent>() {
                continue;
            }
            // SAFETY: RawEvent is plain old data and the record is at least its size.
            let e: RawEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            f(LatencyCall {
                probe: e.probe,
                pid: e.pid,
                tid: e.tid,
                start_ns: e.start_ns,
                duration_ns: e.duration_ns,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_ebpf_sample_h() {
        assert_eq!(size_of::<RawHistKey>(), 8);
        assert_eq!(offset_of!(RawHistKey, bucket), 6);
        assert_eq!(size_of::<RawStatKey>(), 8);
        assert_eq!(size_of::<RawStat>(), 40);
        assert_eq!(offset_of!(RawStat, max_ns), 32);
        assert_eq!(size_of::<RawEvent>(), 32);
        assert_eq!(offset_of!(RawEvent, duration_ns), 24);
        assert_eq!(size_of::<RawMark>(), 16);
    }
}

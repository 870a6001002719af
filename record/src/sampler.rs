//! Loads ebpf/sample.bpf.c, opens one cpu-clock event per CPU, and drains the ring buffer.
//! All BPF and perf_event system calls of lrec happen here.

use std::os::fd::AsRawFd;
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::PerfEvent;
use aya::{Ebpf, EbpfLoader};

static SAMPLE_BPF: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sample.bpf.o"));

/// What to sample.
pub struct SamplerConfig {
    pub pid: u32,
    pub frequency_hz: u64,
    pub stack_size: u32,
    /// Ring buffer bytes (a power of two, at least a page).
    pub ring_bytes: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("loading the BPF program failed")]
    Load(#[source] aya::EbpfError),
    #[error("the BPF program was rejected")]
    Program(#[source] aya::programs::ProgramError),
    #[error("opening a cpu-clock perf event on CPU {cpu} failed")]
    Attach {
        cpu: u32,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("BPF map `{0}` is missing from the object")]
    MissingMap(&'static str),
    #[error("BPF map `{name}` is unusable")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("listing online CPUs ({0}) failed")]
    Cpus(String, #[source] std::io::Error),
    #[error("poll on the ring buffer failed")]
    Poll(#[source] std::io::Error),
}

/// A loaded, attached sampler. Dropping it detaches everything.
pub struct Sampler {
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
}

impl Sampler {
    pub fn attach(cfg: &SamplerConfig) -> Result<Sampler, SamplerError> {
        let cpus = aya::util::online_cpus().map_err(|(f, e)| SamplerError::Cpus(f.into(), e))?;
        let ncpu = aya::util::nr_cpus().map_err(|(f, e)| SamplerError::Cpus(f.into(), e))?;
        let wakeup_bytes = (cfg.ring_bytes / 4) as u64;
        let mut ebpf = EbpfLoader::new()
            .override_global("target_tgid", &cfg.pid, true)
            .override_global("stack_size", &cfg.stack_size, true)
            .override_global("wakeup_bytes", &wakeup_bytes, true)
            .map_max_entries("scratch", ncpu as u32)
            .map_max_entries("samples", cfg.ring_bytes)
            .load(SAMPLE_BPF)
            .map_err(SamplerError::Load)?;
        let prog: &mut PerfEvent = ebpf
            .program_mut("sample")
            .expect("sample program is in the object")
            .try_into()
            .map_err(SamplerError::Program)?;
        prog.load().map_err(SamplerError::Program)?;
        // One event per CPU with a tgid filter in BPF: this also covers threads created
        // after attach, which per-thread events would miss.
        for cpu in cpus {
            prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(cfg.frequency_hz),
                false,
            )
            .map_err(|source| SamplerError::Attach { cpu, source })?;
        }
        let ring = take(&mut ebpf, "samples", RingBuf::try_from)?;
        let lost = take(&mut ebpf, "lost", PerCpuArray::try_from)?;
        Ok(Sampler {
            _ebpf: ebpf,
            ring,
            lost,
        })
    }

    /// Waits up to `timeout` for samples, then hands every pending record to `f`.
    /// Returns the number of records.
    pub fn poll(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&[u8]),
    ) -> Result<usize, SamplerError> {
        let mut pfd = libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(SamplerError::Poll(e));
            }
        }
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            f(&item);
            n += 1;
        }
        Ok(n)
    }

    /// Samples dropped by BPF so far because the ring buffer was full.
    pub fn lost(&self) -> u64 {
        self.lost
            .get(&0, 0)
            .map(|v| v.iter().sum())
            .unwrap_or_default()
    }
}

fn take<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    conv: impl FnOnce(aya::maps::Map) -> Result<M, aya::maps::MapError>,
) -> Result<M, SamplerError> {
    let map = ebpf.take_map(name).ok_or(SamplerError::MissingMap(name))?;
    conv(map).map_err(|source| SamplerError::Map { name, source })
}

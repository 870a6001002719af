//! Loads ebpf/sample.bpf.c, opens one cpu-clock event per CPU, and drains the ring buffer.
//! All BPF and perf_event system calls of lrec happen here.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::uprobe::{UProbeLinkId, UProbeScope};
use aya::programs::{BtfTracePoint, Iter, PerfEvent, UProbe};
use aya::Btf;
use aya::{Ebpf, EbpfLoader};

use crate::raw::{RawLuaConfig, RawPucConfig};

mod frees;
mod latency;
mod off_cpu;
pub use latency::{RawMark, Role, MAX_PROBES as MAX_LATENCY_PROBES, NONE as NO_PROBE};
pub use off_cpu::ThreadOffCpu;

static SAMPLE_BPF: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sample.bpf.o"));
static LOADER_BPF: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/loader.bpf.o"));

/// What to sample.
pub struct SamplerConfig {
    /// The processes to record from the start.
    pub pids: Vec<u32>,
    /// Also record the processes they fork.
    pub follow_children: bool,
    pub frequency_hz: u64,
    pub stack_size: u32,
    /// Ring buffer bytes (a power of two, at least a page).
    pub ring_bytes: u32,
    /// The target's dynamic loaders (ld.so), watched for newly mapped libraries.
    pub loaders: Vec<PathBuf>,
    /// Record blocked intervals of at least this many nanoseconds (`--off-cpu`).
    pub off_cpu_min_ns: Option<u64>,
    /// Trace system calls and load the thread-state iterator (`--states`).
    pub states: bool,
    /// Time calls (`--latency`, `--node-loop`); `Some(true)`: also write each call
    /// (`--latency-events`).
    pub latency: Option<bool>,
    /// Lua walkers' configurations known before sampling starts (an attached target's
    /// interpreters), installed before the first sample.
    pub lua: Vec<(u32, RawLuaConfig)>,
    pub puc: Vec<(u32, RawPucConfig)>,
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
    #[error("reading the kernel's BTF failed: {0}")]
    Btf(String),
    #[error("found no dynamic loader to watch")]
    NoLoader,
    #[error("creating a task iterator (thread states, off-CPU totals) failed")]
    Iter(#[source] aya::programs::links::LinkError),
    #[error("reading a task iterator (thread states, off-CPU totals) failed")]
    States(#[source] std::io::Error),
    #[error("poll on the ring buffer failed")]
    Poll(#[source] std::io::Error),
}

/// A record taken from the BPF ring buffers.
pub enum Drained<'a> {
    /// `struct lrec_sample` and its data.
    Sample(&'a [u8]),
    /// `struct lrec_lua_proto`.
    LuaProto(&'a [u8]),
}

/// A loaded, attached sampler. Dropping it detaches everything.
pub struct Sampler {
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    lua_config: BpfHashMap<MapData, u32, RawLuaConfig>,
    puc_config: BpfHashMap<MapData, u32, RawPucConfig>,
    /// The cpu-clock events, one per CPU, until [`Sampler::stop_sampling`].
    ticks: Vec<aya::programs::perf_event::PerfEventLinkId>,
    frequency_hz: u64,
    lua_protos: RingBuf<MapData>,
    _targets: BpfHashMap<MapData, u32, u32>,
    loader: Option<LoaderWatch>,
    /// The uprobes timing Lua coroutine waits, and the yield count last read and when.
    lua_wait_links: Vec<(&'static str, UProbeLinkId)>,
    lua_yield_rate: Option<(Instant, u64)>,
    lua_waits_stopped: Option<f64>,
    latency: latency::LatencyLinks,
    /// When the last [`Sampler::wait`] returned (CLOCK_MONOTONIC ns).
    woke_ns: u64,
    /// The recording's window (CLOCK_MONOTONIC ns; the end 0 until known): sampler/off_cpu.rs.
    window: (u64, u64),
}

/// ebpf/loader.bpf.c: wakes lrec when the target's dynamic loader has mapped libraries.
struct LoaderWatch {
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
}

impl LoaderWatch {
    /// Loads with the sampler's loader (each `EbpfLoader::new` parses the kernel's BTF),
    /// which sets its `target_tgid`.
    fn attach(bpf: &mut EbpfLoader, loaders: &[PathBuf]) -> Result<LoaderWatch, SamplerError> {
        let mut ebpf = bpf.load(LOADER_BPF).map_err(SamplerError::Load)?;
        let probe: &mut UProbe = ebpf
            .program_mut("dl_debug_state")
            .expect("program is in the object")
            .try_into()
            .map_err(SamplerError::Program)?;
        probe.load().map_err(SamplerError::Program)?;
        let mut attached = 0;
        for path in loaders {
            match probe.attach("_dl_debug_state", path, UProbeScope::AllProcesses) {
                Ok(_) => attached += 1,
                Err(e) => eprintln!("lrec: warning: no uprobe on {}: {e}", path.display()),
            }
        }
        if attached == 0 {
            return Err(SamplerError::NoLoader);
        }
        let ring = take(&mut ebpf, "loader_events", RingBuf::try_from)?;
        Ok(LoaderWatch { _ebpf: ebpf, ring })
    }
}

impl Sampler {
    pub fn attach(cfg: &SamplerConfig) -> Result<Sampler, SamplerError> {
        // Parsing the kernel's BTF costs ~80 ms, and `EbpfLoader::new` parses it for
        // itself: one loader serves both objects (their globals need not all exist in
        // each), while the copy the tracepoints need is parsed on another CPU.
        let btf = std::thread::spawn(|| {
            crate::priority::nice_high();
            Btf::from_sys_fs()
        });
        // lrec's start waits for it: in the start's class from its first instruction.
        crate::priority::realtime_from_parent(std::os::unix::thread::JoinHandleExt::as_pthread_t(
            &btf,
        ));
        let globals = Globals::new(cfg)?;
        let mut bpf = EbpfLoader::new();
        let mut ebpf = globals.load(&mut bpf, cfg)?;
        let btf = btf
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
            .map_err(|e| SamplerError::Btf(e.to_string()))?;
        let mut targets: BpfHashMap<MapData, u32, u32> =
            take(&mut ebpf, "targets", BpfHashMap::try_from)?;
        for &pid in &cfg.pids {
            targets
                .insert(pid, 1, 0)
                .map_err(|source| SamplerError::Map {
                    name: "targets",
                    source,
                })?;
        }
        attach_tracing(&mut ebpf, &btf, cfg)?;
        // Maps taken before sampling starts: mapping the rings takes a while (~0.1 s).
        let ring = take(&mut ebpf, "samples", RingBuf::try_from)?;
        let lost = take(&mut ebpf, "lost", PerCpuArray::try_from)?;
        let lua_protos = take(&mut ebpf, "lua_protos", RingBuf::try_from)?;
        let mut lua_config = take(&mut ebpf, "lua_config", BpfHashMap::try_from)?;
        let mut puc_config = take(&mut ebpf, "puc_config", BpfHashMap::try_from)?;
        for (pid, c) in &cfg.lua {
            insert_config(&mut lua_config, "lua_config", *pid, c)?;
        }
        for (pid, c) in &cfg.puc {
            insert_config(&mut puc_config, "puc_config", *pid, c)?;
        }
        // A static program has no loader and nothing to watch. Its uprobe takes ~0.1 s
        // to add: before sampling starts, so that no sample waits for it.
        let loader = match LoaderWatch::attach(&mut bpf, &cfg.loaders) {
            Ok(w) => Some(w),
            Err(SamplerError::NoLoader) if cfg.loaders.is_empty() => None,
            Err(e) => {
                eprintln!(
                    "lrec: warning: cannot watch the dynamic loader ({e}); libraries loaded \
                     less than 0.1 s before the target exits may be missing"
                );
                None
            }
        };
        drop(bpf);
        // Freeing the parsed BTF takes ~80 ms: not on the way to the first sample, nor
        // while sampling without the Lua walkers' configurations. Both parses (~10 MB
        // each, in small pieces) are freed then: their pages go back, rather than stay
        // lrec's for its lifetime.
        std::thread::spawn(move || {
            drop(btf);
            // SAFETY: malloc_trim has no preconditions.
            unsafe { libc::malloc_trim(0) };
        });
        load_sampler(&mut ebpf)?;
        Ok(Sampler {
            ebpf,
            ticks: Vec::new(),
            frequency_hz: cfg.frequency_hz,
            ring,
            lost,
            lua_config,
            puc_config,
            lua_protos,
            _targets: targets,
            loader,
            lua_wait_links: Vec::new(),
            lua_yield_rate: None,
            lua_waits_stopped: None,
            latency: Default::default(),
            woke_ns: 0,
            window: (0, 0),
        })
    }

    /// Starts taking samples: the cpu-clock events of every CPU, at the rate asked for
    /// (after the configurations known so far are in place: the first samples walk with
    /// them).
    pub fn start_sampling(&mut self) -> Result<(), SamplerError> {
        if self.ticks.is_empty() {
            self.start_window()?;
            self.ticks = start_ticks(&mut self.ebpf, self.frequency_hz)?;
        }
        Ok(())
    }

    /// Stops taking samples (the recording's duration is over) and closes the recording's
    /// window: what the ring holds can still be drained. Other probes (off-CPU, latency)
    /// stay until the sampler is dropped.
    pub fn stop_sampling(&mut self) {
        self.close_window();
        let Ok(prog) = <&mut PerfEvent>::try_from(
            self.ebpf
                .program_mut("sample")
                .expect("sample program is in the object"),
        ) else {
            return;
        };
        for link in self.ticks.drain(..) {
            // A failure leaves that CPU sampling a little longer, until lrec exits.
            let _ = prog.detach(link);
        }
    }

    /// Lets the BPF program walk the Lua stacks of process `pid` with this layout.
    pub fn set_lua_config(&mut self, pid: u32, cfg: &RawLuaConfig) -> Result<(), SamplerError> {
        insert_config(&mut self.lua_config, "lua_config", pid, cfg)
    }

    /// Starts generation `gen` of the Lua protos BPF copies out (ebpf/lua_protos.h,
    /// lua_proto_gen): each proto a frame names from now on is copied again, once.
    pub fn set_lua_proto_gen(&mut self, gen: u32) -> Result<(), SamplerError> {
        let name = "lua_proto_gen";
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(SamplerError::MissingMap(name))?;
        let mut map = aya::maps::Array::<_, u32>::try_from(map)
            .map_err(|source| SamplerError::Map { name, source })?;
        map.set(0, gen, 0)
            .map_err(|source| SamplerError::Map { name, source })
    }

    /// Times the waits of Lua coroutines that yield to C in the LuaJIT VM of binary
    /// `path` (--off-cpu): uprobes on its lua_yield and lua_resume (ebpf/lua_wait.h), for
    /// every process mapping it (BPF keeps the targets').
    pub fn probe_lua_waits(&mut self, path: &str) -> Result<(), SamplerError> {
        if self.lua_waits_stopped.is_some() {
            return Ok(());
        }
        for (prog, symbol) in [
            ("on_lua_yield", "lua_yield"),
            ("on_lua_resume", "lua_resume"),
        ] {
            let link = self
                .uprobe(prog)?
                .attach(symbol, path, UProbeScope::AllProcesses)
                .map_err(SamplerError::Program)?;
            self.lua_wait_links.push((prog, link));
        }
        Ok(())
    }

    /// The uprobe program `prog`, loaded the first time.
    fn uprobe(&mut self, prog: &str) -> Result<&mut UProbe, SamplerError> {
        let probe: &mut UProbe = self
            .ebpf
            .program_mut(prog)
            .expect("program is in the object")
            .try_into()
            .map_err(SamplerError::Program)?;
        if probe.fd().is_err() {
            probe.load().map_err(SamplerError::Program)?;
        }
        Ok(probe)
    }

    /// Stops timing Lua coroutine waits when the targets' coroutines yielded more than
    /// `max_rate` times a second over the last second (0: no limit): the rate, once.
    pub fn limit_lua_waits(&mut self, max_rate: u64) -> Option<f64> {
        if self.lua_wait_links.is_empty() || max_rate == 0 {
            return None;
        }
        let yields = self.per_cpu_sum("lua_yields", 0);
        let (at, before) = *self.lua_yield_rate.get_or_insert((Instant::now(), yields));
        let secs = at.elapsed().as_secs_f64();
        if secs < 1.0 {
            return None;
        }
        self.lua_yield_rate = Some((Instant::now(), yields));
        let rate = (yields - before) as f64 / secs;
        if rate <= max_rate as f64 {
            return None;
        }
        for (prog, link) in self.lua_wait_links.drain(..) {
            if let Some(Ok(p)) = self.ebpf.program_mut(prog).map(<&mut UProbe>::try_from) {
                let _ = p.detach(link);
            }
        }
        self.lua_waits_stopped = Some(rate);
        Some(rate)
    }

    /// The yield rate at which [`Sampler::limit_lua_waits`] stopped timing Lua waits.
    pub fn lua_waits_stopped(&self) -> Option<f64> {
        self.lua_waits_stopped
    }

    /// Element i of a per-CPU u64 array, summed over the CPUs (0 if unreadable).
    fn per_cpu_sum(&self, map: &str, i: u32) -> u64 {
        let Some(map) = self.ebpf.map(map) else {
            return 0;
        };
        let Ok(map) = PerCpuArray::<_, u64>::try_from(map) else {
            return 0;
        };
        map.get(&i, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Lua coroutine waits shorter than `--off-cpu-min`, counted in BPF: (count, ns).
    pub fn lua_waits_short(&self) -> (u64, u64) {
        (
            self.per_cpu_sum("lua_wait_short", 0),
            self.per_cpu_sum("lua_wait_short", 1),
        )
    }

    /// Lets the BPF program walk the PUC Lua stacks of process `pid` with this layout.
    pub fn set_puc_config(&mut self, pid: u32, cfg: &RawPucConfig) -> Result<(), SamplerError> {
        insert_config(&mut self.puc_config, "puc_config", pid, cfg)
    }

    /// Stops walking process `pid`'s LuaJIT (or, `puc`, PUC Lua) frames: the layout it was
    /// walked with while being proved was not. (A process gone took its entry along.)
    pub fn remove_lua_config(&mut self, pid: u32, puc: bool) {
        let _ = match puc {
            true => self.puc_config.remove(&pid),
            false => self.lua_config.remove(&pid),
        };
    }

    /// Waits up to `timeout` for samples, news from the loader, or `also` (the target's
    /// pidfd, readable when it exits) to become readable.
    pub fn wait(&mut self, timeout: Duration, also: Option<i32>) -> Result<(), SamplerError> {
        let mut fds = [self.ring.as_raw_fd(), -1, also.unwrap_or(-1)].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        if let Some(w) = &self.loader {
            fds[1].fd = w.ring.as_raw_fd();
        }
        // To the microsecond: poll's milliseconds, truncated, turned the last millisecond
        // before a thread-state read into a busy loop at lrec's high priority, and a
        // target thread woken on that CPU waited for it, read as runnable (10 % of a
        // sleeper's samples instead of its 2 %).
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: three valid pollfds (ppoll ignores a negative fd), a valid timespec, no
        // signal mask.
        let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), 3, &ts, std::ptr::null()) };
        self.woke_ns = crate::procfs::monotonic_ns();
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(SamplerError::Poll(e));
            }
        }
        Ok(())
    }

    /// Whether the target's loader mapped or unmapped libraries since the last call.
    pub fn mappings_changed(&mut self) -> bool {
        let Some(w) = &mut self.loader else {
            return false;
        };
        let mut changed = false;
        while w.ring.next().is_some() {
            changed = true;
        }
        changed
    }

    /// Hands every pending sample record to `f`, and before each the Lua protos BPF
    /// copied until then (a sample's new protos are copied before it is committed, so they
    /// all come before it).
    pub fn drain(&mut self, mut f: impl FnMut(Drained)) {
        while let Some(item) = self.ring.next() {
            while let Some(p) = self.lua_protos.next() {
                f(Drained::LuaProto(&p));
            }
            f(Drained::Sample(&item));
        }
    }

    /// Per BPF program that ran (the sampler first), its runs and total run time so far,
    /// when the kernel counts them (`sysctl kernel.bpf_stats_enabled=1`).
    pub fn bpf_cost(&self) -> Vec<(&'static str, u64, Duration)> {
        [
            "sample",
            "on_switch",
            "on_sys_exit",
            "on_sys_enter",
            "on_waking",
            "on_lua_yield",
            "on_lua_resume",
            "lat_entry",
            "lat_return",
            "lat_mark_entry",
            "lat_mark_return",
            "on_luajit_free",
            "on_puc_free",
        ]
        .into_iter()
        .filter_map(|name| {
            let info = self.ebpf.program(name)?.info().ok()?;
            (info.run_count() > 0).then(|| (name, info.run_count(), info.run_time()))
        })
        .collect()
    }

    /// Every recorded thread's state now, as `struct lrec_thread_state` records (empty
    /// without `--states`).
    pub fn thread_states(&mut self) -> Result<Vec<u8>, SamplerError> {
        // A thread woken on lrec's CPU since lrec woke and still waiting for it is read
        // in the state it was woken from (offcpu.h: waiting_for_reader_since).
        if let Some(map) = self.ebpf.map_mut("states_reader_awake_ns") {
            if let Ok(mut map) = aya::maps::Array::<_, u64>::try_from(map) {
                map.set(0, self.woke_ns, 0)
                    .map_err(|source| SamplerError::Map {
                        name: "states_reader_awake_ns",
                        source,
                    })?;
            }
        }
        self.run_iter("thread_states")
    }

    /// Runs the task iterator program `name` once, if it was loaded: what it wrote.
    fn run_iter(&mut self, name: &str) -> Result<Vec<u8>, SamplerError> {
        use std::io::Read;
        let Some(prog) = self.ebpf.program_mut(name) else {
            return Ok(Vec::new());
        };
        let it: &mut Iter = prog.try_into().map_err(SamplerError::Program)?;
        if it.fd().is_err() {
            return Ok(Vec::new());
        }
        // Each run of an iterator needs a link of its own: cheap at tens per second.
        let link = it.attach().map_err(SamplerError::Program)?;
        let link = it.take_link(link).map_err(SamplerError::Program)?;
        let mut file = link.into_file().map_err(SamplerError::Iter)?;
        let mut out = Vec::new();
        file.read_to_end(&mut out).map_err(SamplerError::States)?;
        Ok(out)
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

/// Installs a process's Lua walker configuration in BPF map `name`.
/// sample.bpf.c's globals and map sizes for a configuration (kept while its loader,
/// which borrows them, serves).
struct Globals {
    ncpu: u32,
    wakeup_bytes: u64,
    follow: u32,
    off_cpu_min: u64,
    attach_ns: u64,
    reader_tid: u32,
    lat_hist: u32,
    lat_stats: u32,
    lat_ring: u32,
    lat_events: u32,
}

impl Globals {
    fn new(cfg: &SamplerConfig) -> Result<Globals, SamplerError> {
        let ncpu = aya::util::nr_cpus().map_err(|(f, e)| SamplerError::Cpus(f.into(), e))?;
        // Without --latency its tables stay at one entry.
        let (lat_hist, lat_stats, lat_ring, lat_events) = match cfg.latency {
            None => (1, 1, 4096, 0u32),
            Some(events) => (
                latency::HIST_ENTRIES,
                latency::STAT_ENTRIES,
                if events {
                    latency::EVENT_RING_BYTES
                } else {
                    4096
                },
                u32::from(events),
            ),
        };
        Ok(Globals {
            ncpu: ncpu as u32,
            wakeup_bytes: (cfg.ring_bytes / 4) as u64,
            follow: u32::from(cfg.follow_children),
            off_cpu_min: cfg.off_cpu_min_ns.unwrap_or(0),
            attach_ns: crate::procfs::monotonic_ns(),
            // The thread that runs the recording loop reads the thread states.
            // SAFETY: gettid has no memory effects.
            reader_tid: unsafe { libc::gettid() } as u32,
            lat_hist,
            lat_stats,
            lat_ring,
            lat_events,
        })
    }

    /// sample.bpf.c loaded with them.
    fn load<'a>(
        &'a self,
        bpf: &mut EbpfLoader<'a>,
        cfg: &'a SamplerConfig,
    ) -> Result<Ebpf, SamplerError> {
        bpf
            // Task storage (per-thread off-CPU bookkeeping) has no aya wrapper; only BPF
            // uses it.
            .allow_unsupported_maps()
            .override_global("stack_size", &cfg.stack_size, false)
            .override_global("follow_children", &self.follow, false)
            .override_global("wakeup_bytes", &self.wakeup_bytes, false)
            .override_global("target_tgid", &cfg.pids[0], false)
            .override_global("off_cpu_min_ns", &self.off_cpu_min, false)
            .override_global("attach_ns", &self.attach_ns, false)
            .override_global("states_reader_tid", &self.reader_tid, false)
            .override_global("lat_events_on", &self.lat_events, false)
            .map_max_entries("lat_hist", self.lat_hist)
            .map_max_entries("lat_stats", self.lat_stats)
            .map_max_entries("lat_events", self.lat_ring)
            .map_max_entries("scratch", self.ncpu)
            .map_max_entries("lua_memos", 4 * self.ncpu)
            .map_max_entries("samples", cfg.ring_bytes)
            .load(SAMPLE_BPF)
            .map_err(SamplerError::Load)
    }
}

/// The tracepoints and task iterators `cfg` needs, loaded (and the tracepoints attached):
/// the targets' forks, exits and execs always, off-CPU and thread-state bookkeeping if asked.
fn attach_tracing(ebpf: &mut Ebpf, btf: &Btf, cfg: &SamplerConfig) -> Result<(), SamplerError> {
    // Processes forked by the targets join them (and leave the map when they exit); a
    // process that exits or execs has its protos' frees counted no more.
    let mut tracepoints = vec![
        ("on_fork", "sched_process_fork"),
        ("on_exit", "sched_process_exit"),
        ("on_exec", "sched_process_exec"),
    ];
    if cfg.off_cpu_min_ns.is_some() {
        tracepoints.push(("on_switch", "sched_switch"));
    }
    if cfg.off_cpu_min_ns.is_some() || cfg.states {
        tracepoints.push(("on_sys_exit", "sys_exit"));
    }
    let mut iters = Vec::new();
    if cfg.off_cpu_min_ns.is_some() {
        iters.extend(["open_window", "flush_totals"]);
    }
    if cfg.states {
        tracepoints.push(("on_sys_enter", "sys_enter"));
        tracepoints.push(("on_waking", "sched_waking"));
        iters.push("thread_states");
    }
    for name in iters {
        let it: &mut Iter = ebpf
            .program_mut(name)
            .expect("program is in the object")
            .try_into()
            .map_err(SamplerError::Program)?;
        it.load("task", btf).map_err(SamplerError::Program)?;
    }
    for (name, event) in tracepoints {
        let tp: &mut BtfTracePoint = ebpf
            .program_mut(name)
            .expect("program is in the object")
            .try_into()
            .map_err(SamplerError::Program)?;
        tp.load(event, btf).map_err(SamplerError::Program)?;
        tp.attach().map_err(SamplerError::Program)?;
    }
    Ok(())
}

/// Sampling starts: the cpu-clock events at `frequency_hz`, one per CPU, each with a tgid
/// filter in BPF (which also covers threads created later, which per-thread events would
/// miss).
/// The sampler program loaded (the verifier's work, most of lrec's start), not attached.
fn load_sampler(ebpf: &mut Ebpf) -> Result<(), SamplerError> {
    let prog: &mut PerfEvent = ebpf
        .program_mut("sample")
        .expect("sample program is in the object")
        .try_into()
        .map_err(SamplerError::Program)?;
    prog.load().map_err(SamplerError::Program)
}

fn start_ticks(
    ebpf: &mut Ebpf,
    frequency_hz: u64,
) -> Result<Vec<aya::programs::perf_event::PerfEventLinkId>, SamplerError> {
    let cpus = aya::util::online_cpus().map_err(|(f, e)| SamplerError::Cpus(f.into(), e))?;
    let prog: &mut PerfEvent = ebpf
        .program_mut("sample")
        .expect("sample program is in the object")
        .try_into()
        .map_err(SamplerError::Program)?;
    let mut ticks = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        let link = prog
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency_hz),
                false,
            )
            .map_err(|source| SamplerError::Attach { cpu, source })?;
        ticks.push(link);
    }
    Ok(ticks)
}

fn insert_config<V: aya::Pod>(
    map: &mut BpfHashMap<MapData, u32, V>,
    name: &'static str,
    pid: u32,
    cfg: &V,
) -> Result<(), SamplerError> {
    map.insert(pid, cfg, 0)
        .map_err(|source| SamplerError::Map { name, source })
}

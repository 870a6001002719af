//! The recording loop: drains samples from BPF, and writes them with the process's
//! mappings, thread names and binaries' unwind/symbol sections into the capture.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Result;
use lrec_format::{CaptureWriter, FormatError, Header, Lost, LostCauses, Record, ThreadName};

use crate::capture_file::{self, WriteFailed};
use crate::embedder::Embedder;
use crate::flight::Flight;
use crate::latency::Tracker;
use crate::learner::Learner;
use crate::lua::LuaVms;
use crate::output::Output;
use crate::procfs;
use crate::raw::{Decoded, RawSample};
use crate::sampler::{Drained, Sampler, SamplerConfig};
use crate::signals::{self, DUMP, STOP, STOP_SIGNAL};
use crate::target::{Exit, Target};

mod binaries;
pub mod config;
mod ending;
mod feature;
mod features;
mod frees;
mod heap;
mod held;
mod maps;
mod off_cpu;
mod threads;
mod timing;
mod vms;
use config::Config;
use ending::{Kallsyms, OffCpuSummary};
use feature::Feature;
use lrec_inspect::elf::DebugInfo;
use maps::Proc;
use vms::BinaryVm;

/// How often buffered samples are written out as a chunk: at most this much is lost if
/// lrec is killed.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The flight recorder's chunks: its window is kept to within this.
const FLIGHT_FLUSH_EVERY: Duration = Duration::from_millis(250);
/// At most this often is /proc/PID/maps re-read because a sample fell outside it.
const MAPS_MISS_REFRESH: Duration = Duration::from_millis(50);
/// Re-read /proc/PID/maps this often anyway: libraries that appear only in return
/// addresses (libc under a callback, ld.so's work right after exec) never cause a miss.
/// (Libraries ld.so maps are read at once: the loader uprobe reports them.)
const MAPS_REFRESH: Duration = Duration::from_millis(500);
/// The draining thread's run-queue time between two looks at the loss counter past which
/// the samples lost meanwhile count as lost to a starved drain, not to a small ring.
const STARVED_NS: u64 = 50_000_000;
/// How long after lrec first sees a thread its name is checked for a change.
const YOUNG_THREAD: Duration = Duration::from_secs(1);

/// Records until the target exits, -d ends or a signal; writes the capture to `output`
/// or, with `--flight`, the window to numbered files next to it.
/// Returns the sampler, still attached: see [`crate::exit_leaving_release`].
pub fn record(cfg: &Config, target: &mut Target, output: &Path) -> Result<Sampler> {
    let result = record_into(cfg, target, output);
    if cfg.flight_secs.is_some() {
        return result;
    }
    // Failing to write the capture file (a full disk) is said with the file's name.
    result.map_err(|e| match e.downcast::<FormatError>() {
        Ok(FormatError::Io(error)) => WriteFailed {
            path: output.to_path_buf(),
            error,
        }
        .into(),
        Ok(e) => e.into(),
        Err(e) => e,
    })
}

/// The recording's steps: the capture opened, the sampler attached, the target started
/// (or its layouts told), the loop, the end.
fn record_into(cfg: &Config, target: &mut Target, output: &Path) -> Result<Sampler> {
    let mut rec = open_capture(cfg, target, output)?;
    // A running target's mappings, and the Lua interpreters in them, are read before the
    // sampler starts: its first samples already carry Lua frames. A spawned command has
    // not run yet (its mappings are lrec's until it execs).
    let attached = !target.spawned();
    let pids = target.initial_pids(cfg.follow_children);
    if attached {
        for &pid in &pids {
            rec.add_process(pid)?;
        }
    }
    let mut sampler = match attach_sampler(cfg, target, &mut rec, &pids) {
        Ok(s) => s,
        Err(e) => {
            // Nothing was recorded: leave no empty capture behind.
            if cfg.flight_secs.is_none() {
                drop(rec);
                let _ = std::fs::remove_file(output);
            }
            return Err(e);
        }
    };
    rec.lua.sampling_started();
    // Started: the thread that drains leaves the realtime class (priority::realtime), and
    // the learner's too.
    crate::priority::realtime(false);
    rec.learner.relax();
    let mut features = features::wanted(cfg, attached);
    // `-d` counts from lrec's start: samples taken after it are not written, whatever
    // lrec was doing when its time came.
    let started = cfg.started;
    rec.deadline_ns = cfg.duration.map(|d| {
        let since = started.elapsed().as_nanos() as u64;
        procfs::monotonic_ns().saturating_sub(since) + d.as_nanos() as u64
    });
    // The recording's window opened as sampling started; `-d` closes it (off-CPU time
    // counts only inside it: sampler/off_cpu.rs).
    rec.window.start_ns = sampler.open_window(rec.deadline_ns, attached)?;
    // From here on a signal stops the recording, its capture finished: before, it ended
    // lrec at once (signals.rs).
    signals::started();
    target.start(&cfg.command)?;
    if !attached {
        for &pid in &pids {
            rec.add_process(pid)?;
        }
        install_lua_configs(&mut sampler, &mut rec)?;
    }
    rec.flush()?;
    for f in &mut features {
        f.on_start(&mut rec)?;
    }
    let reason = run(cfg, target, &mut sampler, &mut rec, &mut features, started)?;
    crate::priority::realtime(true);
    end(
        cfg,
        &mut sampler,
        rec,
        &mut features,
        &reason,
        started.elapsed(),
        output,
    )?;
    Ok(sampler)
}

/// The capture file (or the flight recorder's window) with its header, and the recording
/// that writes into it.
fn open_capture(cfg: &Config, target: &Target, output: &Path) -> Result<Recording> {
    let header = Header {
        tool_version: format!("lrec {}", env!("CARGO_PKG_VERSION")),
        kernel_release: procfs::kernel_release(),
        hostname: procfs::hostname(),
        arch: std::env::consts::ARCH.into(),
        page_size: procfs::page_size(),
        frequency_hz: cfg.frequency_hz as u32,
        event: "cpu-clock".into(),
        stack_size: cfg.stack_size,
        command_line: std::env::args().collect(),
        wall_clock_start_ns: procfs::realtime_ns(),
        monotonic_start_ns: procfs::monotonic_ns(),
        target_pid: target.pid,
    };
    let out_opts = lrec_inspect::files::OutputOptions {
        keep_partial: true,
        ..lrec_inspect::files::OutputOptions::for_invoking_user(cfg.force)
    };
    let sink = match cfg.flight_secs {
        Some(secs) => {
            let parent = output.parent().filter(|d| !d.as_os_str().is_empty());
            if let Some(dir) = parent.filter(|d| !d.is_dir()) {
                anyhow::bail!(
                    "no directory {} for the flight recorder's captures",
                    dir.display()
                );
            }
            let flight = Flight::new(secs, header.clone(), output.into(), out_opts);
            Output::Flight(Box::new(flight))
        }
        None => {
            let file = capture_file::create_capture(output, &out_opts)?;
            signals::starting(file.get_ref().path_in_progress());
            Output::File(file)
        }
    };
    let writer = CaptureWriter::new(sink, &header)?;
    let mut rec = Recording::new(cfg.debug, writer, cfg.debug_dir.clone());
    if let Some(l) = &cfg.latency {
        let tracker = Tracker::new(l.specs.clone(), l.node_loop, cfg.debug_dir.clone());
        rec.latency = Some(tracker);
    }
    Ok(rec)
}

/// The BPF programs loaded and attached for what `cfg` asks, sampling `pids`: the Lua
/// layouts the learner met while the programs loaded (an attached target's binaries,
/// mostly all of them) are in place before the first tick.
fn attach_sampler(
    cfg: &Config,
    target: &Target,
    rec: &mut Recording,
    pids: &[u32],
) -> Result<Sampler> {
    let ring_bytes = cfg.ring_mib() << 20;
    rec.lost_causes.ring_bytes = u64::from(ring_bytes);
    let mut sampler = Sampler::attach(&SamplerConfig {
        pids: pids.to_vec(),
        follow_children: cfg.follow_children,
        frequency_hz: cfg.frequency_hz,
        stack_size: cfg.stack_size,
        ring_bytes,
        loaders: target.loaders(&cfg.command),
        off_cpu_min_ns: cfg.off_cpu.as_ref().map(|o| o.min_ns),
        states: cfg.states_hz.is_some(),
        latency: cfg.latency.as_ref().map(|l| l.events),
        lua: rec.lua.take_configs(),
        puc: rec.lua.take_puc_configs(),
    })?;
    rec.take_learned();
    install_lua_configs(&mut sampler, rec)?;
    sampler.start_sampling()?;
    Ok(sampler)
}

/// The recording loop: wakes when samples wait (or a feature's time comes, or at the
/// latest every 100 ms), takes them in, lets each feature do its part; until a signal,
/// `-d`, the target's end or a feature's work is done. Returns why it ended.
fn run(
    cfg: &Config,
    target: &mut Target,
    sampler: &mut Sampler,
    rec: &mut Recording,
    features: &mut [Box<dyn Feature>],
    started: Instant,
) -> Result<String> {
    let flush_every = match cfg.flight_secs {
        Some(_) => FLIGHT_FLUSH_EVERY,
        None => FLUSH_EVERY,
    };
    let status = !cfg.quiet && std::io::stderr().is_terminal();
    let (mut last_flush, mut last_status) = (Instant::now(), Instant::now());
    // This thread drains the ring at the highest priority of its class (main.rs): a
    // target that saturates the CPUs must not starve it, or the ring fills and samples
    // are lost. (The embedding and symbol threads yield to the target.)
    let reason = loop {
        // While a binary is being met or a LuaJIT layout told, the loop looks every 5 ms
        // rather than when the ring fills: until it is known, samples carry no Lua frames.
        let tick = match rec.lua.detecting() || rec.learner.busy() {
            true => Duration::from_millis(5),
            false => Duration::from_millis(100),
        };
        let tick = features
            .iter()
            .filter_map(|f| f.due_in())
            .fold(tick, Duration::min);
        sampler.wait(tick, target.pidfd())?;
        for f in features.iter_mut() {
            f.on_wake(sampler, rec)?;
        }
        after_wait(sampler, rec)?;
        rec.note_lost(sampler.lost())?;
        rec.refresh_maps_every(MAPS_REFRESH)?;
        rec.rename_young_threads()?;
        rec.write_embedded(false)?;
        install_lua_configs(sampler, rec)?;
        for f in features.iter_mut() {
            f.on_tick(sampler, rec)?;
        }
        for msg in rec.lua.messages.drain(..) {
            eprintln!("lrec: {msg}");
        }
        if last_flush.elapsed() >= flush_every {
            rec.flush()?;
            last_flush = Instant::now();
        }
        if DUMP.swap(false, Ordering::Relaxed) && !dumped(features, rec)? {
            eprintln!(
                "lrec: SIGUSR1 does nothing without --flight or --lua-heap; recording goes on"
            );
        }
        if let Some(why) = features.iter().find_map(|f| f.done()) {
            break why.to_string();
        }
        if status && last_status.elapsed() >= Duration::from_secs(1) {
            rec.print_status(started.elapsed());
            last_status = Instant::now();
        }
        if let Some(why) = stopped(cfg, target, started) {
            if why == "duration" {
                for f in features.iter_mut() {
                    f.on_duration(rec)?;
                }
            }
            break why;
        }
    };
    if status {
        eprint!("\r\x1b[K");
    }
    Ok(reason)
}

/// SIGUSR1 handed to the features: whether one acted on it.
fn dumped(features: &mut [Box<dyn Feature>], rec: &mut Recording) -> Result<bool> {
    for f in features {
        if f.on_dump(rec)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Why the recording stops now, if it does: a signal, `-d`, the target's end.
fn stopped(cfg: &Config, target: &mut Target, started: Instant) -> Option<String> {
    if STOP.load(Ordering::Relaxed) {
        let sig = STOP_SIGNAL.load(Ordering::Relaxed);
        return Some(format!("signal {sig}"));
    }
    if cfg.duration.is_some_and(|d| started.elapsed() >= d) {
        return Some("duration".to_string());
    }
    if crate::memory::at_ceiling() {
        return Some(format!(
            "lrec's memory reached its ceiling ({} MiB)",
            crate::memory::CEILING >> 20
        ));
    }
    target.exited().map(|exit| match exit {
        Exit::Code(c) => format!("target exited with status {c}"),
        Exit::Signal(s) => format!("target killed by signal {s}"),
        Exit::Gone => "target exited".to_string(),
    })
}

/// No more samples; what the last moments left in the ring buffer is written, whatever
/// ended the recording, then each feature's part, the capture's end and the summaries.
fn end(
    cfg: &Config,
    sampler: &mut Sampler,
    mut rec: Recording,
    features: &mut [Box<dyn Feature>],
    reason: &str,
    elapsed: Duration,
    output: &Path,
) -> Result<()> {
    sampler.stop_sampling();
    rec.window.end_ns = sampler.window().1;
    rec.learner.stop();
    drain(sampler, &mut rec)?;
    for f in features.iter_mut() {
        f.on_stop(sampler, &mut rec)?;
    }
    rec.note_lost(sampler.lost())?;
    let bpf_cost = sampler.bpf_cost();
    if cfg.flight_secs.is_some() {
        rec.dump(reason)?;
        if !cfg.quiet {
            rec.print_flight_summary(elapsed, reason);
        }
        return Ok(());
    }
    for f in features.iter_mut() {
        f.finish(sampler, &mut rec)?;
    }
    let summary = rec.finish(reason)?;
    if !cfg.quiet {
        summary.print(elapsed, reason, output, bpf_cost);
        for f in features.iter() {
            f.print_summary(elapsed);
        }
    }
    Ok(())
}

/// What each wake-up does first: the loader's news, then the samples.
fn after_wait(sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
    if sampler.mappings_changed() {
        rec.refresh_all_maps()?;
    }
    // The binaries met meanwhile first: their VMs' samples are held from now on.
    rec.take_learned();
    install_lua_configs(sampler, rec)?;
    drain(sampler, rec)?;
    install_lua_configs(sampler, rec)
}

/// Hands the BPF walkers the Lua VM configurations that became known.
fn install_lua_configs(sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
    for (pid, cfg) in rec.lua.take_configs() {
        sampler.set_lua_config(pid, &cfg)?;
    }
    for (pid, cfg) in rec.lua.take_puc_configs() {
        sampler.set_puc_config(pid, &cfg)?;
    }
    for (pid, puc) in rec.lua.take_removed() {
        sampler.remove_lua_config(pid, puc);
    }
    rec.count_proto_frees(sampler);
    if let Some(gen) = rec.lua.turn_generation() {
        sampler.set_lua_proto_gen(gen)?;
    }
    Ok(())
}

/// Writes every sample waiting in the ring buffer; stops at the first that fails.
fn drain(sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
    let mut failure = None;
    sampler.drain(|record| match record {
        Drained::Sample(bytes) if failure.is_none() => failure = rec.on_sample(bytes).err(),
        Drained::Sample(_) => {}
        Drained::LuaProto(bytes) => rec.lua.on_proto(bytes),
    });
    failure.map_or(Ok(()), Err)?;
    // The samples of processes whose layouts these samples proved (or not).
    rec.release_held(false)
}

struct Recording {
    debug: DebugInfo,
    writer: CaptureWriter<Output>,
    procs: HashMap<u32, Proc>,
    /// Build-id per mapped file, keyed by (dev, inode, path).
    build_ids: HashMap<(u32, u32, u64, String), Option<Vec<u8>>>,
    /// Binaries embedded or queued, by build-id or by path when there is none.
    embedded: HashSet<Vec<u8>>,
    embedder: Embedder,
    kernel_addrs: HashSet<u64>,
    /// Lua interpreters found in embedded binaries, by binary key, with the binary's
    /// segments (to place them in each mapping).
    /// A binary whose Lua version string shows a VM that could not be located holds the
    /// reason instead.
    vms: HashMap<Vec<u8>, BinaryVm>,
    /// Where separate debug files are (`--debug-dir`).
    debug_dir: std::path::PathBuf,
    /// Binaries already looked at for an interpreter, by key.
    vm_checked: HashSet<Vec<u8>>,
    lua: LuaVms,
    /// The VMs' proto free functions, probed to count each process's freed protos.
    proto_frees: frees::ProtoFrees,
    /// /proc/kallsyms, read on a thread while recording (it takes ~0.1 s), then kept.
    kallsyms: Kallsyms,
    samples: u64,
    /// Threads first seen less than [`YOUNG_THREAD`] ago: (pid, tid, when).
    young: Vec<(u32, u32, Instant)>,
    off_cpu_summary: Option<OffCpuSummary>,
    /// Off-CPU intervals recorded with stacks, and thread-state samples taken.
    off_cpu: u64,
    /// Of the off-CPU records, Lua coroutine waits.
    lua_waits: u64,
    state_samples: u64,
    lost: u64,
    lost_causes: LostCauses,
    /// The draining thread's schedstat (it makes the recording), and its time on the run
    /// queue when it last looked at the losses.
    schedstat: procfs::Reread,
    runqueue_ns: u64,
    /// `--latency`, `--node-loop`.
    latency: Option<Tracker>,
    /// When `-d` runs out (CLOCK_MONOTONIC ns), and the samples taken after it, dropped.
    deadline_ns: Option<u64>,
    /// The recording's window: its start, its end once sampling stopped, the off-CPU
    /// intervals it cut (ending.rs writes it).
    window: lrec_format::OffCpuWindow,
    /// The thread that meets new binaries: their Lua VMs and layouts.
    learner: Learner,
    /// Samples held while their process's Lua layout is proved.
    held: held::HeldSamples,
    /// Binaries embedded without their DWARF to keep lrec's memory under its ceiling.
    dwarf_shed: u64,
    late: u64,
    /// `--lua-heap`: VMs snapshotted so far.
    heap_vms: u32,
}

impl Recording {
    fn new(
        debug: DebugInfo,
        writer: CaptureWriter<Output>,
        debug_dir: std::path::PathBuf,
    ) -> Recording {
        let mut schedstat = procfs::Reread::open("/proc/thread-self/schedstat");
        let runqueue_ns = procfs::runqueue_wait_ns(&mut schedstat);
        let debug_dir_for_learner = debug_dir.clone();
        Recording {
            debug_dir,
            debug,
            writer,
            procs: HashMap::new(),
            build_ids: HashMap::new(),
            embedded: HashSet::new(),
            embedder: Embedder::new(),
            kernel_addrs: HashSet::new(),
            vms: HashMap::new(),
            vm_checked: HashSet::new(),
            lua: LuaVms::default(),
            proto_frees: frees::ProtoFrees::default(),
            kallsyms: Kallsyms::load(),
            samples: 0,
            young: Vec::new(),
            off_cpu_summary: None,
            off_cpu: 0,
            lua_waits: 0,
            state_samples: 0,
            lost: 0,
            lost_causes: LostCauses::default(),
            schedstat,
            runqueue_ns,
            latency: None,
            deadline_ns: None,
            window: Default::default(),
            learner: Learner::new(debug_dir_for_learner),
            held: held::HeldSamples::default(),
            dwarf_shed: 0,
            late: 0,
            heap_vms: 0,
        }
    }

    /// Writes a process, its threads and its mappings as they are now.
    fn add_process(&mut self, pid: u32) -> Result<()> {
        self.procs.insert(pid, Proc::default());
        match procfs::read_process(pid) {
            Ok(process) => self.writer.push(&Record::Process(process))?,
            // A child gone before it was seen: its samples keep what is known.
            Err(_) if self.procs.len() > 1 => {}
            Err(e) => return Err(e.into()),
        }
        for tid in procfs::threads(pid) {
            self.note_thread(pid, tid)?;
        }
        self.refresh_maps(pid)?;
        Ok(())
    }

    fn on_sample(&mut self, bytes: &[u8]) -> Result<()> {
        let Decoded {
            sample,
            lua: walk,
            off_cpu,
        } = RawSample::decode(bytes)?;
        if self.deadline_ns.is_some_and(|d| sample.time_ns > d) && off_cpu.is_none() {
            // Taken after `-d` ran out, while lrec was still busy: not part of the recording
            // (a memo its walk made is kept: an off-CPU stack may name it).
            self.late += 1;
            self.lua.keep_memo(&sample, walk);
            return Ok(());
        }
        let pid = sample.pid;
        // The process's mappings and threads are read while they surely exist.
        self.note_sampled(pid, sample.tid, sample.regs.ip)?;
        self.kernel_addrs.extend(&sample.kernel_stack);
        let walk = self.lua.observe(&sample, walk);
        self.hold_or_write(sample, walk, off_cpu)
    }

    /// A sample or state of thread `tid` of `pid` (at user address `ip`, 0 if unknown):
    /// its process, name and mappings are written first when they are new.
    fn note_sampled(&mut self, pid: u32, tid: u32, ip: u64) -> Result<()> {
        // Usually one lookup: the process and thread are known.
        if !self.procs.contains_key(&pid) {
            // A process forked by a target since the last look.
            self.add_process(pid)?;
        }
        let p = &self.procs[&pid];
        let (new_thread, stale) = (!p.threads.contains_key(&tid), p.maps_miss(ip));
        if new_thread {
            self.note_thread(pid, tid)?;
        }
        if stale {
            self.refresh_maps(pid)?;
        }
        Ok(())
    }

    fn note_thread(&mut self, pid: u32, tid: u32) -> Result<()> {
        let name = procfs::thread_name(pid, tid).unwrap_or_default();
        if let Some(p) = self.procs.get_mut(&pid) {
            p.threads.insert(tid, name.clone());
            self.young.push((pid, tid, Instant::now()));
        }
        if !name.is_empty() {
            self.writer
                .push(&Record::ThreadName(ThreadName { pid, tid, name }))?;
        }
        Ok(())
    }

    /// Writes the samples lost since the last call (`total` counted so far), and whether
    /// this thread, which drains the ring, waited for a CPU meanwhile (its run-queue time:
    /// the target saturated the machine) or not (the ring is too small for the rate).
    fn note_lost(&mut self, total: u64) -> Result<()> {
        let waited = procfs::runqueue_wait_ns(&mut self.schedstat);
        let late = waited.saturating_sub(std::mem::replace(&mut self.runqueue_ns, waited));
        let causes = &mut self.lost_causes;
        if total > self.lost {
            let count = total - self.lost;
            match late > STARVED_NS {
                true => causes.starved += count,
                false => causes.ring_full += count,
            }
            causes.worst_late_ns = causes.worst_late_ns.max(late);
            let lost = Lost {
                time_ns: procfs::monotonic_ns(),
                count,
            };
            // The flight recorder keeps the window's lost counts itself.
            match self.writer.get_mut().flight_mut() {
                Some(flight) => flight.note_lost(lost),
                None => self.writer.push(&Record::Lost(lost))?,
            }
            self.lost = total;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.writer.flush()?;
        if let Some(flight) = self.writer.get_mut().flight_mut() {
            flight.evict(procfs::monotonic_ns());
        }
        Ok(())
    }
}

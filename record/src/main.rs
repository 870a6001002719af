//! lrec: records a process with eBPF into a self-contained capture for lanalyze.

mod capture_file;
mod embedder;
mod flight;
mod heap;
mod kallsyms;
mod latency;
mod learner;
mod lua;
mod memory;
mod output;
mod priority;
mod procfs;
mod raw;
mod recorder;
mod sampler;
mod signals;
mod target;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Parser;

const EXAMPLES: &str = "\
EXAMPLES:
    Record a running process and its children for 30 s at the default 99 Hz
    (for nginx, give the master: its workers are recorded with it):
        sudo lrec -p $(cat /run/nginx.pid) -d 30 -o nginx.lrec

    Start a command and record it until it exits:
        sudo lrec -F 499 -o run.lrec -- luajit bench.lua

    Then, on this or any other machine:
        lanalyze run.lrec --flamegraph -o run.svg
        lanalyze run.lrec --top 20

    Flight recorder: keep the last 30 s in memory and write them when asked (the
    recording goes on), and once more when lrec stops or the target exits:
        sudo lrec -p 1234 --flight 30 -o incident.lrec &
        sudo kill -USR1 $!            # writes incident.1.lrec, then incident.2.lrec, …

Stop early with Ctrl-C: the capture is always finished and readable. If the disk fills
up, lrec stops with an error; the capture is readable up to its last complete chunk.
Captures are created with mode 0600 (they hold stack memory). lrec needs root (or
CAP_BPF + CAP_PERFMON) and a kernel with BTF (/sys/kernel/btf/vmlinux).";

/// Records a process's user registers, user stacks and kernel stacks with eBPF into one
/// compressed capture that lanalyze unwinds and symbolizes offline.
#[derive(Parser, Debug)]
#[command(name = "lrec", version = lrec_inspect::VERSION, after_help = EXAMPLES)]
#[command(group(clap::ArgGroup::new("target").args(["pid", "command"])))]
pub struct Args {
    /// Record these running processes (`-p 12,34`): all their threads, also ones created
    /// later, and the processes they fork (see --no-children).
    #[arg(
        short,
        long,
        conflicts_with = "command",
        value_delimiter = ',',
        value_name = "PID"
    )]
    pub pid: Option<Vec<u32>>,
    /// Record only the processes named, not their children (by default lrec records the
    /// descendants of each target, present and future: nginx's workers, a reload's new
    /// workers, a pre-fork server's children).
    #[arg(long)]
    pub no_children: bool,
    /// Stop this many seconds after lrec started (its start-up, a fraction of a second,
    /// included; default: until Ctrl-C or the target exits).
    #[arg(short, long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Samples per second per thread on CPU.
    #[arg(short = 'F', long, default_value_t = 99, value_name = "HZ")]
    pub frequency: u64,
    /// Flight recorder: keep only the last SECS seconds of samples, in bounded memory, and
    /// write them as a capture on SIGUSR1 (recording goes on), on Ctrl-C/SIGTERM, at the
    /// end of -d and when the target exits. With `-o out.lrec` the captures are
    /// out.1.lrec, out.2.lrec, … (default: lrec-PID.1.lrec, …).
    #[arg(long, value_name = "SECS", requires = "target", value_parser = positive_secs)]
    pub flight: Option<f64>,
    /// Lua heap snapshot: copy the memory the target's Lua VMs (LuaJIT 2.1, PUC Lua 5.1–5.5)
    /// keep their objects in,
    /// raw, with each VM's state (several VMs and processes alike), for `lanalyze --heap`
    /// (what holds the memory, by reference path) and `lanalyze --diff A B --heap` (what
    /// grew). With -p the snapshot is taken at once and lrec ends, unless -d asks for
    /// CPU samples too; with `-- CMD` it is taken when -d runs out. SIGUSR1 takes another
    /// while lrec records.
    #[arg(long, conflicts_with = "flight")]
    pub lua_heap: bool,
    /// With --lua-heap: stop every thread of the process while its memory is copied (by
    /// ptrace; lrec reports for how long), for a snapshot of one moment. Without it the
    /// copy is taken while the process runs, and objects may change under it.
    #[arg(long, requires = "lua_heap")]
    pub freeze: bool,
    /// With --lua-heap: copy at most this many MiB of a process's memory.
    #[arg(
        long,
        default_value_t = 4096,
        value_name = "MIB",
        requires = "lua_heap"
    )]
    pub lua_heap_max: u64,
    /// Output file (default: lrec-PID.lrec in the current directory).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// User-stack bytes copied per sample (max 65536). Deeper stacks get truncated.
    #[arg(long, default_value_t = 16384, value_name = "BYTES")]
    pub stack_size: u32,
    /// Embed DWARF debug info of mapped binaries: `auto` embeds it when a binary's
    /// .debug_* sections total at most 32 MiB.
    #[arg(long, value_enum, default_value_t = DebugMode::Auto)]
    pub debuginfo: DebugMode,
    /// Where separate debug files are looked up by build-id (DIR/.build-id/xx/rest.debug,
    /// as Debian's -dbg packages install them): their names are embedded with the
    /// binaries', and they name a stripped PUC Lua's luaV_execute (without them lrec finds
    /// it by its opcode dispatch table).
    #[arg(long, default_value = "/usr/lib/debug", value_name = "DIR")]
    pub debug_dir: PathBuf,
    /// Also record where the target's threads block: each interval a thread spends off CPU
    /// (sleeping, waiting for I/O, a lock, a socket) for at least --off-cpu-min, with its
    /// user, Lua and kernel stacks at the moment it blocked; and each wait of a LuaJIT
    /// coroutine that yields to C (OpenResty's ngx.sleep, cosocket reads: the worker
    /// meanwhile serves others) with the Lua frames that yielded. Read with `lanalyze
    /// --off-cpu` (blocked time by stack) or `--wall` (on and off CPU in one picture).
    #[arg(long)]
    pub off_cpu: bool,
    /// Blocked intervals shorter than this are counted per thread, not recorded with
    /// stacks (`500us`, `1ms`, `0.01s`; a bare number is microseconds).
    #[arg(long, default_value = "1ms", value_name = "TIME", value_parser = duration_ns)]
    pub off_cpu_min: u64,
    /// With --off-cpu: Lua coroutine waits are timed by uprobes on lua_yield and
    /// lua_resume, a few microseconds per yield for the target. Above this many yields a
    /// second (over one second) lrec stops timing them and says so; 0: never stops.
    #[arg(long, default_value_t = 5000, value_name = "YIELDS")]
    pub lua_waits_max_rate: u64,
    /// Also sample every thread of the target HZ times a second, the way xcapture does:
    /// state (running, runnable, sleeping, disk sleep, …), system call and for how long,
    /// kernel stack and wait channel. Read with `lanalyze --states`.
    #[arg(long, value_name = "HZ", num_args = 0..=1, default_missing_value = "20",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub states: Option<u32>,
    /// Time every call of a function in the target, from entry to return, into
    /// histograms per thread (read with `lanalyze --latency`): SYMBOL (any binary the
    /// target maps that defines it, local .symtab symbols included), BINARY:SYMBOL
    /// (`libc.so.6:malloc`, `nginx:ngx_http_lua_content_handler`) or BINARY:0xADDRESS
    /// (a function's first instruction as `nm`/`objdump` print it, for stripped code).
    /// Repeatable. Each call costs the target a few microseconds: see
    /// --latency-max-rate.
    #[arg(long, value_name = "SPEC")]
    pub latency: Vec<latency::Spec>,
    /// Time the phases of a Node.js (libuv) event loop in the target, per iteration:
    /// pending, idle, prepare, poll, check, closing, timers, and the iteration itself.
    #[arg(long)]
    pub node_loop: bool,
    /// Stop timing a function (or the node loop) called more than this many times a
    /// second, said in a warning, the summary and the capture; 0: never stop.
    #[arg(long, default_value_t = 10_000, value_name = "CALLS")]
    pub latency_max_rate: u64,
    /// With --latency/--node-loop, also write each timed call (start and duration) into
    /// the capture: a timeline, markers in `lanalyze --firefox`.
    #[arg(long)]
    pub latency_events: bool,
    /// Ring-buffer size in MiB (a power of two). Default: a quarter of a second of samples
    /// of every online CPU at -F with --stack-size stacks (4 MiB per CPU at 999 Hz and 16
    /// KiB), at least 8 and at most 128 (the ring is mapped twice into lrec: its size counts
    /// double in lrec's memory). Raise it if lrec reports lost samples.
    #[arg(long, value_name = "MIB")]
    pub ring_mib: Option<u32>,
    /// No live status line.
    #[arg(short, long)]
    pub quiet: bool,
    /// Replace the file at -o even when it is not a capture or an output of lrec's or
    /// lanalyze's (a symbolic link or a special file is never written through).
    #[arg(long)]
    pub force: bool,
    /// Run `-- CMD` as this user (a login name or uid of /etc/passwd, or a numeric UID or
    /// UID:GID for users only a directory service knows), with its groups, USER, LOGNAME and
    /// HOME. Without it CMD runs as lrec does: as root under sudo, as `perf record` runs
    /// it. lrec itself stays root (it needs BPF); its captures belong to the user who ran
    /// sudo either way.
    #[arg(long, value_name = "NAME", requires = "command")]
    pub user: Option<String>,
    /// Let `-- CMD` run on when lrec ends before it (at -d's end, on Ctrl-C, or killed).
    /// Without it lrec ends CMD when it stops first (SIGTERM), and CMD gets SIGKILL if
    /// lrec dies (kill -9, a crash): nothing runs on unobserved.
    #[arg(long, requires = "command")]
    pub keep_running: bool,
    /// The command to start and record.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if is_positive_secs(v) => Ok(v),
        _ => Err("must be a positive number of seconds".into()),
    }
}

/// `500us`, `1ms`, `0.01s`, or microseconds.
fn duration_ns(s: &str) -> Result<u64, String> {
    let (num, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .iter()
        .find_map(|(unit, scale)| s.strip_suffix(unit).map(|n| (n, *scale)))
        .unwrap_or((s, 1e3));
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok((v * scale) as u64),
        _ => Err("must be a duration such as 500us, 1ms or 0.01s".into()),
    }
}

fn is_positive_secs(v: f64) -> bool {
    v > 0.0 && v.is_finite()
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugMode {
    Auto,
    All,
    None,
}

/// lrec's memory, counted: bounded by memory::CEILING.
#[global_allocator]
static ALLOCATOR: memory::Counting = memory::Counting;

fn main() {
    let started = std::time::Instant::now();
    // lrec's own start (BTF, BPF, the target's binaries) and the thread that drains the
    // samples must keep up when the target saturates the CPUs: from the first step. (A
    // command lrec starts gets its priority back before it runs.)
    priority::raise_priority();
    let args = Args::parse();
    match run(args, started) {
        Ok(sampler) => exit_leaving_release(sampler),
        Err(e) => fail(e),
    }
}

/// Exits at once, the capture being complete, and leaves the release of the BPF objects
/// to a child process that holds them too. The kernel takes ~0.1 s to let them go (a
/// uprobe's removal waits for RCU grace periods): whoever waits for lrec to exit, a shell
/// timing `lrec -- CMD` for one, need not wait for that.
fn exit_leaving_release<T>(held: T) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: the child calls only async-signal-safe functions (read, close, _exit); both
    // processes end with _exit, so nothing is flushed or dropped twice.
    unsafe {
        // Whoever reads lrec's output must not wait for the child, which may not run at
        // once on a busy machine (it starts at nice 0: priority::realtime): lrec's standard
        // files go to /dev/null before the fork, all said. (A root without /dev, as
        // tests/dist.rs's: closed instead.)
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            match null >= 0 {
                true => libc::dup2(null, fd),
                false => libc::close(fd),
            };
        }
        // The child must let go last: it waits for the pipe's end that lrec's exit closes.
        let mut pipe = [-1; 2];
        if libc::pipe(pipe.as_mut_ptr()) == 0 && libc::fork() == 0 {
            libc::close(pipe[1]);
            let mut byte = 0u8;
            while libc::read(pipe[0], (&raw mut byte).cast(), 1) < 0 {}
            libc::_exit(0);
        }
        // Not dropped: exiting lets the kernel release them, in the child (or here, when
        // there is no child: slower, still right).
        std::mem::forget(held);
        libc::_exit(0)
    }
}

fn fail(e: anyhow::Error) -> ! {
    eprintln!("lrec: error: {e}");
    for cause in e.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    if let Some(hint) = hint(&e) {
        eprintln!("\n{hint}");
    }
    std::process::exit(1);
}

fn run(args: Args, started: std::time::Instant) -> Result<sampler::Sampler> {
    if args.pid.is_none() && args.command.is_empty() {
        bail!("nothing to record: give -p PID or -- CMD ARGS (see lrec --help)");
    }
    if args.stack_size == 0 || args.stack_size > raw::MAX_STACK {
        bail!("--stack-size must be between 1 and {}", raw::MAX_STACK);
    }
    let max_rate = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(100_000);
    if args.frequency == 0 || args.frequency > max_rate {
        bail!("-F must be between 1 and {max_rate} (kernel.perf_event_max_sample_rate)");
    }
    if args.latency_events && args.latency.is_empty() && !args.node_loop {
        bail!("--latency-events needs --latency SPEC or --node-loop");
    }
    if args.ring_mib.is_some_and(|m| !m.is_power_of_two()) {
        bail!("--ring-mib must be a power of two");
    }
    if let Some(d) = args.duration {
        if !is_positive_secs(d) {
            bail!("-d must be a positive number of seconds");
        }
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!("this kernel has no BTF (/sys/kernel/btf/vmlinux is missing); lrec needs a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    signals::install();
    let mut target = match &args.pid {
        Some(pids) if !pids.is_empty() => target::Target::attach_all(pids)?,
        Some(_) => bail!("-p needs a process id"),
        None => {
            let user = args.user.as_deref().map(target::User::lookup).transpose()?;
            target::Target::spawn(&args.command, user.as_ref(), args.keep_running)?
        }
    };
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("lrec-{}.lrec", target.pid)));
    let result = recorder::record(&config(&args, started), &mut target, &output);
    target.stop_child();
    result.map_err(|e| match e.is::<capture_file::WriteFailed>() {
        // It names the file already.
        true => e,
        false => e.context(format!("recording into {}", output.display())),
    })
}

/// The command line in the recorder's terms.
fn config(args: &Args, started: std::time::Instant) -> recorder::config::Config {
    use lrec_inspect::elf::DebugInfo;
    use recorder::config;
    config::Config {
        frequency_hz: args.frequency,
        stack_size: args.stack_size,
        duration: args.duration.map(std::time::Duration::from_secs_f64),
        started,
        ring_mib: args.ring_mib,
        follow_children: !args.no_children,
        force: args.force,
        debug: match args.debuginfo {
            DebugMode::Auto => DebugInfo::IfSmall(config::AUTO_DEBUG_LIMIT),
            DebugMode::All => DebugInfo::All,
            DebugMode::None => DebugInfo::None,
        },
        debug_dir: args.debug_dir.clone(),
        quiet: args.quiet,
        command: args.command.clone(),
        flight_secs: args.flight,
        off_cpu: args.off_cpu.then_some(config::OffCpu {
            min_ns: args.off_cpu_min,
            lua_waits_max_rate: args.lua_waits_max_rate,
        }),
        states_hz: args.states,
        latency: (!args.latency.is_empty() || args.node_loop).then(|| config::Latency {
            specs: args.latency.clone(),
            node_loop: args.node_loop,
            max_rate: args.latency_max_rate,
            events: args.latency_events,
        }),
        heap: args.lua_heap.then_some(config::Heap {
            freeze: args.freeze,
            max_bytes: args.lua_heap_max << 20,
        }),
    }
}

/// What to do about the errors users meet most.
fn hint(e: &anyhow::Error) -> Option<&'static str> {
    let text = format!("{e:#}");
    let eperm = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    }) || text.contains("Operation not permitted")
        || text.contains("Permission denied");
    if eperm {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("hint: lrec loads BPF programs and opens perf events: run it as root (sudo lrec …) or grant CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep lrec).");
        }
        return Some("hint: root was refused: check kernel.perf_event_paranoid, a seccomp/container policy or kernel.unprivileged_bpf_disabled.");
    }
    None
}

//! `lanalyze`: turns an lrec capture into folded stacks, a flame graph, a top table or a
//! summary. All the work is in the `lanalyze` library; this only parses arguments.

use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use lanalyze::render::{self, StackOptions, StateKey};
use lanalyze::{analyze, embed, strip, Mode, Naming, Options, Profile, TimeRange};
use lrec_format::{Capture, FormatError};
use lrec_inspect::files::{OutputFile, OutputOptions};

const EXAMPLES: &str = "\
EXAMPLES:
    lanalyze out.lrec                          summary of the capture
    lanalyze out.lrec --flamegraph -o fg.svg   flame graph
    lanalyze out.lrec --folded > out.folded    collapsed stacks (for inferno, speedscope)
    lanalyze out.lrec --top 20                 the 20 functions with the most self samples
    lanalyze out.lrec --pprof -o out.pb.gz     for `go tool pprof`, Pyroscope, Parca
    lanalyze out.lrec --speedscope -o out.json for https://www.speedscope.app
    lanalyze out.lrec --firefox -o out.json    for https://profiler.firefox.com (and Perfetto)
    lanalyze out.lrec --time 10..20 --top 10   only samples 10 s to 20 s into the recording
    lanalyze --diff before.lrec after.lrec --top 20        what changed, by share of samples
    lanalyze --diff before.lrec after.lrec --flamegraph -o diff.svg
    lanalyze out.lrec --strip -o shared.lrec   a capture without stack memory, to share
    lanalyze out.lrec --embed-symbols -o full.lrec
                                               a capture that names everything offline

  Names for stripped binaries (nginx, redis, libc): installed -dbg packages
  (/usr/lib/debug), else debuginfod by build-id, as gdb and perf fetch them:
    DEBUGINFOD_URLS=https://debuginfod.debian.net lanalyze out.lrec --info
  cached in $DEBUGINFOD_CACHE_PATH (default ~/.cache/debuginfod_client); time-outs from
  DEBUGINFOD_TIMEOUT (seconds, default 10) and DEBUGINFOD_MAXTIME (default 300).

  Captures of `lrec --off-cpu` and `lrec --states`:
    lanalyze out.lrec --off-cpu --flamegraph -o off.svg   where threads block, by time blocked
    lanalyze out.lrec --wall --flamegraph -o wall.svg     on and off CPU in one picture
    lanalyze out.lrec --off-cpu --top 20                  blocked time (us) per function
    lanalyze out.lrec --states                            average threads per state and call
    lanalyze out.lrec --states --group-by comm,state,wchan
    lanalyze out.lrec --states --csv > states.csv         one row per thread per sample
    lanalyze out.lrec --folded --offline       use only what the capture holds

  Captures of `lrec --latency SYMBOL` and `lrec --node-loop` (durations of calls):
    lanalyze out.lrec --latency                           per function: p50, p99, histogram;
                                                          Node.js event-loop phases per thread
    lanalyze out.lrec --latency --per-thread              a row per function and thread
    lanalyze out.lrec --latency --csv -o latency.csv      a CSV row per function

  Captures of `lrec -p PID --lua-heap` (what holds a Lua VM's memory):
    lanalyze heap.lrec --heap                             census and the largest paths
    lanalyze heap.lrec --heap --flamegraph -o heap.svg    memory flame graph by path
    lanalyze heap.lrec --heap --csv -o objects.csv        a row per object
    lanalyze --diff before.lrec after.lrec --heap         what grew between two snapshots";

/// Analyse an lrec capture: unwind, symbolize and render it.
#[derive(Debug, Parser)]
#[command(version = lrec_inspect::VERSION, after_help = EXAMPLES)]
#[command(group(clap::ArgGroup::new("tables").args(["states", "latency", "heap"])))]
struct Cli {
    /// The capture written by `lrec -o` (with --diff: the BEFORE and AFTER captures).
    #[arg(required = true, num_args = 1..=2, value_name = "CAPTURE")]
    captures: Vec<PathBuf>,
    /// Compare two captures, BEFORE then AFTER: with --top, functions ranked by change in
    /// share of samples; with --flamegraph, a differential flame graph (AFTER's stacks,
    /// red where they grew, blue where they shrank, normalised by sample count); with
    /// --folded, `stack BEFORE AFTER` lines.
    #[arg(long)]
    diff: bool,
    /// Print collapsed stacks: `thread;root;…;leaf COUNT`.
    #[arg(long, group = "mode")]
    folded: bool,
    /// Draw an SVG flame graph.
    #[arg(long, group = "mode")]
    flamegraph: bool,
    /// Print the N functions with the most self samples.
    #[arg(long, value_name = "N", group = "mode")]
    top: Option<usize>,
    /// Print a summary: header, counts, threads, binaries, warnings.
    #[arg(long, group = "mode")]
    info: bool,
    /// Write a gzipped pprof profile (profile.proto), as read by `go tool pprof`,
    /// Pyroscope's `profilecli upload` and Parca's `parca-push`.
    #[arg(long, group = "mode")]
    pprof: bool,
    /// Write a speedscope JSON profile, one profile per thread, in time order.
    #[arg(long, group = "mode")]
    speedscope: bool,
    /// Write a Firefox Profiler (processed format) JSON profile: a track per thread.
    #[arg(long, group = "mode")]
    firefox: bool,
    /// Write a copy of the capture without secrets to -o FILE: resolved stacks, names and
    /// metadata only, no stack bytes, registers or other memory of the target. Every
    /// output of lanalyze reads it.
    #[arg(long, group = "mode", requires = "output")]
    strip: bool,
    /// Write a copy of the capture to -o FILE whose binaries carry the symbol tables,
    /// DWARF and unwind sections this machine supplied (installed debug packages,
    /// debuginfod): `lanalyze FILE --offline` then names everything on any machine. What
    /// a bug report should carry. Only binaries that samples ran in are completed.
    #[arg(long, group = "mode", requires = "output", conflicts_with = "offline")]
    embed_symbols: bool,
    /// Thread-state table (`lrec --states`): the average number of threads in each group
    /// of --group-by (xtop's "average active threads") and their share of all samples.
    #[arg(long, group = "mode")]
    states: bool,
    /// Durations of the calls lrec timed, from a capture of `lrec --latency SYMBOL` (a
    /// function, entry to return) or `lrec --node-loop` (Node.js's event loop): per
    /// function, the count, p50, p90, p99, max and mean, a histogram, and how entries and
    /// returns paired; per thread running a Node.js event loop, each phase's time and share
    /// of the loop's time. Reads only the capture's metadata: no sample is unwound.
    #[arg(long, group = "mode", conflicts_with_all = ["time", "off_cpu", "wall"])]
    latency: bool,
    /// The Lua heap of a capture of `lrec --lua-heap`: per VM, its objects by type with
    /// their sizes as the VM counts them (checked against the collector's own count), and
    /// the largest reference paths from the roots (package.loaded, _G, the registry, the
    /// main thread), as `package.loaded["app"].cache[*]` or
    /// `_G.handler<upvalue pool of app.lua:12>`.
    /// With --top N: N paths; --flamegraph: a memory flame graph by path; --folded; --csv:
    /// a row per object; --diff BEFORE AFTER: the paths that grew.
    #[arg(long, conflicts_with_all = ["off_cpu", "wall", "time", "strip", "pprof",
        "speedscope", "firefox", "embed_symbols", "lines", "mark_jit"])]
    heap: bool,
    /// With --latency: a row per function and thread (pid, tid, thread name).
    #[arg(long, requires = "latency")]
    per_thread: bool,
    /// Columns to group --states by, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "state,syscall,wchan",
        requires = "states",
        value_name = "KEYS"
    )]
    group_by: Vec<StateKey>,
    /// CSV for DuckDB or pandas. With --states: a row per thread per thread-state sample
    /// (time_s, pid, tid, comm, state, on_cpu, syscall, syscall_ms, wchan, leaf, lua).
    /// With --latency: a row per function (function, count, p50_us, p90_us, p99_us,
    /// max_us, min_us, mean_us, total_us, kind, pid, tid; pid and tid with --per-thread).
    #[arg(long, requires = "tables")]
    csv: bool,
    /// Show time off CPU instead of CPU samples (`lrec --off-cpu`): every output
    /// weighs stacks by the microseconds their threads spent blocked in them, with the
    /// state as the leaf (`[sleeping]`, `[disk sleep]`), plus per thread the time lrec
    /// counted without a stack (blocks shorter than `lrec --off-cpu-min`, waits for a CPU).
    #[arg(long, conflicts_with_all = ["wall", "states"])]
    off_cpu: bool,
    /// Wall-clock time: CPU samples (a sampling period each) and time off CPU, in
    /// microseconds, per thread: where a thread's whole time went, in one picture.
    #[arg(long, conflicts_with = "states")]
    wall: bool,
    /// Write to FILE instead of stdout: created mode 0600 (owned by the user who ran sudo,
    /// under sudo) and in place only once complete; never through a symbolic link.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Replace FILE (-o) even when it is not a capture or an output of lrec's or
    /// lanalyze's.
    #[arg(long, requires = "output")]
    force: bool,
    /// Read no local files and fetch nothing (debuginfod): use only what the capture
    /// holds.
    #[arg(long)]
    offline: bool,
    /// Where separate debug files are looked up, by build-id (DIR/.build-id/xx/rest.debug,
    /// as Debian's -dbg packages install them) and by debuglink; as `lrec --debug-dir`.
    /// What they lack, debuginfod supplies when DEBUGINFOD_URLS is set.
    #[arg(long, value_name = "DIR", conflicts_with = "offline")]
    debug_dir: Option<PathBuf>,
    /// Do not start stacks with the thread name.
    #[arg(long)]
    no_thread_names: bool,
    /// Start stacks with their process, `name [pid]`, to tell the workers of a pre-fork
    /// server (nginx) apart.
    #[arg(long)]
    per_pid: bool,
    /// Keep only samples of this process.
    #[arg(short, long)]
    pid: Option<u32>,
    /// Keep only samples of this thread.
    #[arg(short, long)]
    tid: Option<u32>,
    /// Keep only samples taken FROM..TO seconds after recording started (`10..20`,
    /// `30..`, `..5.5`).
    #[arg(long, value_name = "FROM..TO")]
    time: Option<TimeRange>,
    /// Split Lua frames by current line: `chunk.lua:12@14` is the function defined at line
    /// 12 while it runs line 14.
    #[arg(long)]
    lines: bool,
    /// Mark Lua frames that ran as JIT-compiled code with `_[j]` (perf's mark), e.g.
    /// `hot app.lua:9_[j]`.
    #[arg(long)]
    mark_jit: bool,
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("lanalyze: error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        if let Some(hint) = hint(&e) {
            eprintln!("hint: {hint}");
        }
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match (cli.diff, cli.captures.len()) {
        (true, 2) | (false, 1) => {}
        (true, _) => bail!("--diff compares two captures: lanalyze --diff BEFORE AFTER --top 20"),
        (false, _) => bail!("pass one capture (or two with --diff)"),
    }
    if cli.heap {
        return write_heap(&cli);
    }
    if cli.diff
        && (cli.pprof
            || cli.speedscope
            || cli.firefox
            || cli.strip
            || cli.latency
            || cli.embed_symbols)
    {
        bail!("--diff draws --flamegraph, --folded or --top (the default)");
    }
    if let Some(out) = &cli.output {
        let same = |c: &PathBuf| std::fs::canonicalize(c).ok() == std::fs::canonicalize(out).ok();
        if out.exists() && cli.captures.iter().any(same) {
            bail!(
                "-o {} would overwrite the capture being read; write to another file",
                out.display()
            );
        }
    }
    let binary = cli.pprof || cli.strip || cli.embed_symbols;
    if binary && cli.output.is_none() && io::stdout().is_terminal() {
        bail!("this output is binary; write it to a file with -o FILE");
    }
    let opts = Options {
        offline: cli.offline,
        debug_dir: cli.debug_dir.clone(),
        pid: cli.pid,
        tid: cli.tid,
        time: cli.time,
        naming: Naming {
            lines: cli.lines,
            mark_jit: cli.mark_jit,
        },
        mode: if cli.off_cpu {
            Mode::OffCpu
        } else if cli.wall {
            Mode::Wall
        } else if cli.states {
            Mode::States
        } else {
            Mode::Cpu
        },
    };
    if cli.diff && opts.mode != Mode::Cpu {
        bail!("--diff compares CPU samples");
    }
    if cli.latency {
        return write_latency(&cli, &opts);
    }
    if cli.embed_symbols {
        return embed_symbols(&cli, &opts);
    }
    let profiles = cli
        .captures
        .iter()
        .map(|path| load(path, &opts))
        .collect::<Result<Vec<Profile>>>()?;
    let stack_opts = StackOptions {
        thread_names: !cli.no_thread_names,
        per_pid: cli.per_pid,
    };
    if cli.strip {
        let mut out = output(cli.output.as_deref(), cli.force)?;
        // A heap snapshot's census and paths, not its memory.
        let heaps = lanalyze::heap::read_heaps(&open(&cli.captures[0])?)?;
        let written = strip::write_stripped(&profiles[0], &heaps, &mut out)
            .map_err(|e| io::Error::other(format!("{e:#}")));
        return finish(written, out);
    }
    let mut out = output(cli.output.as_deref(), cli.force)?;
    let written = if let [before, after] = profiles.as_slice() {
        if cli.folded {
            render::write_diff_folded(before, after, stack_opts, &mut out)
        } else if cli.flamegraph {
            render::write_diff_flamegraph(before, after, stack_opts, &mut out)
        } else {
            render::write_diff_top(before, after, cli.top.unwrap_or(20), &mut out)
        }
    } else {
        let profile = &profiles[0];
        if cli.folded {
            render::write_folded(profile, stack_opts, &mut out)
        } else if cli.flamegraph {
            render::write_flamegraph(profile, stack_opts, &mut out)
        } else if cli.states && cli.csv {
            render::write_states_csv(profile, &mut out)
        } else if cli.states {
            render::write_states(profile, &cli.group_by, &mut out)
        } else if let Some(n) = cli.top {
            render::write_top(profile, n, &mut out)
        } else if cli.pprof {
            render::write_pprof(profile, &mut out)
        } else if cli.speedscope {
            render::write_speedscope(profile, &mut out)
        } else if cli.firefox {
            render::write_firefox(profile, &mut out)
        } else {
            let heaps = open(&cli.captures[0])?.chunks().iter().any(|c| {
                c.kinds & lrec_format::kind_bit(lrec_format::kind::LUA_HEAP) != 0
                    || c.kinds & lrec_format::kind_bit(lrec_format::kind::RESOLVED_HEAP) != 0
            });
            render::write_info(profile, &mut out).and_then(|()| {
                if heaps {
                    writeln!(
                        out,
                        "\nThis capture holds Lua heap snapshots: --heap reads them (what holds \
                         the memory, by path)"
                    )
                } else if cli.info {
                    Ok(())
                } else {
                    writeln!(
                        out,
                        "\nhint: --flamegraph -o out.svg draws a flame graph; --folded, --top N, \
                         --pprof and --help show more"
                    )
                }
            })
        }
    };
    let result = finish(written, out);
    // The process exits next, which frees the profiles' memory at once.
    std::mem::forget(profiles);
    result
}

/// `--heap`: the Lua heap snapshots of the capture (or the growth between two).
fn write_heap(cli: &Cli) -> Result<()> {
    use lanalyze::heap::{read_heaps, report};
    let reports = cli
        .captures
        .iter()
        .map(|path| {
            let mut reports = read_heaps(&open(path)?)
                .with_context(|| format!("cannot read the Lua heap of {}", path.display()))?;
            if reports.is_empty() {
                bail!(
                    "{} holds no Lua heap snapshot: take one with `lrec -p PID --lua-heap -o \
                     heap.lrec`",
                    path.display()
                );
            }
            reports.retain(|r| cli.pid.is_none_or(|p| r.vm.pid == p));
            Ok(reports)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = output(cli.output.as_deref(), cli.force)?;
    let top = cli.top.unwrap_or(20);
    let written = match reports.as_slice() {
        [before, after] if cli.flamegraph => report::write_diff_flamegraph(before, after, &mut out),
        [before, after] => report::write_diff(before, after, top, &mut out),
        [one] if cli.csv && one.iter().any(|r| r.stripped) => {
            bail!("a stripped capture keeps the census and paths, not the objects: --csv needs the original capture")
        }
        [one] if cli.csv => report::write_csv(one, &mut out),
        [one] if cli.flamegraph => report::write_flamegraph(one, &mut out),
        [one] if cli.folded => report::write_folded(one, &mut out),
        [one] => report::write_summary(one, top, &mut out),
        _ => unreachable!("one capture, or two with --diff"),
    };
    finish(written, out)
}

/// `--latency`: reads only what lrec timed, no samples.
fn write_latency(cli: &Cli, opts: &Options) -> Result<()> {
    let path = &cli.captures[0];
    let latencies = lanalyze::read_latencies(&open(path)?, opts)
        .with_context(|| format!("cannot report latency of {}", path.display()))?;
    let mut out = output(cli.output.as_deref(), cli.force)?;
    let written = if cli.csv {
        for u in &latencies.record.unresolved {
            eprintln!("lanalyze: warning: not timed: {u}");
        }
        render::write_latency_csv(&latencies, cli.per_thread, &mut out)
    } else {
        render::write_latency(&latencies, cli.per_thread, &mut out)
    };
    finish(written, out)
}

/// `--embed-symbols`: the capture with its binaries completed.
fn embed_symbols(cli: &Cli, opts: &Options) -> Result<()> {
    let path = &cli.captures[0];
    let capture = open(path)?;
    let mut out = output(cli.output.as_deref(), cli.force)?;
    let locator = lanalyze::locator(opts);
    let written = embed::write_with_symbols(&capture, opts, locator.as_ref(), &mut out);
    let completed = match written {
        Ok(c) => c,
        Err(e) => {
            if let Output::File(f) = out {
                f.into_inner().map(|f| f.abandon()).ok();
            }
            return Err(e).with_context(|| format!("cannot complete {}", path.display()));
        }
    };
    finish(Ok(()), out)?;
    if completed.is_empty() {
        eprintln!(
            "lanalyze: nothing to add: the capture names what its samples ran in as well as              this machine can (see --info)"
        );
    }
    for c in &completed {
        eprintln!("lanalyze: embedded {}: {}", c.path, c.names_from);
    }
    Ok(())
}

/// Where the output goes: -o FILE, else stdout.
enum Output {
    /// Written under a temporary name, in place once complete ([`OutputFile`]).
    File(BufWriter<OutputFile>),
    Stdout(BufWriter<io::StdoutLock<'static>>),
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::File(f) => f.write(buf),
            Output::Stdout(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::File(f) => f.flush(),
            Output::Stdout(s) => s.flush(),
        }
    }
}

fn output(path: Option<&Path>, force: bool) -> Result<Output> {
    Ok(match path {
        Some(path) => {
            let opts = OutputOptions::for_invoking_user(force);
            Output::File(BufWriter::new(OutputFile::create(path, &opts)?))
        }
        None => Output::Stdout(BufWriter::new(io::stdout().lock())),
    })
}

/// Flushes the output and puts a file in place; a reader that went away (`| head`) is no
/// error. A file not written whole is removed.
fn finish(written: io::Result<()>, mut out: Output) -> Result<()> {
    let flushed = written.and_then(|()| out.flush());
    match out {
        Output::Stdout(_) => flushed.or_else(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => Ok(()),
            _ => Err(e),
        }),
        Output::File(f) => {
            // The file without its buffer, whatever was flushed of it.
            let (file, unflushed) = match f.into_inner() {
                Ok(file) => (file, None),
                Err(e) => {
                    let (error, buffered) = e.into_parts();
                    (buffered.into_parts().0, Some(error))
                }
            };
            match flushed.and_then(|()| unflushed.map_or(Ok(()), Err)) {
                Ok(()) => file.commit().map(drop).map_err(io::Error::other),
                Err(e) => {
                    file.abandon();
                    Err(e)
                }
            }
        }
    }
    .context("cannot write the output")
}

/// Opens a capture; where none is at `path`, the one an unfinished lrec left beside it
/// (`PATH.PID-N.partial`: lrec writes there until it commits), said on stderr.
fn open(path: &Path) -> Result<Capture> {
    let read =
        |p: &Path| Capture::open(p).with_context(|| format!("cannot read capture {}", p.display()));
    if path.exists() {
        return read(path);
    }
    let Some((partial, lrec)) = lrec_inspect::files::partial_file(path) else {
        return read(path);
    };
    let why = match lrec {
        Some(pid) => format!("lrec (pid {pid}) is still recording it"),
        None => {
            "the lrec that wrote it did not finish (killed, or the machine went down)".to_string()
        }
    };
    eprintln!(
        "lanalyze: {} does not exist; reading {} instead: {why}; it holds the samples up to \
         its last complete chunk",
        path.display(),
        partial.display()
    );
    read(&partial)
}

/// Reads and analyses one capture, printing its warnings.
fn load(path: &Path, opts: &Options) -> Result<Profile> {
    let capture = open(path)?;
    let profile =
        analyze(&capture, opts).with_context(|| format!("cannot analyse {}", path.display()))?;
    for w in &profile.warnings {
        match w.count {
            1 => eprintln!("lanalyze: warning: {}", w.message),
            n => eprintln!("lanalyze: warning: {} ({n} times)", w.message),
        }
    }
    Ok(profile)
}

/// What to do about an error, when there is something to do.
fn hint(e: &anyhow::Error) -> Option<&'static str> {
    let format = e.chain().find_map(|c| c.downcast_ref::<FormatError>())?;
    Some(match format {
        FormatError::BadMagic | FormatError::TooShort(_) => {
            "pass a file written by `lrec -o FILE -- COMMAND`"
        }
        FormatError::UnsupportedVersion { .. } => {
            "install a lanalyze as new as the lrec that recorded"
        }
        FormatError::Io(_) => "check the path and that you may read the file",
        _ => return None,
    })
}

//! `lanalyze`: turns an lrec capture into folded stacks, a flame graph, a top table or a
//! summary. All the work is in the `lanalyze` library; this only parses arguments.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use lanalyze::render::{self, StackOptions};
use lanalyze::{analyze, Options};
use lrec_format::{Capture, FormatError};

const EXAMPLES: &str = "\
EXAMPLES:
    lanalyze out.lrec                          summary of the capture
    lanalyze out.lrec --flamegraph -o fg.svg   flame graph
    lanalyze out.lrec --folded > out.folded    collapsed stacks (for inferno, speedscope)
    lanalyze out.lrec --top 20                 the 20 functions with the most self samples
    lanalyze out.lrec --folded --offline       use only what the capture holds";

/// Analyse an lrec capture: unwind, symbolize and render it.
#[derive(Debug, Parser)]
#[command(version, after_help = EXAMPLES)]
struct Cli {
    /// The capture written by `lrec -o`.
    capture: PathBuf,
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
    /// Write to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Read no local files: use only what the capture holds.
    #[arg(long)]
    offline: bool,
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
    let capture = Capture::open(&cli.capture)
        .with_context(|| format!("cannot read capture {}", cli.capture.display()))?;
    let opts = Options {
        offline: cli.offline,
        pid: cli.pid,
        tid: cli.tid,
        lines: cli.lines,
        mark_jit: cli.mark_jit,
    };
    let profile = analyze(&capture, &opts)
        .with_context(|| format!("cannot analyse {}", cli.capture.display()))?;
    for w in &profile.warnings {
        match w.count {
            1 => eprintln!("lanalyze: warning: {}", w.message),
            n => eprintln!("lanalyze: warning: {} ({n} times)", w.message),
        }
    }
    let stack_opts = StackOptions {
        thread_names: !cli.no_thread_names,
        per_pid: cli.per_pid,
    };
    let mut out: Box<dyn Write> = match &cli.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    };
    let written = if cli.folded {
        render::write_folded(&profile, stack_opts, &mut out)
    } else if cli.flamegraph {
        render::write_flamegraph(&profile, stack_opts, &mut out)
    } else if let Some(n) = cli.top {
        render::write_top(&profile, n, &mut out)
    } else {
        render::write_info(&profile, &mut out).and_then(|()| {
            if cli.info {
                Ok(())
            } else {
                writeln!(
                    out,
                    "\nhint: --flamegraph -o out.svg draws a flame graph; --folded, --top N \
                     and --help show more"
                )
            }
        })
    };
    written
        .and_then(|()| out.flush())
        .or_else(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => Ok(()),
            _ => Err(e),
        })
        .context("cannot write the output")
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

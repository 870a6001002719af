//! pprof output: a gzipped `profile.proto` (github.com/google/pprof/proto/profile.proto),
//! as `go tool pprof`, Pyroscope's `profilecli upload` and Parca's `parca-push` read it.
//!
//! - Sample types `samples/count` and `cpu/nanoseconds` (the default, being last): each
//!   sample is worth one sampling interval of CPU time, 1e9 / frequency nanoseconds.
//!   A capture that does not say its frequency (`frequency_hz` 0) gets `samples/count`
//!   only, with no period: a made-up interval would be a wrong CPU time.
//! - Identical stacks of one thread are one pprof sample with summed values, labelled
//!   `thread` (name), `pid` and `tid`.
//! - A function is named as `lanalyze --top` names it, without the `@LINE` of `--lines`:
//!   so `go tool pprof -top` lists the same functions with the same self counts. Its
//!   file is the module (for a Lua function, its chunk) and its start line is where a
//!   Lua function is defined; a location's line is the Lua line running when sampled
//!   (`go tool pprof -lines` shows `chunk.lua:LINE`). Native frames have no line (0).
//! - Every binary of the capture is a mapping (path, hex build id). A location lies in
//!   the mapping of its binary, or in a mapping named after its module when the capture
//!   lacks the binary, its chunk for Lua, `[kernel.kallsyms]` for the kernel, `[lua]`
//!   for Lua built-ins and VM states, `[unknown]` otherwise. Every mapping says it has
//!   functions, files, lines and inlined frames: the profile holds every name there is
//!   (its locations have no addresses), so readers must not symbolize it again.
//! - A stack that could not be followed to its root function gets a `[truncated]` root,
//!   as in the folded output. A sample without any frame gets an `[unknown]` frame, since
//!   some readers reject samples without locations; `lanalyze --top` does not list it.

mod proto;

use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;
use rustc_hash::FxHashMap;

use self::proto::Message;
use super::TRUNCATED_FRAME;
use crate::image::basename;
use crate::{Frame, FrameId, FrameKind, Naming, Profile};
use lrec_inspect::debug_files::build_id_hex;

/// Field numbers of profile.proto, by message.
mod field {
    pub mod profile {
        pub const SAMPLE_TYPE: u32 = 1;
        pub const SAMPLE: u32 = 2;
        pub const MAPPING: u32 = 3;
        pub const LOCATION: u32 = 4;
        pub const FUNCTION: u32 = 5;
        pub const STRING_TABLE: u32 = 6;
        pub const TIME_NANOS: u32 = 9;
        pub const DURATION_NANOS: u32 = 10;
        pub const PERIOD_TYPE: u32 = 11;
        pub const PERIOD: u32 = 12;
        pub const COMMENT: u32 = 13;
    }
    pub mod value_type {
        pub const TYPE: u32 = 1;
        pub const UNIT: u32 = 2;
    }
    pub mod sample {
        pub const LOCATION_ID: u32 = 1;
        pub const VALUE: u32 = 2;
        pub const LABEL: u32 = 3;
    }
    pub mod label {
        pub const KEY: u32 = 1;
        pub const STR: u32 = 2;
        pub const NUM: u32 = 3;
    }
    pub mod mapping {
        pub const ID: u32 = 1;
        pub const FILENAME: u32 = 5;
        pub const BUILD_ID: u32 = 6;
        pub const HAS_FUNCTIONS: u32 = 7;
        pub const HAS_FILENAMES: u32 = 8;
        pub const HAS_LINE_NUMBERS: u32 = 9;
        pub const HAS_INLINE_FRAMES: u32 = 10;
    }
    pub mod location {
        pub const ID: u32 = 1;
        pub const MAPPING_ID: u32 = 2;
        pub const LINE: u32 = 4;
    }
    pub mod line {
        pub const FUNCTION_ID: u32 = 1;
        pub const LINE: u32 = 2;
    }
    pub mod function {
        pub const ID: u32 = 1;
        pub const NAME: u32 = 2;
        pub const FILENAME: u32 = 4;
        pub const START_LINE: u32 = 5;
    }
}

/// The mapping of kernel frames, as perf names it.
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
/// The mapping of Lua frames without a chunk (built-ins, VM states).
const LUA_MAPPING: &str = "[lua]";
/// The mapping, and function, of what has no better name.
const UNKNOWN: &str = "[unknown]";

/// Writes the profile as gzipped profile.proto.
pub fn write_pprof(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    encode(profile, &mut gz)?;
    gz.finish()?;
    Ok(())
}

/// The sampling period in nanoseconds, rounded: pprof's values are integers.
fn period_ns(frequency_hz: u32) -> Option<i64> {
    super::period_ns(frequency_hz).map(|p| p.round() as i64)
}

/// Writes the (uncompressed) profile.proto message.
fn encode(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    use field::profile as f;
    let mut b = Builder::new(profile);
    let mut top = Message::new();
    let period = period_ns(profile.header.frequency_hz);
    let samples_type = b.value_type("samples", "count");
    top.message(f::SAMPLE_TYPE, &samples_type);
    // Off-CPU and wall-clock profiles weigh their samples in time.
    let timed = profile.mode.is_timed();
    let period = if timed { Some(1000) } else { period };
    if let Some(period) = period {
        let time = match profile.mode {
            crate::Mode::OffCpu => "off_cpu",
            crate::Mode::Wall => "wall",
            _ => "cpu",
        };
        let cpu_type = b.value_type(time, "nanoseconds");
        top.message(f::SAMPLE_TYPE, &cpu_type)
            .message(f::PERIOD_TYPE, &cpu_type)
            .int(f::PERIOD, period);
    }

    // Identical (thread, stack) samples become one; sorted so that output is
    // deterministic.
    let mut stacks: FxHashMap<(usize, &[FrameId], bool), (i64, i64)> = FxHashMap::default();
    for s in &profile.samples {
        let e = stacks
            .entry((s.thread, &s.frames, s.truncated()))
            .or_default();
        e.0 += 1;
        e.1 += if timed { profile.weight(s) as i64 } else { 1 };
    }
    let mut stacks: Vec<_> = stacks.into_iter().collect();
    stacks.sort_unstable();
    let keys = [
        b.strings.id("thread"),
        b.strings.id("pid"),
        b.strings.id("tid"),
    ];
    for ((thread, frames, truncated), (n, weight)) in stacks {
        let mut locations: Vec<u64> = frames.iter().rev().map(|&id| b.location(id)).collect();
        if locations.is_empty() {
            locations.push(b.placeholder(UNKNOWN));
        } else if truncated {
            locations.push(b.placeholder(TRUNCATED_FRAME));
        }
        let t = &profile.threads[thread];
        let name = b.strings.id(&t.name);
        let mut sample = Message::new();
        sample
            .packed(field::sample::LOCATION_ID, locations)
            .packed(
                field::sample::VALUE,
                std::iter::once(n)
                    .chain(period.map(|p| weight * p))
                    .map(|v| v as u64),
            )
            .message(field::sample::LABEL, &label(keys[0], Some(name), 0))
            .message(field::sample::LABEL, &label(keys[1], None, t.pid.into()))
            .message(field::sample::LABEL, &label(keys[2], None, t.tid.into()));
        top.message(f::SAMPLE, &sample);
        top.flush_to(out)?;
    }

    let first = profile.samples.iter().map(|s| s.time_ns).min();
    let last = profile.samples.iter().map(|s| s.time_ns).max();
    let h = &profile.header;
    // The samples' clock is CLOCK_MONOTONIC; place the first sample on the wall clock.
    let start = match first {
        Some(t) if h.monotonic_start_ns != 0 && t >= h.monotonic_start_ns => {
            h.wall_clock_start_ns + (t - h.monotonic_start_ns)
        }
        _ => h.wall_clock_start_ns,
    };
    top.int(f::TIME_NANOS, start as i64).int(
        f::DURATION_NANOS,
        last.zip(first).map_or(0, |(l, f)| l - f) as i64,
    );
    if !h.command_line.is_empty() {
        let comment = b
            .strings
            .id(&format!("recorded by: {}", h.command_line.join(" ")));
        top.packed(f::COMMENT, [comment as u64]);
    }
    for m in &b.mappings {
        top.message(f::MAPPING, m);
    }
    for l in &b.locations {
        top.message(f::LOCATION, l);
    }
    for function in &b.functions {
        top.message(f::FUNCTION, function);
    }
    for s in &b.strings.strings {
        top.len_delimited(f::STRING_TABLE, s.as_bytes());
    }
    top.flush_to(out)
}

fn label(key: i64, str: Option<i64>, num: i64) -> Message {
    let mut m = Message::new();
    m.int(field::label::KEY, key);
    match str {
        Some(s) => m.int(field::label::STR, s),
        None => m.int(field::label::NUM, num),
    };
    m
}

/// The string table: index 0 is `""`, each distinct string appears once.
#[derive(Debug)]
struct Strings {
    strings: Vec<String>,
    ids: FxHashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

/// The tables of the profile, filled as samples use their frames. Ids are 1-based
/// positions in each table.
struct Builder<'p> {
    profile: &'p Profile,
    /// Function names by frame id: `lanalyze --top`'s, without `@LINE`.
    names: Vec<String>,
    strings: Strings,
    mappings: Vec<Message>,
    /// Mapping ids of the capture's binaries by basename (a frame's module).
    binaries: FxHashMap<&'p str, u64>,
    /// Mapping ids of other modules by name.
    other_mappings: FxHashMap<String, u64>,
    functions: Vec<Message>,
    function_ids: FxHashMap<(i64, i64, i64), u64>,
    locations: Vec<Message>,
    /// Location id by frame id, 0 until a sample uses the frame.
    frame_locations: Vec<u64>,
    placeholders: FxHashMap<&'static str, u64>,
}

impl<'p> Builder<'p> {
    fn new(profile: &'p Profile) -> Builder<'p> {
        let naming = Naming {
            lines: false,
            mark_jit: profile.naming.mark_jit,
        };
        let mut b = Builder {
            profile,
            names: profile
                .frames
                .iter()
                .map(|f| f.display_name(naming))
                .collect(),
            strings: Strings {
                strings: vec![String::new()],
                ids: FxHashMap::from_iter([(String::new(), 0)]),
            },
            mappings: Vec::new(),
            binaries: FxHashMap::default(),
            other_mappings: FxHashMap::default(),
            functions: Vec::new(),
            function_ids: FxHashMap::default(),
            locations: Vec::new(),
            frame_locations: vec![0; profile.frames.len()],
            placeholders: FxHashMap::default(),
        };
        for binary in &profile.binaries {
            let build_id = binary.build_id.as_deref().map(build_id_hex);
            let id = b.mapping(&binary.path, build_id.as_deref());
            // As frames name their module.
            b.binaries.entry(basename(&binary.path)).or_insert(id);
        }
        b
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> Message {
        let mut m = Message::new();
        m.int(field::value_type::TYPE, self.strings.id(kind))
            .int(field::value_type::UNIT, self.strings.id(unit));
        m
    }

    /// Adds a mapping; its id.
    fn mapping(&mut self, filename: &str, build_id: Option<&str>) -> u64 {
        use field::mapping as f;
        let id = self.mappings.len() as u64 + 1;
        let mut m = Message::new();
        m.uint(f::ID, id)
            .int(f::FILENAME, self.strings.id(filename))
            .int(f::BUILD_ID, build_id.map_or(0, |b| self.strings.id(b)))
            .bool(f::HAS_FUNCTIONS, true)
            .bool(f::HAS_FILENAMES, true)
            .bool(f::HAS_LINE_NUMBERS, true)
            .bool(f::HAS_INLINE_FRAMES, true);
        self.mappings.push(m);
        id
    }

    /// The mapping named `name` that is not a binary of the capture, added on first use.
    fn other_mapping(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.other_mappings.get(name) {
            return id;
        }
        let id = self.mapping(name, None);
        self.other_mappings.insert(name.to_owned(), id);
        id
    }

    fn mapping_of(&mut self, frame: &Frame) -> u64 {
        match (frame.kind, frame.module.as_deref()) {
            (FrameKind::Kernel | FrameKind::Wait, _) => self.other_mapping(KERNEL_MAPPING),
            (FrameKind::Lua, Some(chunk)) => self.other_mapping(chunk),
            (FrameKind::Lua, None) => self.other_mapping(LUA_MAPPING),
            (FrameKind::User | FrameKind::Inlined, Some(module)) => {
                match self.binaries.get(module) {
                    Some(&id) => id,
                    None => self.other_mapping(module),
                }
            }
            (FrameKind::User | FrameKind::Inlined, None) => self.other_mapping(UNKNOWN),
        }
    }

    /// The function of this name, file and start line (names as string ids), added on
    /// first use.
    fn function(&mut self, name: i64, filename: i64, start_line: u32) -> u64 {
        use field::function as f;
        let key = (name, filename, i64::from(start_line));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let mut m = Message::new();
        // No system name: pprof simplifies a name equal to its system name as if it were
        // C++ (dropping `(…)` and `<…>`), and lanalyze's names are final.
        m.uint(f::ID, id)
            .int(f::NAME, name)
            .int(f::FILENAME, filename)
            .int(f::START_LINE, key.2);
        self.functions.push(m);
        self.function_ids.insert(key, id);
        id
    }

    /// Adds a location of one function at one line; its id.
    fn new_location(&mut self, mapping: u64, function: u64, line: u32) -> u64 {
        use field::location as f;
        let id = self.locations.len() as u64 + 1;
        let mut l = Message::new();
        l.uint(field::line::FUNCTION_ID, function)
            .int(field::line::LINE, line.into());
        let mut m = Message::new();
        m.uint(f::ID, id)
            .uint(f::MAPPING_ID, mapping)
            .message(f::LINE, &l);
        self.locations.push(m);
        id
    }

    /// The location of a frame, added on first use.
    fn location(&mut self, id: FrameId) -> u64 {
        if let Some(&loc) = self.frame_locations.get(id as usize).filter(|&&l| l != 0) {
            return loc;
        }
        let frame = self.profile.frame(id);
        let mapping = self.mapping_of(frame);
        let (start, current) = frame.lines.map_or((0, 0), |l| (l.first, l.current));
        let name = self.strings.id(&self.names[id as usize]);
        let filename = self.strings.id(frame.module.as_deref().unwrap_or(""));
        let function = self.function(name, filename, start);
        let loc = self.new_location(mapping, function, current);
        self.frame_locations[id as usize] = loc;
        loc
    }

    /// The location of a pseudo-frame such as `[truncated]`, added on first use.
    fn placeholder(&mut self, name: &'static str) -> u64 {
        if let Some(&loc) = self.placeholders.get(name) {
            return loc;
        }
        let mapping = self.other_mapping(UNKNOWN);
        let name_id = self.strings.id(name);
        let function = self.function(name_id, 0, 0);
        let loc = self.new_location(mapping, function, 0);
        self.placeholders.insert(name, loc);
        loc
    }
}

#[cfg(test)]
mod tests;

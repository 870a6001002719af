//! The pprof writer over a small hand-made profile, read back with a minimal decoder.

use std::collections::BTreeMap;
use std::io::Read;

use super::proto::decode::{fields, packed, Value};
use super::*;
use crate::{BinaryInfo, LuaLines, ProfileSample, Thread};

/// A sample as `((labels, stack of locations leaf first), values)`.
type Stack = ((String, Vec<String>), Vec<u64>);

/// What a test needs of a decoded profile.proto, names resolved through the string table.
#[derive(Debug, Default)]
struct Decoded {
    strings: Vec<String>,
    sample_types: Vec<(String, String)>,
    /// Location ids leaf first, values, labels as `key=value`.
    samples: Vec<(Vec<u64>, Vec<u64>, Vec<String>)>,
    /// Filename and build id by id.
    mappings: BTreeMap<u64, (String, String)>,
    /// Mapping id, function id and line by id.
    locations: BTreeMap<u64, (u64, u64, i64)>,
    /// Name, filename and start line by id.
    functions: BTreeMap<u64, (String, String, i64)>,
    period_type: Option<(String, String)>,
    period: u64,
    time_nanos: u64,
    duration_nanos: u64,
    comments: Vec<String>,
}

fn varint(v: &Value) -> u64 {
    match v {
        Value::Varint(v) => *v,
        Value::Bytes(_) => panic!("expected a varint"),
    }
}

fn bytes<'a>(v: &Value<'a>) -> &'a [u8] {
    match v {
        Value::Bytes(b) => b,
        Value::Varint(_) => panic!("expected bytes"),
    }
}

/// The varint fields of a message by number (the last one wins, as in protobuf).
fn ints(buf: &[u8]) -> BTreeMap<u32, u64> {
    fields(buf)
        .into_iter()
        .filter_map(|(f, v)| matches!(v, Value::Varint(_)).then(|| (f, varint(&v))))
        .collect()
}

fn decode(buf: &[u8]) -> Decoded {
    let top = fields(buf);
    let mut d = Decoded::default();
    for (f, v) in &top {
        if *f == 6 {
            d.strings
                .push(String::from_utf8(bytes(v).to_vec()).unwrap());
        }
    }
    let s = |i: u64| d.strings[i as usize].clone();
    let value_type = |b: &[u8]| {
        let m = ints(b);
        (
            s(m.get(&1).copied().unwrap_or(0)),
            s(m.get(&2).copied().unwrap_or(0)),
        )
    };
    let mut out = Decoded::default();
    for (f, v) in &top {
        match f {
            1 => out.sample_types.push(value_type(bytes(v))),
            2 => {
                let (mut locations, mut values, mut labels) = (vec![], vec![], vec![]);
                for (sf, sv) in fields(bytes(v)) {
                    match sf {
                        1 => locations = packed(bytes(&sv)),
                        2 => values = packed(bytes(&sv)),
                        3 => {
                            let l = ints(bytes(&sv));
                            let value = match l.get(&2) {
                                Some(&str) => s(str),
                                None => l.get(&3).copied().unwrap_or(0).to_string(),
                            };
                            labels.push(format!("{}={value}", s(l[&1])));
                        }
                        _ => panic!("unexpected sample field {sf}"),
                    }
                }
                out.samples.push((locations, values, labels));
            }
            3 => {
                let m = ints(bytes(v));
                for flag in 7..=10 {
                    assert_eq!(m.get(&flag), Some(&1), "mapping flag {flag}");
                }
                let build_id = s(m.get(&6).copied().unwrap_or(0));
                out.mappings.insert(m[&1], (s(m[&5]), build_id));
            }
            4 => {
                let mut id = 0;
                let mut mapping = 0;
                let mut lines = Vec::new();
                for (lf, lv) in fields(bytes(v)) {
                    match lf {
                        1 => id = varint(&lv),
                        2 => mapping = varint(&lv),
                        4 => {
                            let l = ints(bytes(&lv));
                            lines.push((l[&1], l.get(&2).copied().unwrap_or(0) as i64));
                        }
                        _ => panic!("unexpected location field {lf}"),
                    }
                }
                assert_eq!(lines.len(), 1, "one line per location");
                out.locations.insert(id, (mapping, lines[0].0, lines[0].1));
            }
            5 => {
                let m = ints(bytes(v));
                let get = |k| m.get(&k).copied().unwrap_or(0);
                assert_eq!(get(3), 0, "a system name lets pprof simplify the name");
                out.functions
                    .insert(m[&1], (s(get(2)), s(get(4)), get(5) as i64));
            }
            6 => {}
            9 => out.time_nanos = varint(v),
            10 => out.duration_nanos = varint(v),
            11 => out.period_type = Some(value_type(bytes(v))),
            12 => out.period = varint(v),
            13 => out.comments.extend(packed(bytes(v)).into_iter().map(s)),
            _ => panic!("unexpected profile field {f}"),
        }
    }
    out.strings = d.strings;
    out
}

impl Decoded {
    /// A location as `name file:start @line [mapping]`.
    fn location(&self, id: u64) -> String {
        let (mapping, function, line) = self.locations[&id];
        let (name, file, start) = &self.functions[&function];
        format!(
            "{name} {file}:{start} @{line} [{}]",
            self.mappings[&mapping].0
        )
    }

    /// Each sample's labels and stack (leaf first), with its values, sorted.
    fn stacks(&self) -> Vec<Stack> {
        let mut stacks: Vec<_> = self
            .samples
            .iter()
            .map(|(locations, values, labels)| {
                let stack = locations.iter().map(|&l| self.location(l)).collect();
                ((labels.join(","), stack), values.clone())
            })
            .collect();
        stacks.sort();
        stacks
    }
}

fn frame(name: &str, module: Option<&str>, kind: FrameKind) -> Frame {
    Frame::named(name, module.map(str::to_owned), kind)
}

fn lua(name: &str, first: u32, current: u32, jit: bool) -> Frame {
    Frame {
        lines: Some(LuaLines { first, current }),
        jit,
        ..frame(name, Some("chains.lua"), FrameKind::Lua)
    }
}

fn sample(thread: usize, time_ns: u64, frames: &[u32], truncated: bool) -> ProfileSample {
    let ids = (10, 10 + thread as u32, thread);
    crate::render::test_util::sample(ids, time_ns, frames, truncated)
}

fn binary(path: &str, build_id: Option<Vec<u8>>) -> BinaryInfo {
    BinaryInfo {
        path: path.into(),
        build_id,
        sections_embedded: true,
        dwarf_embedded: false,
        resolved_locally: vec![],
        has_unwind_info: true,
        has_dwarf: false,
        error: None,
        samples_without_unwind_info: 0,
    }
}

fn profile() -> Profile {
    let mut p = Profile {
        frames: vec![
            frame("main", Some("app"), FrameKind::User),
            frame("work", Some("app"), FrameKind::User),
            frame("helper", Some("app"), FrameKind::Inlined),
            frame("do_syscall_64", None, FrameKind::Kernel),
            lua("hot chains.lua:12", 12, 14, false),
            lua("hot chains.lua:12", 12, 15, false),
            frame("pcall", None, FrameKind::Lua),
            frame("libfoo.so+0x10", Some("libfoo.so"), FrameKind::User),
            lua("hot chains.lua:12", 12, 14, true),
            frame("unused", Some("app"), FrameKind::User),
        ],
        threads: vec![
            Thread {
                pid: 10,
                tid: 10,
                name: "app".into(),
                samples: 6,
            },
            Thread {
                pid: 10,
                tid: 11,
                name: "worker".into(),
                samples: 3,
            },
        ],
        samples: vec![
            sample(0, 2_000, &[0, 1, 2], false),
            sample(1, 2_500, &[0, 1, 6, 4], false),
            sample(0, 3_000, &[0, 1, 2], false),
            sample(0, 4_000, &[0, 1, 3], false),
            sample(1, 5_000, &[0, 1, 6, 5], false),
            sample(0, 6_000, &[7], true),
            sample(0, 7_000, &[], true),
            sample(1, 8_000, &[0, 1, 6, 8], false),
            sample(0, 9_000, &[0, 1, 2], false),
        ],
        binaries: vec![
            binary("/usr/bin/app", Some(vec![0xde, 0xad, 0x0b, 0xef])),
            binary("/lib/libc.so.6", None),
        ],
        ..Profile::default()
    };
    p.header.frequency_hz = 99;
    p.header.wall_clock_start_ns = 1_700_000_000_000_000_000;
    p.header.monotonic_start_ns = 1_000;
    p.header.command_line = vec!["lrec".into(), "-F".into(), "99".into()];
    p
}

fn encoded(p: &Profile) -> Decoded {
    let mut buf = Vec::new();
    encode(p, &mut buf).unwrap();
    decode(&buf)
}

#[test]
fn period_is_the_sampling_interval_rounded() {
    assert_eq!(period_ns(99), Some(10_101_010));
    assert_eq!(period_ns(3), Some(333_333_333));
    assert_eq!(period_ns(1_000_000_000), Some(1));
    assert_eq!(period_ns(0), None);
}

#[test]
fn header_types_period_and_times() {
    let d = encoded(&profile());
    assert_eq!(d.strings[0], "");
    let vt = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        d.sample_types,
        [vt("samples", "count"), vt("cpu", "nanoseconds")]
    );
    assert_eq!(d.period_type, Some(vt("cpu", "nanoseconds")));
    assert_eq!(d.period, 10_101_010);
    // The first sample, 1 µs after the start of recording, on the wall clock.
    assert_eq!(d.time_nanos, 1_700_000_000_000_001_000);
    assert_eq!(d.duration_nanos, 7_000);
    assert_eq!(d.comments, ["recorded by: lrec -F 99"]);
    let distinct = |v: Vec<&String>| {
        let n = v.len();
        let mut v = v;
        v.sort();
        v.dedup();
        n == v.len()
    };
    assert!(distinct(d.strings.iter().collect()), "strings appear once");
}

#[test]
fn stacks_are_leaf_first_aggregated_and_labelled() {
    let d = encoded(&profile());
    let p = 10_101_010;
    let app = "thread=app,pid=10,tid=10";
    let worker = "thread=worker,pid=10,tid=11";
    let stack = |labels: &str, frames: &[&str]| {
        (
            labels.to_owned(),
            frames.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        )
    };
    let main = "main app:0 @0 [/usr/bin/app]";
    let work = "work app:0 @0 [/usr/bin/app]";
    let pcall = "pcall :0 @0 [[lua]]";
    let hot = |line: u32| format!("hot chains.lua:12 chains.lua:12 @{line} [chains.lua]");
    let mut expected = vec![
        (
            stack(app, &["helper app:0 @0 [/usr/bin/app]", work, main]),
            vec![3, 3 * p],
        ),
        (
            stack(
                app,
                &["do_syscall_64_[k] :0 @0 [[kernel.kallsyms]]", work, main],
            ),
            vec![1, p],
        ),
        (
            stack(
                app,
                &[
                    "libfoo.so+0x10 libfoo.so:0 @0 [libfoo.so]",
                    "[truncated] :0 @0 [[unknown]]",
                ],
            ),
            vec![1, p],
        ),
        (stack(app, &["[unknown] :0 @0 [[unknown]]"]), vec![1, p]),
        // The interpreted and the JIT-compiled frame at line 14: two locations, the same
        // function and line (without --mark-jit).
        (stack(worker, &[&hot(14), pcall, work, main]), vec![1, p]),
        (stack(worker, &[&hot(14), pcall, work, main]), vec![1, p]),
        (stack(worker, &[&hot(15), pcall, work, main]), vec![1, p]),
    ];
    expected.sort();
    assert_eq!(d.stacks(), expected);
}

#[test]
fn tables_have_unique_one_based_ids_and_binaries_as_mappings() {
    let d = encoded(&profile());
    let ids_are_1_to_n = |ids: Vec<u64>| ids == (1..=ids.len() as u64).collect::<Vec<_>>();
    assert!(ids_are_1_to_n(d.mappings.keys().copied().collect()));
    assert!(ids_are_1_to_n(d.locations.keys().copied().collect()));
    assert!(ids_are_1_to_n(d.functions.keys().copied().collect()));
    assert_eq!(d.mappings[&1], ("/usr/bin/app".into(), "dead0bef".into()));
    assert_eq!(d.mappings[&2], ("/lib/libc.so.6".into(), String::new()));
    let mut others: Vec<&str> = d.mappings.values().skip(2).map(|m| m.0.as_str()).collect();
    others.sort();
    assert_eq!(
        others,
        [
            "[kernel.kallsyms]",
            "[lua]",
            "[unknown]",
            "chains.lua",
            "libfoo.so"
        ]
    );
    // hot at lines 14 and 15 (twice: interpreted and JIT): one function.
    let hot: Vec<_> = d
        .functions
        .values()
        .filter(|f| f.0 == "hot chains.lua:12")
        .collect();
    assert_eq!(
        hot,
        [&("hot chains.lua:12".into(), "chains.lua".into(), 12)]
    );
    let mut keys: Vec<_> = d.functions.values().collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "functions are distinct");
    // Only frames that samples use become locations.
    assert!(!d.functions.values().any(|f| f.0 == "unused"));
    assert_eq!(d.locations.len(), 11);
}

#[test]
fn mark_jit_names_jit_frames_and_lines_never_split_functions() {
    let mut p = profile();
    p.naming = Naming {
        lines: true,
        mark_jit: true,
    };
    let d = encoded(&p);
    let names: Vec<&str> = d.functions.values().map(|f| f.0.as_str()).collect();
    assert!(names.contains(&"hot chains.lua:12_[j]"), "{names:?}");
    assert!(names.contains(&"hot chains.lua:12"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains('@')), "{names:?}");
}

#[test]
fn without_a_frequency_samples_are_only_counted() {
    let mut p = profile();
    p.header.frequency_hz = 0;
    let d = encoded(&p);
    assert_eq!(d.sample_types, [("samples".into(), "count".into())]);
    assert_eq!(d.period_type, None);
    assert_eq!(d.period, 0);
    assert!(d.samples.iter().all(|s| s.1.len() == 1));
    assert_eq!(d.samples.iter().map(|s| s.1[0]).sum::<u64>(), 9);
}

#[test]
fn an_empty_profile_is_valid() {
    let d = encoded(&Profile::default());
    assert_eq!(d.strings[0], "");
    assert!(d.samples.is_empty() && d.locations.is_empty() && d.mappings.is_empty());
}

#[test]
fn output_is_gzip_of_the_message() {
    let p = profile();
    let mut gz = Vec::new();
    write_pprof(&p, &mut gz).unwrap();
    assert_eq!(&gz[..2], [0x1f, 0x8b]);
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut plain)
        .unwrap();
    let mut expected = Vec::new();
    encode(&p, &mut expected).unwrap();
    assert_eq!(plain, expected);
}

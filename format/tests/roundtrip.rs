//! Round-trip, truncation and corruption tests of the capture format.

use lrec_format::*;
use proptest::prelude::*;

fn sample(i: u64) -> Sample {
    Sample {
        time_ns: 1_000 + i,
        pid: 42,
        tid: 42 + (i % 3) as u32,
        cpu: (i % 2) as u32,
        flags: 0,
        regs: Regs {
            ip: 0x4000 + i,
            sp: 0x7ffd_0000,
            ..Regs::default()
        },
        user_stack: (0..512u32).map(|b| (b as u64 * i) as u8).collect(),
        kernel_stack: vec![0xffff_ffff_8100_0000 + i],
    }
}

/// A capture of `n` samples in chunks of about `per_chunk` samples, with an end record.
fn capture(n: u64, per_chunk: u64) -> (Vec<u8>, Vec<Record>) {
    let header = Header {
        tool_version: "lrec test".into(),
        frequency_hz: 99,
        target_pid: 42,
        ..Header::default()
    };
    let mut w = CaptureWriter::new(Vec::new(), &header).unwrap();
    let mut expected = vec![Record::Header(header)];
    let mapping = Record::Mapping(Mapping {
        pid: 42,
        start: 0x4000,
        end: 0x5000,
        path: "/bin/x".into(),
        build_id: Some(vec![1, 2, 3]),
        ..Mapping::default()
    });
    w.push(&mapping).unwrap();
    expected.push(mapping);
    for i in 0..n {
        let r = Record::Sample(sample(i));
        w.push(&r).unwrap();
        expected.push(r);
        if (i + 1) % per_chunk == 0 {
            w.flush().unwrap();
        }
    }
    let end = Record::End(End {
        samples: n,
        reason: "duration".into(),
        ..End::default()
    });
    w.push(&end).unwrap();
    expected.push(end);
    (w.finish().unwrap(), expected)
}

#[test]
fn round_trip() {
    let (bytes, expected) = capture(100, 10);
    let cap = Capture::from_bytes(bytes).unwrap();
    let (records, warnings) = cap.read_all();
    assert_eq!(warnings, vec![]);
    assert_eq!(records, expected);
    // Header; the mapping, then samples in their own chunks; the end.
    assert_eq!(cap.chunks().len(), 1 + 1 + 10 + 1);
    // Each chunk says which kinds it holds.
    let kinds: Vec<u32> = cap.chunks().iter().map(|c| c.kinds).collect();
    assert_eq!(kinds[0], kind_bit(kind::HEADER));
    assert_eq!(kinds[1], kind_bit(kind::MAPPING));
    assert!(kinds[2..12].iter().all(|&k| k == kind_bit(kind::SAMPLE)));
    assert_eq!(kinds[12], kind_bit(kind::END));
}

#[test]
fn visiting_borrows_samples_and_skips_unwanted_kinds() {
    let (bytes, expected) = capture(20, 20);
    let cap = Capture::from_bytes(bytes).unwrap();
    let mut seen = Vec::new();
    for c in cap.chunks() {
        let w = cap.visit_chunk(
            c,
            |k| k == kind::SAMPLE,
            |r| match r {
                RecordRef::Sample(s) => seen.push(Record::Sample(s.to_owned())),
                other => panic!("unwanted record visited: {other:?}"),
            },
        );
        assert!(w.is_empty());
    }
    let samples: Vec<Record> = expected
        .into_iter()
        .filter(|r| matches!(r, Record::Sample(_)))
        .collect();
    assert_eq!(seen, samples);
}

#[test]
fn truncation_keeps_every_complete_chunk() {
    let (bytes, expected) = capture(30, 10);
    let cap = Capture::from_bytes(bytes.clone()).unwrap();
    let ends: Vec<usize> = cap
        .chunks()
        .iter()
        .map(|c| c.offset as usize + 24 + c.compressed_len as usize)
        .collect();
    for cut in 12..bytes.len() {
        let cap = Capture::from_bytes(bytes[..cut].to_vec()).unwrap();
        let complete = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(cap.chunks().len(), complete, "cut at {cut}");
        let (records, warnings) = cap.read_all();
        assert!(expected.starts_with(&records), "cut at {cut}");
        assert!(warnings.contains(&ReadWarning::NoEnd), "cut at {cut}");
        if cut > 12 && !ends.contains(&cut) {
            assert!(
                matches!(warnings[0], ReadWarning::Truncated { .. }),
                "cut at {cut}: {warnings:?}"
            );
        }
    }
}

#[test]
fn corrupt_chunk_is_skipped_and_reported() {
    let (mut bytes, expected) = capture(30, 10);
    let cap = Capture::from_bytes(bytes.clone()).unwrap();
    let second = cap.chunks()[2];
    // Flip a payload byte of the third chunk (samples 10..20).
    bytes[second.offset as usize + 30] ^= 0xff;
    let cap = Capture::from_bytes(bytes).unwrap();
    let (records, warnings) = cap.read_all();
    assert_eq!(records.len(), expected.len() - 10);
    assert!(matches!(warnings[0], ReadWarning::Corrupt { offset, .. } if offset == second.offset));
}

#[test]
fn damaged_length_field_is_not_mistaken_for_truncation() {
    let (mut bytes, expected) = capture(30, 10);
    let cap = Capture::from_bytes(bytes.clone()).unwrap();
    let c = cap.chunks()[1];
    bytes[c.offset as usize + 4..c.offset as usize + 8]
        .copy_from_slice(&(200u32 << 20).to_le_bytes());
    let (records, warnings) = Capture::from_bytes(bytes).unwrap().read_all();
    assert_eq!(records.len(), expected.len() - c.records as usize);
    assert!(
        matches!(warnings[0], ReadWarning::Corrupt { .. }),
        "{warnings:?}"
    );
}

#[test]
fn unknown_kinds_are_skipped_with_a_warning() {
    let mut w = CaptureWriter::new(Vec::new(), &Header::default()).unwrap();
    w.push(&Record::Unknown {
        kind: 999,
        payload: vec![1, 2, 3],
    })
    .unwrap();
    w.push(&Record::Lost(Lost {
        time_ns: 5,
        count: 7,
    }))
    .unwrap();
    w.push(&Record::End(End::default())).unwrap();
    let (records, warnings) = Capture::from_bytes(w.finish().unwrap()).unwrap().read_all();
    assert_eq!(records.len(), 4);
    assert_eq!(
        records[2],
        Record::Lost(Lost {
            time_ns: 5,
            count: 7
        })
    );
    assert_eq!(
        warnings,
        vec![ReadWarning::UnknownKind {
            kind: 999,
            count: 1
        }]
    );
}

#[test]
fn bad_input_gets_clear_errors() {
    assert!(matches!(
        Capture::from_bytes(b"hello world, not a capture".to_vec()),
        Err(FormatError::BadMagic)
    ));
    assert!(matches!(
        Capture::from_bytes(MAGIC[..5].to_vec()),
        Err(FormatError::TooShort(5))
    ));
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&[9, 0, 0, 0]);
    assert!(matches!(
        Capture::from_bytes(v),
        Err(FormatError::UnsupportedVersion { found: 9, .. })
    ));
}

fn damage_never_panics(bytes: &[u8]) {
    if let Ok(cap) = Capture::from_bytes(bytes.to_vec()) {
        let _ = cap.read_all();
    }
}

/// Real captures committed under fixtures/captures, if any, plus a synthetic one.
fn corpus() -> Vec<Vec<u8>> {
    let mut v = vec![capture(40, 7).0];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/captures");
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "lrec") {
                v.push(std::fs::read(e.path()).unwrap());
            }
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn random_truncations_and_flips_never_panic(
        which in 0usize..8, cut in 0.0f64..1.0, flips in proptest::collection::vec((0.0f64..1.0, 1u8..=255), 0..6)
    ) {
        let corpus = corpus();
        let mut bytes = corpus[which % corpus.len()].clone();
        for (at, x) in flips {
            let i = ((bytes.len() - 1) as f64 * at) as usize;
            bytes[i] ^= x;
        }
        let keep = (bytes.len() as f64 * cut) as usize;
        damage_never_panics(&bytes[..keep]);
        damage_never_panics(&bytes);
    }
}

/// A sink that keeps chunks apart, as lrec's flight recorder does.
#[derive(Default)]
struct Apart {
    file_header: Vec<u8>,
    chunks: Vec<Chunk>,
}

impl CaptureSink for Apart {
    fn write_file_header(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file_header = bytes.to_vec();
        Ok(())
    }

    fn write_chunk(&mut self, chunk: Chunk) -> std::io::Result<()> {
        self.chunks.push(chunk);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Chunks kept apart, some dropped, and one encoded on its own still make a capture.
#[test]
fn chunks_kept_apart_make_a_capture_again() {
    let mut w = CaptureWriter::new(Apart::default(), &Header::default()).unwrap();
    for i in 0..6 {
        w.push(&Record::Sample(sample(i))).unwrap();
        w.push(&Record::ThreadName(ThreadName {
            pid: 42,
            tid: i as u32,
            name: format!("t{i}"),
        }))
        .unwrap();
        w.flush().unwrap();
    }
    let apart = w.finish().unwrap();
    let is_samples = |c: &Chunk| c.kinds() == kind_bit(kind::SAMPLE);
    // Header chunk, then a metadata and a sample chunk per flush.
    assert_eq!(apart.chunks.len(), 13, "{:?}", apart.chunks);
    assert_eq!(apart.chunks.iter().filter(|c| is_samples(c)).count(), 6);
    // Keep the metadata and the last two sample chunks, and add an end.
    let mut bytes = apart.file_header.clone();
    let samples: Vec<&Chunk> = apart.chunks.iter().filter(|c| is_samples(c)).collect();
    for c in apart.chunks.iter().filter(|c| !is_samples(c)) {
        bytes.extend_from_slice(c.as_bytes());
    }
    for c in &samples[4..] {
        bytes.extend_from_slice(c.as_bytes());
    }
    let end = Chunk::encode(&[Record::End(End::default())], 3).unwrap();
    assert_eq!((end.records(), end.kinds()), (1, kind_bit(kind::END)));
    bytes.extend_from_slice(end.as_bytes());
    let (records, warnings) = Capture::from_bytes(bytes).unwrap().read_all();
    assert!(warnings.is_empty(), "{warnings:?}");
    let times: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s.time_ns),
            _ => None,
        })
        .collect();
    assert_eq!(times, [1_004, 1_005]);
    let names = records
        .iter()
        .filter(|r| matches!(r, Record::ThreadName(_)))
        .count();
    assert_eq!(names, 6);
}

/// A Lua stack of thread `tid` whose innermost `head` frames vary with `i` and whose
/// `depth` outer frames do not.
fn lua_stack(i: u64, tid: u32, head: usize, depth: usize) -> LuaStack {
    let frame = |function: u32, pos: u32| LuaFrame {
        kind: lua_frame_kind::LUA,
        function,
        pos,
        cframe: 0x7ffd_1000,
        ..LuaFrame::default()
    };
    let inner = (0..head).map(|h| frame(1000 + h as u32, (i as u32) * 7 + h as u32));
    LuaStack {
        pid: 42,
        tid,
        time_ns: 1_000 + i,
        vm: 0x1000,
        state: 0x2000,
        frames: inner
            .chain((0..depth).rev().map(|d| frame(d as u32, 3)))
            .collect(),
        ..LuaStack::default()
    }
}

/// Lua stacks share their outer frames with the previous stack of their thread in the
/// same chunk, and read back whole, across threads, depths and chunks.
#[test]
fn lua_stacks_share_outer_frames_within_a_chunk() {
    let mut w = CaptureWriter::new(Vec::new(), &Header::default()).unwrap();
    let mut expected = vec![Record::Header(Header::default())];
    for i in 0..60u64 {
        let tid = 42 + (i % 3) as u32;
        // Deeper, shallower, and a stack of another process on one of the threads.
        let mut s = lua_stack(i, tid, 1 + (i % 4) as usize, 20 + (i % 5) as usize);
        if i == 31 {
            s.pid = 43;
        }
        for r in [Record::LuaStack(s), Record::Sample(sample(i))] {
            w.push(&r).unwrap();
            expected.push(r);
        }
        if i % 20 == 19 {
            w.flush().unwrap();
        }
    }
    let end = Record::End(End::default());
    w.push(&end).unwrap();
    expected.push(end);
    let bytes = w.finish().unwrap();
    let cap = Capture::from_bytes(bytes).unwrap();
    let (records, warnings) = cap.read_all();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records, expected);
    let shared = kind_bit(kind::LUA_STACK_SHARED);
    assert!(cap
        .chunks()
        .iter()
        .all(|c| c.kinds & kind_bit(kind::SAMPLE) == 0 || c.kinds & shared != 0));
    // The first stack of each thread in a chunk is whole: 3 threads, 3 chunks, and the
    // stack of another process with the one after it.
    let whole = cap
        .chunks()
        .iter()
        .map(|c| {
            let raw = cap.inflate_chunk(c).unwrap();
            let mut n = 0;
            let mut at = 0;
            while at < raw.len() {
                let k = u16::from_le_bytes([raw[at], raw[at + 1]]);
                n += usize::from(k == kind::LUA_STACK);
                at += 6 + u32::from_le_bytes(raw[at + 2..at + 6].try_into().unwrap()) as usize;
            }
            n
        })
        .sum::<usize>();
    assert_eq!(whole, 3 * 3 + 2);
}

/// A shared Lua stack whose thread's earlier stack is missing from its chunk is reported,
/// never completed from another.
#[test]
fn a_shared_lua_stack_without_its_earlier_one_is_reported() {
    let stacks: Vec<Record> = (0..4)
        .map(|i| Record::LuaStack(lua_stack(i, 42, 1, 10)))
        .collect();
    let chunk = Chunk::encode(&stacks, 3).unwrap();
    let mut bytes = CaptureWriter::new(Vec::new(), &Header::default())
        .unwrap()
        .finish()
        .unwrap();
    let cap = Capture::from_bytes([bytes.clone(), chunk.as_bytes().to_vec()].concat()).unwrap();
    let raw = cap
        .inflate_chunk(&cap.chunks()[cap.chunks().len() - 1])
        .unwrap();
    // Drop the first (whole) stack.
    let first = 6 + u32::from_le_bytes(raw[2..6].try_into().unwrap()) as usize;
    let damaged = Chunk::from_encoded(&raw[first..], 3, chunk.kinds(), 3).unwrap();
    bytes.extend_from_slice(damaged.as_bytes());
    let (records, warnings) = Capture::from_bytes(bytes).unwrap().read_all();
    assert!(!records.iter().any(|r| r.kind() == kind::LUA_STACK));
    assert!(
        matches!(&warnings[..], [ReadWarning::BadRecord { kind: kind::LUA_STACK_SHARED, what, .. }, ..] if what.contains("lacks")),
        "{warnings:?}"
    );
}

/// Stacks pushed with the outer frames their pusher knows are shared read back as
/// `Record::LuaStack`s whole, across chunks (whose first stack of a thread is whole
/// whatever the pusher says) and a process change on a thread.
#[test]
fn lua_stacks_pushed_with_known_shared_frames_read_back_whole() {
    let mut w = CaptureWriter::new(Vec::new(), &Header::default()).unwrap();
    let mut expected = vec![Record::Header(Header::default())];
    let mut last: std::collections::HashMap<u32, LuaStack> = Default::default();
    for i in 0..60u64 {
        let tid = 42 + (i % 3) as u32;
        let mut s = lua_stack(i, tid, 1 + (i % 4) as usize, 20 + (i % 5) as usize);
        if i == 31 {
            s.pid = 43;
        }
        // What the pusher knows: the outer frames equal to its last stack's.
        let known = last.get(&tid).filter(|l| l.pid == s.pid).map_or(0, |l| {
            (l.frames.iter().rev())
                .zip(s.frames.iter().rev())
                .take_while(|(a, b)| a == b)
                .count()
        });
        let header = LuaStack {
            frames: Vec::new(),
            ..s.clone()
        };
        w.push_lua_stack(&header, &s.frames, known).unwrap();
        w.push(&Record::Sample(sample(i))).unwrap();
        last.insert(tid, s.clone());
        expected.push(Record::LuaStack(s));
        expected.push(Record::Sample(sample(i)));
        if i % 20 == 19 {
            w.flush().unwrap();
        }
    }
    let end = Record::End(End::default());
    w.push(&end).unwrap();
    expected.push(end);
    let cap = Capture::from_bytes(w.finish().unwrap()).unwrap();
    let (records, warnings) = cap.read_all();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records, expected);
    let shared = kind_bit(kind::LUA_STACK_SHARED);
    assert!(cap.chunks().iter().any(|c| c.kinds & shared != 0));
}

//! End-to-end check of unwinding and symbolization without BPF: this test process records
//! one sample of itself the way lrec would (registers, stack bytes from sp upward, its
//! /proc/self/maps, and the unwind/symbol sections of every mapped ELF file), writes a
//! capture, and checks that lanalyze (offline) rebuilds the true call chain, complete to
//! the thread's root.
//!
//! It exercises: PIE executable and shared-library (libc) address translation, `.eh_frame`
//! CFI unwinding of code built without frame pointers, the end-of-stack rule of `clone3`
//! / `start_thread`, and DWARF symbolization of the test binary.

use std::collections::HashMap;

use lanalyze::render::{folded_stacks, StackOptions};
use lanalyze::{analyze, Options};
use lrec_format::{
    Binary, Capture, CaptureWriter, End, Header, Mapping, Record, Regs, Sample, ThreadName,
};
use lrec_inspect::elf::{self, DebugInfo};

const STACK_COPY: u64 = 256 * 1024;

/// Registers and stack bytes at the point of the call, as BPF would copy them.
#[inline(never)]
fn snapshot() -> (Regs, Vec<u8>) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: only reads registers.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nostack),
        );
    }
    let end = stack_end(sp);
    let len = (end - sp).min(STACK_COPY);
    let mut stack = Vec::with_capacity(len as usize);
    for i in (0..len).step_by(8) {
        // SAFETY: [sp, end) is this thread's mapped stack.
        let word = unsafe { std::ptr::read_volatile((sp + i) as *const u64) };
        stack.extend_from_slice(&word.to_le_bytes());
    }
    let regs = Regs {
        ip,
        sp,
        bp,
        ..Regs::default()
    };
    (regs, std::hint::black_box(stack))
}

fn stack_end(sp: u64) -> u64 {
    maps()
        .into_iter()
        .find(|m| m.start <= sp && sp < m.end)
        .expect("sp in a mapping")
        .end
}

#[inline(never)]
fn chain_three() -> (Regs, Vec<u8>) {
    std::hint::black_box(snapshot())
}

#[inline(never)]
fn chain_two() -> (Regs, Vec<u8>) {
    std::hint::black_box(chain_three())
}

#[inline(never)]
fn chain_one() -> (Regs, Vec<u8>) {
    std::hint::black_box(chain_two())
}

fn maps() -> Vec<Mapping> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap();
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (_dev, _inode) = (f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            let (start, end) = range.split_once('-')?;
            Some(Mapping {
                pid: std::process::id(),
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                perms: perms.into(),
                path,
                ..Mapping::default()
            })
        })
        .collect()
}

fn binary_of(path: &str) -> Option<Binary> {
    let data = std::fs::read(path).ok()?;
    let binary = elf::binary_record(path, &data, DebugInfo::All);
    binary.error.is_none().then_some(binary)
}

fn record_self(regs: Regs, stack: Vec<u8>) -> Vec<u8> {
    let pid = std::process::id();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc_gettid() };
    let mut writer = CaptureWriter::new(
        Vec::new(),
        &Header {
            arch: "x86_64".into(),
            page_size: 4096,
            target_pid: pid,
            ..Header::default()
        },
    )
    .unwrap();
    let mut binaries: HashMap<String, Binary> = HashMap::new();
    let mut mappings = maps();
    for m in &mut mappings {
        if m.path.starts_with('/') {
            if let Some(b) = binaries
                .entry(m.path.clone())
                .or_insert_with(|| binary_of(&m.path).unwrap_or_default())
                .build_id
                .clone()
            {
                m.build_id = Some(b);
            }
        }
        writer.push(&Record::Mapping(m.clone())).unwrap();
    }
    for b in binaries.into_values().filter(|b| !b.path.is_empty()) {
        writer.push(&Record::Binary(b)).unwrap();
    }
    writer
        .push(&Record::ThreadName(ThreadName {
            pid,
            tid,
            name: "selftest".into(),
        }))
        .unwrap();
    writer
        .push(&Record::Sample(Sample {
            time_ns: 1,
            pid,
            tid,
            regs,
            user_stack: stack,
            ..Sample::default()
        }))
        .unwrap();
    writer
        .push(&Record::End(End {
            samples: 1,
            reason: "test".into(),
            ..End::default()
        }))
        .unwrap();
    writer.finish().unwrap()
}

extern "C" {
    fn gettid() -> i32;
}

unsafe fn libc_gettid() -> u32 {
    gettid() as u32
}

#[test]
fn unwinds_own_stack_to_the_thread_root() {
    // A fresh thread: its root is libc's clone3/start_thread, whose CFI ends the stack.
    let (regs, stack) = std::thread::spawn(chain_one).join().unwrap();
    let capture = Capture::from_bytes(record_self(regs, stack)).unwrap();
    let profile = analyze(
        &capture,
        &Options {
            offline: true,
            ..Options::default()
        },
    )
    .unwrap();
    let stacks = folded_stacks(&profile, StackOptions::default());
    assert_eq!(stacks.len(), 1);
    let (stack, _) = stacks.into_iter().next().unwrap();
    eprintln!("{stack}");
    for w in &profile.warnings {
        eprintln!("warning: {}", w.message);
    }
    assert!(stack.starts_with("selftest;"), "{stack}");
    assert!(!stack.contains("[truncated]"), "incomplete: {stack}");
    assert!(!stack.contains("[unknown]"), "{stack}");
    let frames: Vec<&str> = stack.split(';').collect();
    let pos = |name: &str| {
        frames
            .iter()
            .position(|f| f.ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing in {stack}"))
    };
    assert!(pos("self_unwind::chain_one") < pos("self_unwind::chain_two"));
    assert!(pos("self_unwind::chain_two") < pos("self_unwind::chain_three"));
    assert!(pos("self_unwind::chain_three") < pos("self_unwind::snapshot"));
    assert_eq!(frames.last().copied(), Some("self_unwind::snapshot"));
    assert_eq!(profile.stats.truncated + profile.stats.failed_unwinds, 0);
}

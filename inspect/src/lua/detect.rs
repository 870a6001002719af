//! Lua interpreters in ELF files, found by evidence rather than by shape: LuaJIT's VM by
//! the unwind entry its build tool writes byte for byte, PUC Lua's `luaV_execute` by its
//! release's version string and the opcode dispatch table that only the interpreter loop
//! has. Both were checked on the Lua binaries and ~3,000 other ELF files of a Debian
//! system (../shared/LUA-INTERNALS.md): no binary without a VM matches.

use std::collections::HashMap;

use object::elf;
use object::read::elf::{FileHeader, Rela, SectionHeader};
use object::{LittleEndian, Object, ObjectSection, SectionFlags};

use crate::elf::{for_each_fde, for_each_fde_of, parse_x86_64, Cie};
use lrec_format::Binary;

/// A LuaJIT interpreter found in a binary's `.eh_frame`: its code range (SVMA) and the
/// size of its C frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LuaJitVm {
    pub start: u64,
    pub end: u64,
    /// CFRAME_SIZE: the CFA offset of the VM's frame over its whole range.
    pub cframe_size: u32,
}

/// The x86_64 DWARF registers the VM's unwind entry names.
const RSP: u16 = 7;
const RA: u16 = 16;
/// The VM's own FDE saves rbp, rbx, r15 and r14 at CFA−16, −24, −32, −40.
const VM_SAVES: [(u16, u64); 4] = [(6, 2), (3, 3), (15, 4), (14, 5)];
/// CFRAME_SIZE of x86_64 builds with unwind info (LUAJIT_NO_UNWIND builds, 96, write no
/// FDE for the VM at all).
const VM_CFRAME: u64 = 80;

/// Finds LuaJIT's interpreter by the unwind entry buildvm writes for it (`emit_asm_debug`
/// in buildvm_asm.c), which no build hides and no compiler writes: a CIE with
/// augmentation "zPR" whose personality (`lj_err_unwind_dwarf`) is a direct pc-relative
/// pointer into the file's own code, code alignment 1, data alignment −8, return address
/// in column 16 and initial rule `rsp+8`; an FDE whose only instructions set the CFA to
/// `rsp+80` and save rbp, rbx, r15, r14. It covers `lj_vm_asm_begin` up to
/// `lj_vm_ffi_call`. The shape alone (a large function with CFA rsp+80) matches libgnutls,
/// libwireshark, perl and many more.
pub fn luajit_vm(binary: &Binary) -> Option<LuaJitVm> {
    use gimli::{CallFrameInstruction as I, Pointer, Register};
    let executable = |addr: u64| {
        binary
            .segments
            .iter()
            .any(|s| s.flags & 1 != 0 && addr >= s.vaddr && addr < s.vaddr + s.memsz)
    };
    let vm_cie = |cie: &Cie<'_>| {
        matches!(
            cie.personality_with_encoding(),
            Some((enc, Pointer::Direct(p))) if enc.0 == 0x1b && executable(p)
        ) && cie.code_alignment_factor() == 1
            && cie.data_alignment_factor() == -8
            && cie.return_address_register() == Register(RA)
            && !cie.has_lsda()
            && !cie.is_signal_trampoline()
    };
    let mut found: Option<LuaJitVm> = None;
    for_each_fde_of(binary, vm_cie, |fde, frame, bases| {
        let cie = fde.cie();
        if fde.len() == 0 {
            return;
        }
        let init = instructions(cie.instructions(frame, bases));
        let init_ok = matches!(
            init.as_deref(),
            Some([
                I::DefCfa {
                    register: Register(RSP),
                    offset: 8
                },
                I::Offset {
                    register: Register(RA),
                    factored_offset: 1
                }
            ])
        );
        let Some(body) = instructions(fde.instructions(frame, bases)).filter(|_| init_ok) else {
            return;
        };
        let saves = body.iter().skip(1).map(|i| match i {
            I::Offset {
                register,
                factored_offset,
            } => Some((register.0, *factored_offset)),
            _ => None,
        });
        if body.first() != Some(&I::DefCfaOffset { offset: VM_CFRAME })
            || body.len() != 1 + VM_SAVES.len()
            || !saves.eq(VM_SAVES.iter().map(|&s| Some(s)))
        {
            return;
        }
        // One VM per file: a second match would mean the rule is wrong, take neither.
        let vm = LuaJitVm {
            start: fde.initial_address(),
            end: fde.initial_address() + fde.len(),
            cframe_size: VM_CFRAME as u32,
        };
        found = match found {
            None => Some(vm),
            Some(_) => Some(LuaJitVm { end: 0, ..vm }),
        };
    });
    found.filter(|vm| vm.end != 0)
}

/// The instructions of a CIE or FDE without padding (`None` if they do not parse or are
/// more than a VM's entry has).
fn instructions<R: gimli::Reader>(
    mut iter: gimli::CallFrameInstructionIter<'_, R>,
) -> Option<Vec<gimli::CallFrameInstruction<R::Offset>>> {
    let mut out = Vec::new();
    while let Some(i) = iter.next().ok()? {
        if !matches!(i, gimli::CallFrameInstruction::Nop) {
            out.push(i);
        }
        if out.len() > 8 {
            return None;
        }
    }
    Some(out)
}

/// Where in an ELF file the strings that show Lua lie, as (file offset, size): its
/// read-only data (`.rodata*`, where lapi.c's `lua_ident` is) and its dynamic symbol names
/// (`.dynstr`). The whole file when its section headers cannot be read.
pub fn string_ranges(data: &[u8]) -> Vec<(u64, u64)> {
    let Ok(file) = parse_x86_64(data) else {
        return vec![(0, data.len() as u64)];
    };
    file.sections()
        .filter(|s| {
            s.name()
                .is_ok_and(|n| n.starts_with(".rodata") || n == ".dynstr")
        })
        .filter_map(|s| s.file_range())
        .collect()
}

/// A PUC Lua release named in a binary by `lua_ident` (lapi.c), which every build that
/// links the Lua API carries: `$LuaVersion: Lua 5.4.6  Copyright…` (5.2 on) or
/// `$Lua: Lua 5.1.5 Copyright…`. Returns (minor, patch), e.g. (4, 6).
pub fn lua_release(data: &[u8]) -> Option<(u32, u32)> {
    for prefix in [&b"$LuaVersion: Lua 5."[..], &b"$Lua: Lua 5."[..]] {
        let Some(at) = memchr::memmem::find(data, prefix) else {
            continue;
        };
        let rest = &data[at + prefix.len()..];
        let number = |b: &[u8]| -> Option<(u32, usize)> {
            let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
            Some((std::str::from_utf8(&b[..n]).ok()?.parse().ok()?, n))
        };
        let (minor, n) = number(rest)?;
        let patch = match rest.get(n) {
            Some(b'.') => number(&rest[n + 1..]).map_or(0, |(p, _)| p),
            _ => 0,
        };
        return Some((minor, patch));
    }
    None
}

/// NUM_OPCODES of PUC Lua 5.`minor`.
pub fn puc_opcodes(minor: u32) -> Option<usize> {
    Some(match minor {
        1 => 38,
        2 => 40,
        3 => 47,
        4 => 83,
        5 => 85,
        _ => return None,
    })
}

/// Functions smaller than this are not taken for an interpreter loop (luaV_execute of
/// 5.1 at -Os is ~4 KB; a dispatch table of 38 distinct cases needs more than 1 KB).
const MIN_EXECUTE: u64 = 1024;

/// Where PUC Lua 5.`minor`'s `luaV_execute` lies (SVMA range) in a stripped ELF file:
/// the one function holding every target of a dispatch table of NUM_OPCODES (or one
/// fewer: OP_EXTRAARG's empty case may merge with `default`) entries, ≥ 90 % of them
/// distinct. The table is a compiled `switch` (rel32 offsets from a base that a
/// rip-relative `lea` of the function loads, or absolute addresses) or 5.4's computed
/// goto `disptab` (absolute addresses, relocated at load). `Err` says why none, or which
/// several, were found.
pub fn puc_execute(data: &[u8], binary: &Binary, minor: u32) -> Result<(u64, u64), String> {
    let n = puc_opcodes(minor).ok_or_else(|| format!("no opcode count known for Lua 5.{minor}"))?;
    let file = parse_x86_64(data)?;
    let mut functions: Vec<(u64, u64)> = Vec::new();
    for_each_fde(binary, |fde, _, _| {
        functions.push((fde.initial_address(), fde.initial_address() + fde.len()));
    });
    functions.sort_unstable();
    let fdes: Vec<(u64, u64)> = functions
        .iter()
        .copied()
        .filter(|f| f.1 - f.0 >= MIN_EXECUTE)
        .collect();
    if fdes.is_empty() {
        return Err("no function of the file has unwind info".into());
    }
    let fde_of = |a: u64| -> Option<usize> {
        let i = fdes.partition_point(|f| f.0 <= a).checked_sub(1)?;
        (a < fdes[i].1).then_some(i)
    };
    let tables = Tables::read(&file, data);
    let mut hits: Vec<usize> = Vec::new();
    let mut judge = |targets: &[u64]| {
        let Some(f) = targets.first().and_then(|&t| fde_of(t)) else {
            return;
        };
        let mut distinct = targets.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if (targets.len() == n || targets.len() + 1 == n)
            && distinct.len() * 10 >= targets.len() * 9
            && !hits.contains(&f)
        {
            hits.push(f);
        }
    };
    // Absolute tables: runs of 8-byte slots that all point into one function.
    for (addr, bytes) in &tables.data {
        let slot = |i: usize| -> u64 {
            let a = addr + 8 * i as u64;
            tables.relocated.get(&a).copied().unwrap_or_else(|| {
                u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            })
        };
        let slots = bytes.len() / 8;
        let mut i = 0;
        while i < slots {
            let Some(f) = fde_of(slot(i)) else {
                i += 1;
                continue;
            };
            let start = i;
            while i < slots && fde_of(slot(i)) == Some(f) {
                i += 1;
            }
            if i - start + 1 >= n {
                judge(&(start..i).map(slot).collect::<Vec<_>>());
            }
        }
    }
    // rel32 tables: the base a rip-relative lea loads, entries relative to it.
    for &(start, end) in &fdes {
        let Some(code) = tables.code(start, end) else {
            continue;
        };
        for at in 0..code.len().saturating_sub(7) {
            let insn = &code[at..at + 7];
            if insn[0] & 0xfb != 0x48 || insn[1] != 0x8d || insn[2] & 0xc7 != 0x05 {
                continue;
            }
            let disp = i32::from_le_bytes(insn[3..7].try_into().expect("4 bytes"));
            let base = (start + at as u64 + 7).wrapping_add_signed(i64::from(disp));
            let Some(entries) = tables.rodata_at(base, 4 * (n + 1)) else {
                continue;
            };
            let targets: Vec<u64> = entries
                .chunks_exact(4)
                .map(|e| {
                    base.wrapping_add_signed(i64::from(i32::from_le_bytes(e.try_into().unwrap())))
                })
                .take_while(|&t| t >= start && t < end)
                .collect();
            if targets.len() + 1 >= n && targets.len() <= n {
                judge(&targets);
            }
        }
    }
    if hits.len() > 1 {
        // A host with a switch of its own of the same size (redis): the interpreter loop
        // is the one the exported API reaches (lua_call → luaD_call → luaV_execute).
        let reached = reached_from_api(&file, &tables, &functions);
        hits.retain(|&f| reached.contains(&fdes[f].0));
    }
    match hits.as_slice() {
        [f] => Ok(fdes[*f]),
        [] => Err(format!(
            "no function holds a dispatch table of {n} opcodes (built with -fno-jump-tables?)"
        )),
        several => Err(format!(
            "{} functions hold a dispatch table of {n} opcodes ({}) and the exported Lua API \
             reaches neither alone",
            several.len(),
            several
                .iter()
                .map(|&f| format!("{:#x}", fdes[f].0))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Entry points of the Lua API that run Lua code in a new luaV_execute frame.
const API_CALLS: &[&str] = &["lua_call", "lua_callk", "lua_pcall", "lua_pcallk"];
/// Steps from an API function to luaV_execute: lua_pcallk → luaD_pcall → (f_call, by
/// pointer) → luaD_callnoyield → ccall → luaV_execute is five.
const API_DEPTH: usize = 5;

/// The start addresses of the functions (`functions`: every FDE's range) the exported Lua
/// API reaches in a few steps of direct calls, jumps (tail calls) and function addresses
/// taken (luaD_pcall's callback).
fn reached_from_api(
    file: &object::read::elf::ElfFile64<'_, LittleEndian>,
    tables: &Tables<'_>,
    functions: &[(u64, u64)],
) -> Vec<u64> {
    use object::ObjectSymbol;
    let starts: HashMap<u64, u64> = functions.iter().copied().collect();
    let mut frontier: Vec<(u64, u64)> = file
        .dynamic_symbols()
        .chain(file.symbols())
        .filter(|s| s.is_definition() && s.size() > 0)
        .filter(|s| s.name().is_ok_and(|n| API_CALLS.contains(&n)))
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    let mut seen: Vec<u64> = frontier.iter().map(|f| f.0).collect();
    let mut reached = Vec::new();
    for _ in 0..API_DEPTH {
        let mut next = Vec::new();
        for &(start, end) in &frontier {
            let Some(code) = tables.code(start, end) else {
                continue;
            };
            for target in code_references(code, start) {
                if seen.contains(&target) {
                    continue;
                }
                // A function start: an FDE begins there.
                if let Some(&end) = starts.get(&target) {
                    seen.push(target);
                    reached.push(target);
                    next.push((target, end));
                }
            }
        }
        frontier = next;
    }
    reached
}

/// Targets of rel32 calls and jumps and of rip-relative `lea`s in `code` (at SVMA
/// `start`), read at every byte offset: wrong decodings give targets that the caller
/// discards unless a function starts there.
fn code_references(code: &[u8], start: u64) -> impl Iterator<Item = u64> + '_ {
    (0..code.len()).filter_map(move |at| {
        let rel = |from: usize, len: usize| -> Option<u64> {
            let d = i32::from_le_bytes(code.get(from..from + 4)?.try_into().ok()?);
            Some((start + (at + len) as u64).wrapping_add_signed(i64::from(d)))
        };
        match code[at] {
            0xe8 | 0xe9 => rel(at + 1, 5),
            0x48 | 0x4c if code.get(at + 1) == Some(&0x8d) && code.get(at + 2)? & 0xc7 == 0x05 => {
                rel(at + 3, 7)
            }
            _ => None,
        }
    })
}

/// The bytes a dispatch table search reads: code, read-only data and relocated data.
struct Tables<'a> {
    /// Executable sections: (SVMA, bytes).
    code: Vec<(u64, &'a [u8])>,
    /// Allocated, non-executable sections that may hold a table: (SVMA, bytes).
    data: Vec<(u64, &'a [u8])>,
    /// R_X86_64_RELATIVE addends by SVMA (lld leaves the slot itself 0).
    relocated: HashMap<u64, u64>,
}

impl<'a> Tables<'a> {
    fn read(file: &object::read::elf::ElfFile64<'a, LittleEndian>, data: &'a [u8]) -> Tables<'a> {
        let mut t = Tables {
            code: Vec::new(),
            data: Vec::new(),
            relocated: HashMap::new(),
        };
        let endian = LittleEndian;
        for s in file.sections() {
            let SectionFlags::Elf { sh_flags } = s.flags() else {
                continue;
            };
            let name = s.name().unwrap_or("");
            let Ok(bytes) = s.data() else { continue };
            if sh_flags & u64::from(elf::SHF_ALLOC) == 0 || bytes.is_empty() {
                continue;
            }
            if sh_flags & u64::from(elf::SHF_EXECINSTR) != 0 {
                t.code.push((s.address(), bytes));
            } else if !name.starts_with(".got")
                && !name.starts_with(".eh_frame")
                && !name.starts_with(".rela")
                && !name.starts_with(".dyn")
                && !name.starts_with(".gnu")
            {
                t.data.push((s.address(), bytes));
            }
        }
        let Ok(headers) = file.elf_header().section_headers(endian, data) else {
            return t;
        };
        for h in headers {
            if h.sh_type(endian) != elf::SHT_RELA {
                continue;
            }
            let Ok(Some((relas, _))) = h.rela(endian, data) else {
                continue;
            };
            for r in relas {
                if r.r_type(endian, false) == elf::R_X86_64_RELATIVE {
                    t.relocated
                        .insert(r.r_offset(endian), r.r_addend(endian) as u64);
                }
            }
        }
        t
    }

    /// The code of [start, end), if one executable section holds it.
    fn code(&self, start: u64, end: u64) -> Option<&'a [u8]> {
        self.code.iter().find_map(|&(a, b)| {
            (start >= a && end <= a + b.len() as u64)
                .then(|| &b[(start - a) as usize..(end - a) as usize])
        })
    }

    /// `len` bytes of non-executable data at `addr` (fewer at the end of a section).
    fn rodata_at(&self, addr: u64, len: usize) -> Option<&'a [u8]> {
        self.data.iter().find_map(|&(a, b)| {
            (addr >= a && addr < a + b.len() as u64).then(|| {
                let from = (addr - a) as usize;
                &b[from..(from + len).min(b.len())]
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_a_lua_release_from_lua_ident() {
        let v54 =
            b"..\0$LuaVersion: Lua 5.4.6  Copyright (C) 1994-2023 Lua.org, PUC-Rio $$LuaAuthors";
        assert_eq!(lua_release(v54), Some((4, 6)));
        let v51 = b"$Lua: Lua 5.1.5 Copyright (C) 1994-2012 Lua.org, PUC-Rio $\n";
        assert_eq!(lua_release(v51), Some((1, 5)));
        assert_eq!(lua_release(b"no Lua here"), None);
    }
    use crate::elf::{binary_record, function_symbol, unwind_record, DebugInfo};

    use crate::lua::system_files::{debug_file, read, LIB};

    #[test]
    fn finds_luajit_by_its_vm_unwind_entry_and_nothing_else() {
        if let Some(data) = read(&format!("{LIB}/libluajit-5.1.so.2")) {
            let vm = luajit_vm(&unwind_record("libluajit", &data)).expect("LuaJIT's VM");
            assert!((10_000..40_000).contains(&(vm.end - vm.start)), "{vm:?}");
            assert_eq!(vm.cframe_size, 80);
            // The full record (what lanalyze and the embedder hold) gives the same.
            let full = binary_record("libluajit", &data, DebugInfo::None);
            assert_eq!(luajit_vm(&full), Some(vm));
        }
        // Shapes that a size-and-CFA test took for LuaJIT (ARCHITECTURE, LUA-INTERNALS).
        for path in [
            "libgnutls.so.30",
            "libc.so.6",
            "liblua5.4.so.0",
            "libstdc++.so.6",
        ] {
            if let Some(data) = read(&format!("{LIB}/{path}")) {
                assert_eq!(luajit_vm(&unwind_record(path, &data)), None, "{path}");
            }
        }
    }

    #[test]
    fn finds_luav_execute_by_its_dispatch_table_as_the_debug_symbols_say() {
        for (path, minor) in [
            ("liblua5.1.so.0", 1),
            ("liblua5.2.so.0", 2),
            ("liblua5.3.so.0", 3),
            ("liblua5.4.so.0", 4),
        ] {
            let Some(data) = read(&format!("{LIB}/{path}")) else {
                continue;
            };
            assert_eq!(lua_release(&data).map(|r| r.0), Some(minor), "{path}");
            // lrec searches only the read-only data: lua_ident is there.
            let in_ranges = string_ranges(&data)
                .iter()
                .find_map(|&(o, n)| lua_release(&data[o as usize..(o + n) as usize]));
            assert_eq!(in_ranges, lua_release(&data), "{path}");
            let found = puc_execute(&data, &unwind_record(path, &data), minor)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            // Debian's -dbg packages name it (none exists for 5.2).
            if let Some(debug) = debug_file(&data) {
                assert_eq!(
                    function_symbol(&debug, "luaV_execute"),
                    Some(found),
                    "{path}"
                );
            }
        }
        // A library without Lua has no release, and no release's table.
        if let Some(data) = read(&format!("{LIB}/libc.so.6")) {
            assert_eq!(lua_release(&data), None);
            assert!(puc_execute(&data, &unwind_record("libc", &data), 4).is_err());
        }
    }

    #[test]
    fn tells_luav_execute_from_a_hosts_own_switch_of_the_same_size() {
        // redis-server links Lua 5.1 in and has a 38-case switch of its own: the one the
        // exported lua_call reaches is the interpreter.
        let Some(data) = read("/usr/bin/redis-check-rdb") else {
            return;
        };
        let binary = unwind_record("redis", &data);
        let (start, end) = puc_execute(&data, &binary, 1).expect("luaV_execute");
        let (call, _) = function_symbol(&data, "lua_call").expect("lua_call is exported");
        let file = parse_x86_64(&data).unwrap();
        let tables = Tables::read(&file, &data);
        let mut functions = Vec::new();
        for_each_fde(&binary, |fde, _, _| {
            functions.push((fde.initial_address(), fde.initial_address() + fde.len()))
        });
        assert!(reached_from_api(&file, &tables, &functions).contains(&start));
        assert!(start != call && end - start > MIN_EXECUTE);
    }
}

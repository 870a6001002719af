//! The machine code of an ELF file, addressed as it is linked (SVMA): its executable
//! segments, its functions' ranges (from `.eh_frame`, which every function of a C build
//! has, stripped or not) and its function symbols. What the layout learners read.

use std::collections::HashMap;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Object, ObjectSymbol, SymbolKind};

use super::{parse_x86_64, unwind_record};

/// An ELF file's code.
pub struct Code<'a> {
    data: &'a [u8],
    /// Executable PT_LOAD segments: (vaddr, file size, file offset).
    segments: Vec<(u64, u64, u64)>,
    /// Every PT_LOAD segment (read-only data too): (vaddr, file size, file offset).
    loaded: Vec<(u64, u64, u64)>,
    /// Function ranges [start, end) from `.eh_frame`, by start.
    functions: Vec<(u64, u64)>,
    /// Function symbols of `.symtab` and `.dynsym`: name → (start, end).
    symbols: HashMap<String, (u64, u64)>,
}

impl<'a> Code<'a> {
    pub fn new(data: &'a [u8]) -> Result<Code<'a>, String> {
        let file = parse_x86_64(data)?;
        let endian = file.endian();
        let headers = file
            .elf_header()
            .program_headers(endian, data)
            .map_err(|e| format!("bad program headers: {e}"))?;
        let loaded: Vec<(u64, u64, u64)> = headers
            .iter()
            .filter(|p| p.p_type(endian) == elf::PT_LOAD)
            .map(|p| (p.p_vaddr(endian), p.p_filesz(endian), p.p_offset(endian)))
            .collect();
        let segments = headers
            .iter()
            .filter(|p| p.p_type(endian) == elf::PT_LOAD && p.p_flags(endian) & elf::PF_X != 0)
            .map(|p| (p.p_vaddr(endian), p.p_filesz(endian), p.p_offset(endian)))
            .collect();
        let mut symbols = HashMap::new();
        for s in file.symbols().chain(file.dynamic_symbols()) {
            if s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 0 {
                if let Ok(name) = s.name() {
                    symbols
                        .entry(name.to_string())
                        .or_insert((s.address(), s.address() + s.size()));
                }
            }
        }
        let unwind = unwind_record("", data);
        let mut functions = Vec::new();
        super::for_each_fde(&unwind, |fde, _, _| {
            functions.push((fde.initial_address(), fde.initial_address() + fde.len()));
        });
        functions.sort_unstable();
        Ok(Code {
            data,
            segments,
            loaded,
            functions,
            symbols,
        })
    }

    /// The bytes of [start, end), when they lie in one executable segment.
    pub fn bytes(&self, start: u64, end: u64) -> Option<&'a [u8]> {
        let (vaddr, _, offset) = self
            .segments
            .iter()
            .copied()
            .find(|&(v, s, _)| start >= v && end <= v + s && start <= end)?;
        let from = (start - vaddr + offset) as usize;
        self.data.get(from..from + (end - start) as usize)
    }

    /// `n` bytes at `addr` of any loaded segment (tables of read-only data).
    pub fn data(&self, addr: u64, n: u64) -> Option<&'a [u8]> {
        let (vaddr, _, offset) = self
            .loaded
            .iter()
            .copied()
            .find(|&(v, s, _)| addr >= v && addr + n <= v + s)?;
        let from = (addr - vaddr + offset) as usize;
        self.data.get(from..from + n as usize)
    }

    /// Whether `addr` lies in an executable segment.
    pub fn is_code(&self, addr: u64) -> bool {
        self.segments
            .iter()
            .any(|&(v, s, _)| addr >= v && addr < v + s)
    }

    /// The function (its `.eh_frame` range, else its symbol's) that begins at `addr`.
    pub fn function_at(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|&(s, _)| s < addr);
        match self.functions.get(i) {
            Some(&(s, e)) if s == addr => Some((s, e)),
            _ => self.symbols.values().copied().find(|&(s, _)| s == addr),
        }
    }

    /// Every function's range [start, end) from `.eh_frame`, by start.
    pub fn functions(&self) -> &[(u64, u64)] {
        &self.functions
    }

    /// The function holding `addr`.
    pub fn function_holding(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|&(s, _)| s <= addr);
        let &(s, e) = self.functions.get(i.checked_sub(1)?)?;
        (addr < e).then_some((s, e))
    }

    /// The function symbol `name` (a C API function exported in `.dynsym`, or any in
    /// `.symtab`).
    pub fn symbol(&self, name: &str) -> Option<(u64, u64)> {
        self.symbols.get(name).copied()
    }
}

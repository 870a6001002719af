//! Functions of an ELF file by name or address: where `lrec --latency` attaches uprobes.

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Object, ObjectSymbol, SymbolKind};

use super::{for_each_fde, parse_x86_64};
use lrec_format::Binary;

/// Every function symbol `name` in an ELF file's `.symtab` and `.dynsym`, local ones
/// included, as (SVMA, size), one per address, in address order (static functions of
/// several source files can share a name).
pub fn function_symbols(data: &[u8], name: &str) -> Result<Vec<(u64, u64)>, String> {
    let file = parse_x86_64(data)?;
    let mut found: Vec<(u64, u64)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.name() == Ok(name))
        .map(|s| (s.address(), s.size()))
        .collect();
    found.sort_unstable();
    found.dedup_by_key(|s| s.0);
    Ok(found)
}

/// The file offset of the code at SVMA `addr`: in an executable segment (what uprobes
/// take).
pub fn code_file_offset(data: &[u8], addr: u64) -> Result<u64, String> {
    let file = parse_x86_64(data)?;
    let endian = file.endian();
    let headers = file
        .elf_header()
        .program_headers(endian, data)
        .map_err(|e| format!("bad program headers: {e}"))?;
    headers
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD && p.p_flags(endian) & elf::PF_X != 0)
        .find(|p| {
            let (vaddr, filesz) = (p.p_vaddr(endian), p.p_filesz(endian));
            addr >= vaddr && addr < vaddr + filesz
        })
        .map(|p| addr - p.p_vaddr(endian) + p.p_offset(endian))
        .ok_or_else(|| format!("{addr:#x} is not in an executable segment"))
}

/// Whether a function begins at SVMA `addr`, as far as the binary's `.eh_frame` and
/// symbols tell (`None`: it has neither).
pub fn starts_function(binary: &Binary, data: &[u8], addr: u64) -> Option<bool> {
    let (mut known, mut starts) = (false, false);
    for_each_fde(binary, |fde, _, _| {
        known = true;
        starts |= fde.initial_address() == addr;
    });
    if let Ok(file) = parse_x86_64(data) {
        for s in file.symbols().chain(file.dynamic_symbols()) {
            if s.kind() == SymbolKind::Text && s.is_definition() {
                known = true;
                starts |= s.address() == addr;
            }
        }
    }
    known.then_some(starts)
}

//! ELF symbol tables (.symtab/.dynsym) parsed from embedded section bytes, and demangling.

use std::ops::Range;

const ELF64_SYM_LEN: usize = 24;
const STT_NOTYPE: u8 = 0;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const SHN_UNDEF: u16 = 0;
/// Looking further back than this for an enclosing symbol is not worth it.
const MAX_BACKWARD_SCAN: usize = 32;

/// A sized function symbol, at stated addresses (SVMA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub start: u64,
    pub size: u64,
    /// Raw (mangled) name.
    pub name: String,
}

/// Function symbols of one binary, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct SymbolTable {
    symbols: Vec<Symbol>,
}

/// Parses an `Elf64_Sym` array. Keeps STT_FUNC/STT_GNU_IFUNC with a size, and sized
/// STT_NOTYPE symbols inside `text` (hand-written assembly often lacks a type). A function
/// without a size (assembly such as glibc's `__restore_rt`) names only its first byte.
/// Malformed entries are skipped; returns the symbols and how many entries were malformed.
pub fn parse_elf64_symbols(
    symtab: &[u8],
    strtab: &[u8],
    text: Option<Range<u64>>,
) -> (Vec<Symbol>, u64) {
    let mut out = Vec::new();
    let mut malformed = 0;
    for entry in symtab.chunks_exact(ELF64_SYM_LEN) {
        let name_off = u32::from_le_bytes(entry[0..4].try_into().unwrap()) as usize;
        let info = entry[4];
        let shndx = u16::from_le_bytes(entry[6..8].try_into().unwrap());
        let value = u64::from_le_bytes(entry[8..16].try_into().unwrap());
        let kind = info & 0xf;
        let size = match u64::from_le_bytes(entry[16..24].try_into().unwrap()) {
            0 if kind == STT_FUNC => 1,
            size => size,
        };
        let keep = match kind {
            STT_FUNC | STT_GNU_IFUNC => true,
            STT_NOTYPE => text.as_ref().is_some_and(|t| t.contains(&value)),
            _ => false,
        };
        if !keep || size == 0 || shndx == SHN_UNDEF || value == 0 {
            continue;
        }
        let Some(name) = c_string_at(strtab, name_off) else {
            malformed += 1;
            continue;
        };
        if name.is_empty() || value.checked_add(size).is_none() {
            malformed += 1;
            continue;
        }
        out.push(Symbol {
            start: value,
            size,
            name: name.to_owned(),
        });
    }
    (out, malformed)
}

fn c_string_at(strtab: &[u8], offset: usize) -> Option<&str> {
    let rest = strtab.get(offset..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

impl SymbolTable {
    /// Builds a table from symbol lists in order of preference (e.g. .symtab before .dynsym):
    /// of symbols at the same address, the first listed wins.
    pub fn new(lists: Vec<Vec<Symbol>>) -> SymbolTable {
        let mut symbols: Vec<(usize, Symbol)> = lists
            .into_iter()
            .enumerate()
            .flat_map(|(rank, list)| list.into_iter().map(move |s| (rank, s)))
            .collect();
        // Same start: preferred list first, then the larger symbol, then by name.
        symbols.sort_by(|(ra, a), (rb, b)| {
            (a.start, *ra, std::cmp::Reverse(a.size), &a.name).cmp(&(
                b.start,
                *rb,
                std::cmp::Reverse(b.size),
                &b.name,
            ))
        });
        symbols.dedup_by(|(_, later), (_, first)| later.start == first.start);
        SymbolTable {
            symbols: symbols.into_iter().map(|(_, s)| s).collect(),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// The symbol whose `[start, start+size)` contains `svma`.
    pub fn lookup(&self, svma: u64) -> Option<&Symbol> {
        let after = self.symbols.partition_point(|s| s.start <= svma);
        self.symbols[..after]
            .iter()
            .rev()
            .take(MAX_BACKWARD_SCAN)
            .find(|s| svma - s.start < s.size)
    }
}

/// Demangles Rust (legacy and v0) and Itanium C++ names; other names are returned as is.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            if let Ok(d) = sym.demangle() {
                return d;
            }
        }
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a .symtab/.strtab pair from `(name, info, shndx, value, size)`.
    pub(crate) fn build(entries: &[(&str, u8, u16, u64, u64)]) -> (Vec<u8>, Vec<u8>) {
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; ELF64_SYM_LEN]; // the null symbol
        for &(name, info, shndx, value, size) in entries {
            let off = strtab.len() as u32;
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
            symtab.extend_from_slice(&off.to_le_bytes());
            symtab.push(info);
            symtab.push(0);
            symtab.extend_from_slice(&shndx.to_le_bytes());
            symtab.extend_from_slice(&value.to_le_bytes());
            symtab.extend_from_slice(&size.to_le_bytes());
        }
        (symtab, strtab)
    }

    const GLOBAL_FUNC: u8 = 0x12;
    const LOCAL_FUNC: u8 = 0x02;
    const GLOBAL_OBJECT: u8 = 0x11;
    const GLOBAL_NOTYPE: u8 = 0x10;

    #[test]
    fn keeps_sized_functions_only() {
        let (symtab, strtab) = build(&[
            ("main", GLOBAL_FUNC, 14, 0x1130, 0x20),
            ("static_helper", LOCAL_FUNC, 14, 0x1100, 0x30),
            ("a_variable", GLOBAL_OBJECT, 24, 0x4010, 8),
            ("undefined_import", GLOBAL_FUNC, SHN_UNDEF, 0, 0),
            ("zero_sized", GLOBAL_FUNC, 14, 0x1200, 0),
            ("zero_sized_notype", GLOBAL_NOTYPE, 14, 0x1210, 0),
            ("asm_in_text", GLOBAL_NOTYPE, 14, 0x1180, 0x10),
            ("notype_outside_text", GLOBAL_NOTYPE, 14, 0x9000, 0x10),
            ("ifunc", 0x1a, 14, 0x11a0, 0x8),
        ]);
        let (syms, malformed) = parse_elf64_symbols(&symtab, &strtab, Some(0x1000..0x2000));
        let names: Vec<&str> = syms.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "main",
                "static_helper",
                "zero_sized",
                "asm_in_text",
                "ifunc"
            ]
        );
        assert_eq!(
            syms[2].size, 1,
            "a function without a size names its first byte"
        );
        assert_eq!(malformed, 0);
    }

    #[test]
    fn malformed_names_are_counted_not_fatal() {
        let (symtab, _) = build(&[("main", GLOBAL_FUNC, 14, 0x1130, 0x20)]);
        let (syms, malformed) = parse_elf64_symbols(&symtab, b"\0mai", None);
        assert!(syms.is_empty());
        assert_eq!(malformed, 1);
        // A truncated table: the partial entry is ignored.
        let (syms, _) = parse_elf64_symbols(&symtab[..symtab.len() - 3], b"", None);
        assert!(syms.is_empty());
    }

    #[test]
    fn lookup_respects_sizes_and_preference() {
        let table = SymbolTable::new(vec![
            vec![
                Symbol {
                    start: 0x1000,
                    size: 0x10,
                    name: "first".into(),
                },
                Symbol {
                    start: 0x1020,
                    size: 0x100,
                    name: "big".into(),
                },
                Symbol {
                    start: 0x1040,
                    size: 0x8,
                    name: "nested".into(),
                },
            ],
            vec![Symbol {
                start: 0x1000,
                size: 0x10,
                name: "dyn_alias".into(),
            }],
        ]);
        assert_eq!(table.len(), 3);
        assert_eq!(table.lookup(0x1000).unwrap().name, "first");
        assert_eq!(table.lookup(0x100f).unwrap().name, "first");
        assert!(table.lookup(0x1010).is_none(), "gap between symbols");
        assert_eq!(table.lookup(0x1044).unwrap().name, "nested");
        assert_eq!(table.lookup(0x1050).unwrap().name, "big");
        assert!(table.lookup(0xfff).is_none());
        assert!(table.lookup(0x1120).is_none());
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }
}

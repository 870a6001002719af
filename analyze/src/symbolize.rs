//! Names for code addresses: DWARF (with inlined frames) first, then ELF symbol tables;
//! kernel addresses from the capture's kallsyms excerpt.

use std::borrow::Cow;

use gimli::{EndianSlice, LittleEndian};

use crate::image::Image;
use crate::symbols::{demangle, parse_elf64_symbols, SymbolTable};

type Dwarf<'a> = addr2line::Context<EndianSlice<'a, LittleEndian>>;

/// One function at an address; an address inside inlined code has several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionAt {
    pub name: String,
    pub inlined: bool,
}

/// Names addresses of one image. Not `Sync` (addr2line parses lazily): build one per
/// thread, e.g. one per image in a parallel loop.
pub struct ImageSymbolizer<'a> {
    symbols: SymbolTable,
    dwarf: Option<Dwarf<'a>>,
    /// Problems met building the symbolizer.
    pub problems: Vec<String>,
}

impl<'a> ImageSymbolizer<'a> {
    pub fn new(image: &'a Image) -> ImageSymbolizer<'a> {
        let mut problems = Vec::new();
        let text = image
            .section(".text")
            .map(|s| s.addr..s.addr.saturating_add(s.size));
        let mut lists = Vec::new();
        for (tab, strs) in [(".symtab", ".strtab"), (".dynsym", ".dynstr")] {
            if let (Some(t), Some(s)) = (image.data(tab), image.data(strs)) {
                let (list, malformed) = parse_elf64_symbols(t, s, text.clone());
                if malformed > 0 {
                    problems.push(format!(
                        "{}: {malformed} malformed {tab} entries were skipped",
                        image.path
                    ));
                }
                lists.push(list);
            }
        }
        let dwarf = if image.has_dwarf() {
            let load = |id: gimli::SectionId| -> Result<_, gimli::Error> {
                Ok(EndianSlice::new(
                    image.data(id.name()).unwrap_or(&[]),
                    LittleEndian,
                ))
            };
            match gimli::Dwarf::load(load).and_then(addr2line::Context::from_dwarf) {
                Ok(ctx) => Some(ctx),
                Err(e) => {
                    problems.push(format!(
                        "{}: DWARF unusable ({e}); using symbol tables",
                        image.path
                    ));
                    None
                }
            }
        } else {
            None
        };
        ImageSymbolizer {
            symbols: SymbolTable::new(lists),
            dwarf,
            problems,
        }
    }

    /// Functions at `svma`, outermost first. Empty when nothing names the address.
    pub fn functions_at(&self, svma: u64) -> Vec<FunctionAt> {
        let symbol = self.symbols.lookup(svma).map(|s| demangle(&s.name));
        let mut from_dwarf = self.dwarf_functions(svma);
        match (from_dwarf.first_mut(), symbol) {
            // DWARF knows the inline chain but not the outer function's name.
            (Some(outer), Some(sym)) if outer.name.is_empty() => outer.name = sym,
            (None, Some(sym)) => from_dwarf.push(FunctionAt {
                name: sym,
                inlined: false,
            }),
            _ => {}
        }
        // A frame DWARF knows but cannot name stays, as [unknown]: dropping it would
        // shorten the chain without a sign.
        for f in &mut from_dwarf {
            if f.name.is_empty() {
                f.name = "[unknown]".into();
            }
        }
        from_dwarf
    }

    /// DWARF frames, outermost first; the outer one may have an empty name.
    fn dwarf_functions(&self, svma: u64) -> Vec<FunctionAt> {
        let Some(ctx) = &self.dwarf else {
            return Vec::new();
        };
        let Ok(mut frames) = ctx.find_frames(svma).skip_all_loads() else {
            return Vec::new();
        };
        let mut names = Vec::new();
        while let Ok(Some(frame)) = frames.next() {
            let name = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok())
                .map(|n: Cow<str>| demangle(&n))
                .unwrap_or_default();
            names.push(name);
        }
        // Only location info, no function: not a DWARF answer.
        if names.iter().all(|n| n.is_empty()) {
            return Vec::new();
        }
        let outer = names.len() - 1;
        names
            .into_iter()
            .enumerate()
            .rev()
            .map(|(i, name)| FunctionAt {
                name,
                inlined: i != outer,
            })
            .collect()
    }
}

/// Kernel symbols, sorted by start.
#[derive(Debug, Clone, Default)]
pub struct KernelSymbolizer {
    symbols: Vec<(u64, u64, String)>,
}

impl KernelSymbolizer {
    pub fn new(mut symbols: Vec<(u64, u64, String)>) -> KernelSymbolizer {
        symbols.sort();
        symbols.dedup_by(|b, a| a.0 == b.0);
        KernelSymbolizer { symbols }
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= addr);
        let (start, end, name) = self.symbols[..i].last()?;
        (addr >= *start && addr < *end).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_lookup() {
        let k = KernelSymbolizer::new(vec![
            (0x2000, 0x2100, "do_syscall_64".into()),
            (0x1000, 0x1800, "entry_SYSCALL_64".into()),
        ]);
        assert_eq!(k.name(0x1000), Some("entry_SYSCALL_64"));
        assert_eq!(k.name(0x17ff), Some("entry_SYSCALL_64"));
        assert_eq!(k.name(0x1800), None);
        assert_eq!(k.name(0x20ff), Some("do_syscall_64"));
        assert_eq!(k.name(0xfff), None);
    }
}

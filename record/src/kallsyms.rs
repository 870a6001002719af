//! The kernel's text symbols from /proc/kallsyms, reduced at the end of a recording to
//! the few that cover the kernel addresses seen in samples.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use lrec_format::KernelSymbols;

use crate::procfs::ProcError;

/// A text symbol of /proc/kallsyms; name and module are byte ranges of the table's names.
#[derive(Debug, Clone, Copy)]
struct KernelSymbol {
    start: u64,
    name: (u32, u32),
    module: Option<(u32, u32)>,
}

/// The kernel's text symbols, sorted by address. Only their names are kept (not the rest
/// of the file: addresses as text, data symbols), which halves what lrec holds.
#[derive(Debug)]
pub struct KallsymsTable {
    names: String,
    symbols: Vec<KernelSymbol>,
}

impl KallsymsTable {
    /// Reads /proc/kallsyms.
    pub fn load() -> Result<Self, ProcError> {
        let path = Path::new("/proc/kallsyms");
        let text = fs::read_to_string(path).map_err(|source| ProcError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, text)
    }

    /// Parses the text of a kallsyms file (`ADDR TYPE NAME[\t[MODULE]]` lines); `path` only
    /// names it in errors. Keeps text symbols (`t`, `T`, `w`, `W`).
    pub fn parse(path: &Path, text: String) -> Result<Self, ProcError> {
        let mut names = String::new();
        let mut range = |s: &str| {
            let at = names.len() as u32;
            names.push_str(s);
            (at, s.len() as u32)
        };
        let mut symbols = Vec::new();
        let mut any_text_symbol = false;
        for line in text.lines() {
            let mut parts = line.splitn(3, ' ');
            let (Some(addr), Some(kind), Some(rest)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            any_text_symbol = true;
            let Ok(start) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if start == 0 {
                continue;
            }
            let (name, module) = match rest.split_once('\t') {
                Some((name, module)) => {
                    let module = module.trim_start_matches('[').trim_end_matches(']');
                    (name, Some(range(module)))
                }
                None => (rest, None),
            };
            symbols.push(KernelSymbol {
                start,
                name: range(name),
                module,
            });
        }
        if symbols.is_empty() && any_text_symbol {
            return Err(ProcError::KernelSymbolsHidden {
                path: path.to_owned(),
            });
        }
        symbols.sort_by_key(|s| s.start);
        symbols.shrink_to_fit();
        names.shrink_to_fit();
        Ok(KallsymsTable { names, symbols })
    }

    fn str_at(&self, (at, len): (u32, u32)) -> &str {
        &self.names[at as usize..(at + len) as usize]
    }

    /// The index of the symbol containing `addr`: the last of those starting at the
    /// greatest address ≤ `addr`.
    fn index_of(&self, addr: u64) -> Option<usize> {
        self.symbols
            .partition_point(|s| s.start <= addr)
            .checked_sub(1)
    }

    /// The end of symbol `i`: the start of the next symbol at a higher address
    /// (`u64::MAX` for the last one).
    fn end_of(&self, i: usize) -> u64 {
        let start = self.symbols[i].start;
        let next = self.symbols[i..].partition_point(|s| s.start <= start);
        self.symbols.get(i + next).map_or(u64::MAX, |s| s.start)
    }

    /// The symbols containing `addrs`, as `(start, end, "name [module]")` sorted by start,
    /// each once.
    pub fn covering(&self, addrs: impl Iterator<Item = u64>) -> KernelSymbols {
        let mut seen = HashSet::new();
        let mut indices: Vec<usize> = addrs
            .filter_map(|a| self.index_of(a))
            .filter(|&i| seen.insert(i))
            .collect();
        indices.sort_unstable();
        let symbols = indices
            .into_iter()
            .map(|i| {
                let sym = &self.symbols[i];
                let mut name = self.str_at(sym.name).to_owned();
                if let Some(module) = sym.module {
                    name = format!("{name} [{}]", self.str_at(module));
                }
                (sym.start, self.end_of(i), name)
            })
            .collect();
        KernelSymbols { symbols }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81000100 t helper
ffffffff81000200 D some_data
ffffffff81000300 W weak_fn
ffffffff81000400 T _etext
ffffffffc0000000 t mod_fn\t[ext4]
ffffffffc0000080 t mod_fn2\t[ext4]
0000000000000000 A fixed_percpu_data
";

    #[test]
    fn kallsyms_covering() {
        let table = KallsymsTable::parse(Path::new("k"), KALLSYMS.to_owned()).unwrap();
        assert_eq!(table.symbols.len(), 7);
        let got = table.covering(
            [
                0xffffffffc0000010,
                0xffffffff81000150,
                0xffffffff81000250,
                0xffffffff81000001,
                5,
            ]
            .into_iter()
            .chain([0xffffffff81000101, 0xffffffffc00000ff]),
        );
        let want: Vec<(u64, u64, String)> = vec![
            (0xffffffff81000000, 0xffffffff81000100, "startup_64".into()),
            (0xffffffff81000100, 0xffffffff81000300, "helper".into()),
            (
                0xffffffffc0000000,
                0xffffffffc0000080,
                "mod_fn [ext4]".into(),
            ),
            (0xffffffffc0000080, u64::MAX, "mod_fn2 [ext4]".into()),
        ];
        assert_eq!(got.symbols, want);
        assert!(table.covering(std::iter::empty()).symbols.is_empty());
    }

    #[test]
    fn kallsyms_hidden() {
        let hidden = KALLSYMS
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect::<String>();
        let err = KallsymsTable::parse(Path::new("/proc/kallsyms"), hidden).unwrap_err();
        assert!(matches!(err, ProcError::KernelSymbolsHidden { .. }));
        assert!(err.to_string().contains("kptr_restrict"));
    }

    #[test]
    fn kallsyms_live() {
        let t0 = std::time::Instant::now();
        let table = match KallsymsTable::load() {
            Ok(table) => table,
            Err(ProcError::KernelSymbolsHidden { .. }) if unsafe { libc::geteuid() } != 0 => return,
            Err(e) => panic!("{e}"),
        };
        let loaded = t0.elapsed();
        let first = table.symbols[0].start;
        let t1 = std::time::Instant::now();
        let got = table.covering((0..10_000u64).map(|i| first + i * 64));
        eprintln!(
            "kallsyms: {} text symbols, load {loaded:?}, covering 10k addrs {:?} -> {}",
            table.symbols.len(),
            t1.elapsed(),
            got.symbols.len()
        );
        assert!(!got.symbols.is_empty());
        assert!(got
            .symbols
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].0));
    }
}

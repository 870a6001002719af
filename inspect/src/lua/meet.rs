//! What lrec does when it meets a binary in a process, in one function ([`meet`]): is
//! there a Lua VM (LuaJIT's interpreter by its unwind entry, PUC Lua by its version string
//! and then its `luaV_execute`), what is its build's layout (learned from the binary and
//! its debug file), and where does it free its protos. lrec runs it on a thread of its own
//! for each new binary; `make bench`'s sweep runs it on every ELF file of the machine.
//!
//! The work is the binary's, so it is bounded by one [`Budget`] for the binary: what is not
//! done when the budget is spent is given up, and the result says so (each part an `Err`
//! that names what was not learned and why), never half a layout.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use lrec_format::{Binary, Segment};

use crate::budget::{self, Budget, Spent};
use crate::debug_files;
use crate::elf;
use crate::lua::detect::{self, LuaJitVm};
use crate::lua::frees::{self, ProtoFree};
use crate::lua::luajit::learn::Learned;
use crate::lua::puc::learn::Learned as PucLearned;

/// Strings that show Lua in a binary: PUC Lua's `lua_ident` (5.2 on, then 5.1) and the name
/// of a function only LuaJIT's API has.
const LUA_STRINGS: [&[u8]; 3] = [b"$LuaVersion: Lua 5.", b"$Lua: Lua 5.", b"luaJIT_setmode\0"];

/// What a binary holds of Lua, and what lrec learned of it.
#[derive(Debug)]
pub struct Met {
    /// The binary's loadable segments (to place what was found in each mapping).
    pub segments: Vec<Segment>,
    pub luajit: Option<LuaJitMet>,
    pub puc: Option<PucMet>,
    /// LuaJIT's API defined here without its VM's unwind entry: why its frames cannot be
    /// read.
    pub luajit_api: Option<String>,
    /// Why the work stopped before its end, if it did.
    pub stopped: Option<Spent>,
    /// The work done (budget units) and its time.
    pub units: u64,
    pub took: Duration,
}

/// A LuaJIT VM found in a binary.
#[derive(Debug)]
pub struct LuaJitMet {
    pub vm: LuaJitVm,
    pub learned: Result<Learned, String>,
    pub free: Result<ProtoFree, String>,
}

/// A PUC Lua VM found in a binary by its version string.
#[derive(Debug)]
pub struct PucMet {
    /// (minor, patch) of the version string.
    pub release: (u32, u32),
    /// Where its luaV_execute lies (SVMA start, end) and how it was found.
    pub execute: Result<(u64, u64, &'static str), String>,
    pub learned: Result<PucLearned, String>,
    pub free: Result<ProtoFree, String>,
}

impl Met {
    /// Whether the binary holds a Lua VM (one that can be read or not).
    pub fn has_lua(&self) -> bool {
        self.luajit.is_some() || self.puc.is_some() || self.luajit_api.is_some()
    }
}

/// Meets the binary at `path` (`file`, `data` its bytes, mapped), with its separate debug
/// files looked up under `debug_dir`, within `budget`.
pub fn meet(path: &str, file: &File, data: &[u8], debug_dir: &Path, budget: Budget) -> Met {
    let began = Instant::now();
    let (mut met, stopped) = budget::scope(budget, || {
        let mut met = look(path, file, data, debug_dir);
        met.units = budget::used();
        met
    });
    met.stopped = stopped;
    met.took = began.elapsed();
    met
}

/// `step`'s result, or, when the budget ran out during it, why it was not done.
fn bounded<T>(what: &str, step: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    if let Some(why) = budget::spent() {
        return Err(format!("{what}: not tried ({why})"));
    }
    let r = step();
    match budget::spent() {
        Some(why) => Err(format!("{what}: given up ({why})")),
        None => r,
    }
}

fn look(path: &str, file: &File, data: &[u8], debug_dir: &Path) -> Met {
    let binary = elf::unwind_record(path, data);
    let mut met = Met {
        segments: binary.segments.clone(),
        luajit: None,
        puc: None,
        luajit_api: None,
        stopped: None,
        units: 0,
        took: Duration::ZERO,
    };
    let debug = || {
        debug_files::find_debug_file(
            debug_dir,
            &binary.path,
            binary.build_id.as_deref(),
            debug_files::debuglink(&binary).as_ref(),
        )
    };
    if let Some(vm) = detect::luajit_vm(&binary) {
        let debug = debug();
        let debug = debug.as_ref().map(|d| &d.data[..]);
        let learned = bounded("its layout", || {
            crate::lua::luajit::learn::learn(data, &vm, debug)
        });
        let free = bounded("its proto free function", || {
            frees::luajit_proto_free(data, debug)
        });
        met.luajit = Some(LuaJitMet { vm, learned, free });
        return met;
    }
    // The strings that tell Lua is here, read in pieces rather than through the mapping:
    // a big library's pages are not all loaded into lrec.
    let ranges = detect::string_ranges(data);
    let [ident, ident51, api] = find_strings(file, &ranges, &LUA_STRINGS, 64)
        .try_into()
        .expect("one answer per string");
    let release = ident.or(ident51).and_then(|s| detect::lua_release(&s));
    if let Some((minor, patch)) = release {
        let debug = debug();
        let sup = debug.as_ref().and_then(debug_files::supplement);
        let files = debug.as_ref().map(|d| (&d.data[..], sup.as_deref()));
        let learned = bounded("its layout", || {
            crate::lua::puc::learn::learn(data, minor, patch, files)
        });
        let debug = files.map(|f| f.0);
        let free = bounded("its proto free function", || match &learned {
            Ok(l) => {
                let o = &l.layout.offsets;
                frees::puc_proto_free(data, debug, o.p_code, o.p_lineinfo)
            }
            Err(_) => frees::proto_free(data, debug, frees::Vm::Puc),
        });
        let execute = bounded("its interpreter loop (luaV_execute)", || {
            puc_execute(data, &binary, minor, debug)
        });
        met.puc = Some(PucMet {
            release: (minor, patch),
            execute,
            learned,
            free,
        });
        return met;
    }
    // LuaJIT's API defined here, without its VM's unwind entry: a LUAJIT_NO_UNWIND
    // build, whose frames lrec cannot read.
    if api.is_some() && elf::function_symbol(data, "luaJIT_setmode").is_some() {
        met.luajit_api = Some(format!(
            "found LuaJIT's API in {path}, but not its interpreter (built with \
             LUAJIT_NO_UNWIND?)"
        ));
    }
    met
}

/// Where a binary's `luaV_execute` lies (SVMA), and how it was found: its own symbols,
/// those of its separate debug file (Debian's `-dbg` packages, by build-id), or, in a
/// stripped binary, the dispatch table of its release's opcodes that only the interpreter
/// loop holds ([`detect::puc_execute`]). `Err` says why it was not found.
fn puc_execute(
    data: &[u8],
    binary: &Binary,
    minor: u32,
    debug: Option<&[u8]>,
) -> Result<(u64, u64, &'static str), String> {
    if let Some((s, e)) = elf::function_symbol(data, "luaV_execute") {
        return Ok((s, e, "its symbol"));
    }
    if let Some((s, e)) = debug.and_then(|d| elf::function_symbol(d, "luaV_execute")) {
        return Ok((s, e, "the debug file's symbol"));
    }
    detect::puc_execute(data, binary, minor).map(|(s, e)| (s, e, "its opcode dispatch table"))
}

/// For each of `needles`, the `len` bytes from its first occurrence in `file`'s byte
/// ranges `ranges` (offset, size), read in 1 MiB pieces: searching a big library costs
/// neither its size in memory nor a mapping.
pub fn find_strings(
    file: &File,
    ranges: &[(u64, u64)],
    needles: &[&[u8]],
    len: usize,
) -> Vec<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    const PIECE: usize = 1 << 20;
    let finders: Vec<memchr::memmem::Finder> =
        needles.iter().map(memchr::memmem::Finder::new).collect();
    let mut found: Vec<Option<Vec<u8>>> = vec![None; needles.len()];
    let mut buf = vec![0u8; PIECE + len];
    for &(start, size) in ranges {
        // Each piece repeats the last `len` bytes of the one before: a match across the
        // boundary is found whole.
        let (mut offset, mut kept) = (start, 0usize);
        let end_of_range = start.saturating_add(size);
        while offset < end_of_range {
            // ~0.5 ms a piece: work of the binary's budget.
            if !budget::charge(4096) {
                return found;
            }
            let want = ((end_of_range - offset) as usize).min(PIECE);
            let n = match file.read_at(&mut buf[kept..kept + want], offset) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let end = kept + n;
            for (f, slot) in finders.iter().zip(found.iter_mut()) {
                if slot.is_some() {
                    continue;
                }
                if let Some(at) = f.find(&buf[..end]) {
                    let mut v = buf[at..end.min(at + len)].to_vec();
                    if v.len() < len {
                        // The match ends the piece: the rest follows in the file.
                        let mut rest = vec![0u8; len - v.len()];
                        let got = file.read_at(&mut rest, offset + n as u64).unwrap_or(0);
                        v.extend_from_slice(&rest[..got]);
                    }
                    *slot = Some(v);
                }
            }
            if found.iter().all(Option::is_some) {
                return found;
            }
            offset += n as u64;
            kept = len.min(end);
            buf.copy_within(end - kept..end, 0);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget that runs out leaves each part it did not finish an `Err` that says so,
    /// never half a layout, and the meeting says why it stopped.
    #[test]
    fn a_budget_run_out_gives_up_and_says_so() {
        use crate::lua::system_files::LIB;
        let path = format!("{LIB}/liblua5.4.so.0");
        let Ok(file) = File::open(&path) else {
            eprintln!("{path} is missing (`make setup` installs it): not checked");
            return;
        };
        // SAFETY: a read-only mapping of a system library.
        let data = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let nowhere = Path::new("/nonexistent");
        let whole = meet(&path, &file, &data, nowhere, Budget::for_binary(None));
        let p = whole.puc.as_ref().expect("Lua 5.4 found");
        assert!(whole.stopped.is_none() && p.learned.is_ok() && p.execute.is_ok());
        // One unit short of what it took: the part that ran out is given up, not guessed,
        // and every part after it is not tried.
        let short = Budget {
            units: whole.units - 1,
            ..Budget::for_binary(None)
        };
        let cut = meet(&path, &file, &data, nowhere, short);
        assert!(
            matches!(cut.stopped, Some(Spent::Units(_))),
            "{:?}",
            cut.stopped
        );
        let p = cut.puc.as_ref().expect("the version string is read first");
        let parts = [
            p.learned.as_ref().err(),
            p.free.as_ref().err(),
            p.execute.as_ref().err(),
        ];
        let given_up = parts
            .iter()
            .flatten()
            .filter(|e| e.contains("given up"))
            .count();
        assert_eq!(given_up, 1, "{parts:?}");
        assert!(
            parts.iter().flatten().all(|e| e.contains("work budget")),
            "{parts:?}"
        );
        // With next to nothing, not even the strings are read: no VM, and why.
        let tiny = Budget {
            units: 1,
            ..Budget::for_binary(None)
        };
        let cut = meet(&path, &file, &data, nowhere, tiny);
        assert!(cut.stopped.is_some() && !cut.has_lua());
    }

    #[test]
    fn strings_are_found_across_pieces_and_at_the_end() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("lrec-find-{}", std::process::id()));
        let mut data = vec![b'x'; (1 << 20) + 100];
        // One needle across the first piece's end, one in the last bytes.
        let at = (1 << 20) - 5;
        data[at..at + 10].copy_from_slice(b"$Lua: 5.1!");
        let tail = data.len() - 6;
        data[tail..].copy_from_slice(b"END42!");
        File::create(&path).unwrap().write_all(&data).unwrap();
        let file = File::open(&path).unwrap();
        let all = [(0, data.len() as u64)];
        let found = find_strings(&file, &all, &[b"$Lua: ", b"END42", b"absent"], 8);
        // Only the ranges given are searched.
        let head = [(0, 1000)];
        assert_eq!(find_strings(&file, &head, &[b"END42"], 8), vec![None]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(found[0].as_deref(), Some(&b"$Lua: 5."[..]));
        assert_eq!(found[1].as_deref(), Some(&b"END42!"[..]));
        assert_eq!(found[2], None);
    }
}

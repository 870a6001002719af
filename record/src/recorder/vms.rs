//! Finding the Lua interpreters in the binaries a process maps, and telling the Lua
//! tracker where each one is mapped.

use lrec_format::Binary;
use lrec_inspect::elf;
use lrec_inspect::lua::frees;

use super::Recording;
use crate::lua::VmCode;
use crate::procfs::{self, MapsEntry};
use lrec_inspect::lua::luajit::learn::learn;

/// Strings that show Lua in a binary: PUC Lua's `lua_ident` (5.2 on, then 5.1) and the name
/// of a function only LuaJIT's API has.
const LUA_STRINGS: [&[u8]; 3] = [b"$LuaVersion: Lua 5.", b"$Lua: Lua 5.", b"luaJIT_setmode\0"];

/// What a binary's bytes say of Lua, besides its unwind info: its PUC release, and whether
/// it names LuaJIT's API.
pub(super) struct Evidence<'a> {
    data: &'a [u8],
    release: Option<(u32, u32)>,
    luajit_api: bool,
    /// The binary's path names, in lrec's mount namespace, the very file mapped: a uprobe
    /// attached there counts the process's calls (else another file of that name, in
    /// another namespace, would be probed).
    probe_path: bool,
}

/// The Lua interpreter of a binary, or why the one it holds could not be located, and the
/// binary's segments (to place it in each mapping).
pub(super) struct BinaryVm {
    vm: Result<VmCode, String>,
    segments: Vec<lrec_format::Segment>,
}

impl Recording {
    /// Looks for a Lua interpreter in a newly mapped binary at once, rather than when the
    /// embedder is done with it: samples taken until then get no Lua frames. The file is
    /// mapped, not read: only the pages the search touches are loaded.
    pub(super) fn find_vm(&mut self, pid: u32, entry: &MapsEntry, key: &[u8]) {
        if entry.file_path().is_none() || self.vm_checked.contains(key) {
            return;
        }
        let Ok(file) = procfs::open_mapped_file(pid, entry) else {
            return;
        };
        let Ok(data) = procfs::map_file(&file) else {
            return;
        };
        let binary = elf::unwind_record(&entry.path, &data);
        let luajit = lrec_inspect::lua::detect::luajit_vm(&binary).map(|vm| VmCode {
            start: vm.start,
            end: vm.end,
            cframe_size: vm.cframe_size,
            ..VmCode::default()
        });
        // The strings that tell Lua is here, read in pieces rather than through the
        // mapping: a big library's pages are not all loaded into lrec.
        let ranges = lrec_inspect::lua::detect::string_ranges(&data);
        let [ident, ident51, api] = procfs::find_strings(&file, &ranges, &LUA_STRINGS, 64)
            .try_into()
            .expect("one answer per string");
        let evidence = Evidence {
            data: &data,
            release: ident
                .or(ident51)
                .and_then(|s| lrec_inspect::lua::detect::lua_release(&s)),
            luajit_api: api.is_some(),
            probe_path: procfs::is_mapped_path(entry),
        };
        self.note_vm(
            key,
            &entry.path,
            &binary.segments,
            luajit,
            Some((&binary, evidence)),
        );
    }

    /// Notes the interpreter of a binary (`key`, mapped from `path`), once per binary:
    /// LuaJIT's (`luajit`, found by its VM's unwind entry), else PUC Lua's by its version
    /// string and then its luaV_execute (from the file, when at hand). A binary with a Lua
    /// VM that cannot be located is noted too, to say so.
    pub(super) fn note_vm(
        &mut self,
        key: &[u8],
        path: &str,
        segments: &[lrec_format::Segment],
        luajit: Option<VmCode>,
        file: Option<(&Binary, Evidence)>,
    ) {
        if !self.vm_checked.insert(key.to_vec()) {
            return;
        }
        if let (Some(vm), Some((binary, e))) = (&luajit, &file) {
            let debug = crate::embedder::separate_debug_file(&self.debug_dir, binary);
            let vm = lrec_inspect::lua::detect::LuaJitVm {
                start: vm.start,
                end: vm.end,
                cframe_size: vm.cframe_size,
            };
            let debug = debug.as_ref().map(|d| &d.data[..]);
            let learned = learn(e.data, &vm, debug);
            self.lua.learned(path, learned);
            let free = frees::luajit_proto_free(e.data, debug);
            self.proto_frees
                .found(path, frees::Vm::LuaJit, e.probe_path, free);
        }
        if let (None, Some((binary, e))) = (&luajit, &file) {
            if let Some((minor, patch)) = e.release {
                let debug = crate::embedder::separate_debug_file(&self.debug_dir, binary);
                let sup = debug
                    .as_ref()
                    .and_then(lrec_inspect::debug_files::supplement);
                let files = debug.as_ref().map(|d| (&d.data[..], sup.as_deref()));
                let learned = lrec_inspect::lua::puc::learn::learn(e.data, minor, patch, files);
                let debug = files.map(|f| f.0);
                let free = match &learned {
                    Ok(l) => {
                        let o = &l.layout.offsets;
                        frees::puc_proto_free(e.data, debug, o.p_code, o.p_lineinfo)
                    }
                    Err(_) => frees::proto_free(e.data, debug, frees::Vm::Puc),
                };
                self.proto_frees
                    .found(path, frees::Vm::Puc, e.probe_path, free);
                self.lua.learned_puc(path, learned);
            }
        }
        let luajit = luajit.map(Ok);
        let puc = || {
            let (binary, e) = file.as_ref()?;
            let (minor, patch) = e.release?;
            Some(
                crate::lua::puc::find_execute(e.data, binary, minor, &self.debug_dir)
                    .map(|(start, end, found_by)| VmCode {
                        start,
                        end,
                        cframe_size: 0,
                        release: Some((minor, patch)),
                        found_by,
                    })
                    .map_err(|e| {
                        format!(
                            "found Lua 5.{minor}.{patch} in {path}, but not its interpreter \
                             loop (luaV_execute): {e}; recording native stacks only"
                        )
                    }),
            )
        };
        // LuaJIT's API defined here, without its VM's unwind entry: a LUAJIT_NO_UNWIND
        // build, whose frames lrec cannot read.
        let luajit_api = || {
            let (_, e) = file.as_ref().filter(|(_, e)| e.luajit_api)?;
            elf::function_symbol(e.data, "luaJIT_setmode")?;
            Some(Err(format!(
                "found LuaJIT's API in {path}, but not its interpreter (built with \
                 LUAJIT_NO_UNWIND?); recording native stacks only"
            )))
        };
        if let Some(vm) = luajit.or_else(puc).or_else(luajit_api) {
            let segments = segments.to_vec();
            self.vms.insert(key.to_vec(), BinaryVm { vm, segments });
            self.place_vms();
        }
    }

    /// Tells the Lua tracker where each known interpreter is mapped.
    pub(super) fn place_vms(&mut self) {
        let entries = self
            .procs
            .iter()
            .flat_map(|(&pid, p)| p.exec_entries.iter().map(move |e| (pid, e)));
        for (pid, (entry, key)) in entries {
            let Some(BinaryVm { vm, segments }) = self.vms.get(key) else {
                continue;
            };
            let vm = match vm {
                Ok(vm) => vm,
                Err(why) => {
                    self.lua.add_unlocated(pid, &entry.path, why);
                    continue;
                }
            };
            let avma = |svma: u64| -> Option<u64> {
                let seg = segments
                    .iter()
                    .find(|s| svma >= s.vaddr && svma < s.vaddr + s.memsz.max(1))?;
                let file_off = svma - seg.vaddr + seg.offset;
                let len = entry.end - entry.start;
                (file_off >= entry.offset && file_off < entry.offset + len)
                    .then(|| entry.start + file_off - entry.offset)
            };
            if let (Some(start), Some(last)) = (avma(vm.start), avma(vm.end - 1)) {
                let code = VmCode {
                    start,
                    end: last + 1,
                    ..*vm
                };
                self.lua.add_vm(pid, &entry.path, code);
            }
        }
    }
}

//! The analysis pipeline: metadata pass, images, per-process maps, parallel unwinding,
//! per-image symbolization, and assembly of the [`Profile`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use lrec_format::{
    kind, kind_bit, lua_frame_kind, sample_flags, Capture, LuaStack, Mapping, Record, RecordRef,
    SampleRef,
};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::address_space::{build_process_maps, AddressSpace, ProcessMaps};
use crate::image::{basename, Image};
use crate::lua::{self, luajit, Merged};
use crate::metadata::{read_metadata, BinaryKey, Metadata};
use crate::profile::{
    BinaryInfo, Frame, FrameId, FrameKind, LuaVmInfo, Profile, ProfileSample, Stats, Thread,
    Warning,
};
use crate::symbolize::{FunctionAt, ImageSymbolizer, KernelSymbolizer};
use crate::unwind::{unwind_user, CodeAddress, StackEnd, UnwindCache, VmHint};
use crate::{AnalyzeError, BinaryLocator, Options, Wanted};

const DEFAULT_PAGE_SIZE: u64 = 4096;

/// A user frame located in the process's memory map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum UserFrame {
    /// In a mapped image: named by its symbols at `lookup_svma`.
    Image {
        image: usize,
        lookup_svma: u64,
        file_offset: u64,
    },
    /// In a mapping without a usable image (`[vdso]`, a file lrec could not read).
    Mapped { module: Arc<str>, file_offset: u64 },
    /// In no mapping, or in anonymous memory.
    Unmapped,
    /// A Lua function of process `pid` (a [`lrec_format::LuaProto`] id), at `line` when
    /// lines are asked for (else `u32::MAX`).
    /// `called_from` is the calling (proto, position), `(u32::MAX, 0)` when none.
    Lua {
        pid: u32,
        proto: u32,
        line: u32,
        called_from: (u32, u32),
        /// Running as JIT-compiled code (marked when asked).
        jit: bool,
    },
    /// A Lua VM's built-in function.
    LuaBuiltin { pid: u32, id: u8 },
    /// A Lua VM state that runs no Lua code (`[GC]`).
    LuaState(&'static str),
}

/// A region that unwinding had to cross without unwind info.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum WithoutUnwindInfo {
    Image(usize),
    Region(Arc<str>),
}

struct UnwoundSample {
    time_ns: u64,
    pid: u32,
    tid: u32,
    /// Leaf first, as indices into the chunk's [`ChunkFrames`].
    user: Vec<u32>,
    /// Innermost first, as recorded.
    kernel: Vec<u64>,
    end: StackEnd,
    kernel_mode: bool,
    no_mappings: bool,
    without_unwind_info: Vec<WithoutUnwindInfo>,
    /// The Lua VM's state (`G->vmstate`), when the sample ran in a Lua VM.
    vm_state: Option<i32>,
}

/// Gives each distinct value a dense 4-byte index, in first-seen order: samples hold
/// indices, so each frame is hashed once and stored once.
struct Interner<T> {
    ids: FxHashMap<T, u32>,
    list: Vec<T>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            ids: FxHashMap::default(),
            list: Vec::new(),
        }
    }
}

impl<T: Hash + Eq + Clone> Interner<T> {
    fn id(&mut self, value: T) -> u32 {
        if let Some(&id) = self.ids.get(&value) {
            return id;
        }
        let id = self.list.len() as u32;
        self.list.push(value.clone());
        self.ids.insert(value, id);
        id
    }
}

/// The distinct user frames of one chunk.
type ChunkFrames = Interner<UserFrame>;

/// The unwound samples of one chunk.
struct UnwoundChunk {
    frames: Vec<UserFrame>,
    samples: Vec<UnwoundSample>,
}

pub fn run(
    capture: &Capture,
    opts: &Options,
    locator: &dyn BinaryLocator,
) -> Result<Profile, AnalyzeError> {
    let mut meta = read_metadata(capture);
    let kernel = KernelSymbolizer::new(std::mem::take(&mut meta.kernel_symbols));
    let header = meta.header.clone().unwrap_or_default();
    if !header.arch.is_empty() && header.arch != "x86_64" {
        return Err(AnalyzeError::UnsupportedArch { arch: header.arch });
    }
    let mut warnings = WarningCounter::default();
    for w in &meta.read_warnings {
        warnings.add(w.to_string());
    }
    if meta.header.is_none() {
        warnings.add("the capture has no header record; recording details are unknown".into());
    }
    let page_size = match header.page_size {
        0 => DEFAULT_PAGE_SIZE,
        p => u64::from(p),
    };
    let images = build_images(&meta, locator);
    let image_of = meta.binary_index();
    let mut mappings_by_pid: BTreeMap<u32, Vec<&Mapping>> = BTreeMap::new();
    for m in &meta.mappings {
        mappings_by_pid.entry(m.pid).or_default().push(m);
    }
    let maps: HashMap<u32, ProcessMaps> = mappings_by_pid
        .into_par_iter()
        .map(|(pid, ms)| (pid, build_process_maps(ms, &images, &image_of, page_size)))
        .collect();

    let lua_ctx = LuaContext {
        meta: &meta,
        lines: opts.lines,
        mark_jit: opts.mark_jit,
    };
    let unwound: Vec<UnwoundChunk> = capture
        .chunks()
        .par_iter()
        .filter(|chunk| chunk.kinds & kind_bit(kind::SAMPLE) != 0)
        .map_init(UnwindCache::new, |cache, chunk| {
            let mut frames = ChunkFrames::default();
            let mut samples = Vec::new();
            // A sample's Lua stack comes just before it.
            let mut lua_stack: Option<LuaStack> = None;
            capture.visit_chunk(
                chunk,
                |k| k == kind::SAMPLE || k == kind::LUA_STACK,
                |r| match r {
                    RecordRef::Other(Record::LuaStack(l)) => lua_stack = Some(l),
                    RecordRef::Sample(s) => {
                        let lua = lua_stack
                            .take()
                            .filter(|l| l.tid == s.tid && l.time_ns == s.time_ns);
                        if opts.pid.is_none_or(|p| p == s.pid)
                            && opts.tid.is_none_or(|t| t == s.tid)
                        {
                            let maps = maps.get(&s.pid);
                            let lua = lua.as_ref().map(|l| (l, &lua_ctx));
                            samples.push(unwind_sample(s, maps, lua, cache, &mut frames));
                        }
                    }
                    RecordRef::Other(_) => {}
                },
            );
            UnwoundChunk {
                frames: frames.list,
                samples,
            }
        })
        .collect();

    // Symbolization and assembly work per distinct address, not per frame of each sample.
    let distinct = distinct_frames(&unwound);
    let names = symbolize_images(&images, &distinct.user, &mut warnings);
    Ok(assemble(
        &meta, header, &images, unwound, &distinct, &names, &kernel, warnings,
    ))
}

/// The distinct frames of all samples, sorted (so that frame ids do not depend on thread
/// scheduling), with each chunk's local frame indices mapped to indices into `user`.
/// Kernel addresses come with whether they are the leaf (looked up as is).
struct DistinctFrames {
    user: Vec<UserFrame>,
    /// Per chunk: local frame index → index into `user`.
    remap: Vec<Vec<u32>>,
    kernel: Vec<(u64, bool)>,
}

fn distinct_frames(unwound: &[UnwoundChunk]) -> DistinctFrames {
    let mut user: Vec<UserFrame> = unwound.iter().flat_map(|c| c.frames.clone()).collect();
    user.sort_unstable();
    user.dedup();
    let remap = unwound
        .par_iter()
        .map(|c| {
            let global = |f: &UserFrame| user.binary_search(f).expect("frame is in the set");
            c.frames.iter().map(|f| global(f) as u32).collect()
        })
        .collect();
    let mut kernel: Vec<(u64, bool)> = unwound
        .iter()
        .flat_map(|c| &c.samples)
        .flat_map(|s| s.kernel.iter().enumerate().map(|(i, &a)| (a, i == 0)))
        .collect();
    kernel.sort_unstable();
    kernel.dedup();
    DistinctFrames {
        user,
        remap,
        kernel,
    }
}

/// Images of the capture's binaries, completed from local files where the locator finds
/// them.
fn build_images(meta: &Metadata, locator: &dyn BinaryLocator) -> Vec<Image> {
    meta.binaries
        .par_iter()
        .map(|binary| {
            let mut image = Image::from_binary(binary);
            let wanted = Wanted {
                sections: binary.error.is_some() || !image.has_unwind_info(),
                debug_info: !image.has_dwarf(),
            };
            if wanted.sections || wanted.debug_info {
                let key = BinaryKey::of_binary(binary);
                let mut paths: Vec<&str> = meta
                    .mappings
                    .iter()
                    .filter(|m| BinaryKey::of(&m.build_id, &m.path) == key)
                    .map(|m| m.path.as_str())
                    .collect();
                paths.sort_unstable();
                paths.dedup();
                for file in locator.locate(binary, &paths, wanted) {
                    image.complete_from(file);
                }
            }
            image
        })
        .collect()
}

/// What merging Lua frames needs from the capture's metadata.
struct LuaContext<'a> {
    meta: &'a Metadata,
    /// Split Lua frames by current line.
    lines: bool,
    /// Mark frames running JIT-compiled code.
    mark_jit: bool,
}

impl LuaContext<'_> {
    /// Frame `i` of `stack`, located and with its current line when asked for.
    fn frame(&self, pid: u32, stack: &LuaStack, i: usize, space: &AddressSpace) -> UserFrame {
        let f = &stack.frames[i];
        match f.kind {
            lua_frame_kind::LUA => {
                let line = match self.lines {
                    true => self
                        .meta
                        .lua_protos
                        .get(&(pid, f.function))
                        .and_then(|p| p.lines.get(f.pos as usize).copied())
                        .unwrap_or(0),
                    false => u32::MAX,
                };
                // Called by a Lua function (or a metamethod it triggered): the calling
                // instruction names the callee.
                let caller = stack
                    .frames
                    .get(i + 1)
                    .filter(|c| c.kind == lua_frame_kind::LUA && luajit::called_by_lua(f.link));
                let called_from = caller.map_or((u32::MAX, 0), |c| (c.function, c.pos));
                // In a trace (vmstate ≥ 0) the innermost Lua frame runs compiled code.
                let jit = self.mark_jit && i == 0 && stack.vmstate >= 0;
                UserFrame::Lua {
                    pid,
                    proto: f.function,
                    line,
                    called_from,
                    jit,
                }
            }
            lua_frame_kind::BUILTIN => UserFrame::LuaBuiltin { pid, id: f.builtin },
            // A C function: named by its symbol, as a native frame would be.
            _ => locate(
                space,
                &CodeAddress {
                    avma: f.address,
                    is_return: false,
                    region: space
                        .region_index(f.address)
                        .filter(|&i| space.region_at(i).executable),
                    sp: 0,
                },
            ),
        }
    }
}

fn unwind_sample(
    s: SampleRef,
    maps: Option<&ProcessMaps>,
    lua: Option<(&LuaStack, &LuaContext)>,
    cache: &mut UnwindCache,
    frames: &mut ChunkFrames,
) -> UnwoundSample {
    let space = maps.and_then(|m| m.at(s.time_ns));
    let no_regs = s.flags & sample_flags::NO_USER_REGS != 0 || s.regs.ip == 0;
    let mut out = UnwoundSample {
        time_ns: s.time_ns,
        pid: s.pid,
        tid: s.tid,
        user: Vec::new(),
        kernel_mode: s.flags & sample_flags::KERNEL_MODE != 0 || !s.kernel_stack.is_empty(),
        kernel: s.kernel_stack,
        end: StackEnd::Complete,
        no_mappings: false,
        without_unwind_info: Vec::new(),
        vm_state: lua.map(|(l, _)| l.vmstate),
    };
    // The Lua VM the sample ran in, if its runtime is known.
    let lua = lua.and_then(|(l, ctx)| Some((l, ctx, ctx.meta.lua_runtimes.get(&s.pid)?)));
    match space {
        // A kernel thread has neither user registers nor mappings: nothing is missing.
        _ if no_regs => {
            if space.is_some_and(|sp| !sp.is_empty()) {
                out.end = StackEnd::Failed;
            }
        }
        None => {
            out.user.push(frames.id(UserFrame::Unmapped));
            out.end = StackEnd::Failed;
            out.no_mappings = true;
        }
        Some(space) => {
            let mut cframes = Vec::new();
            let code = lua.map(|(_, _, rt)| [(rt.vm_start, rt.vm_end)]);
            let hint = match (lua, &code) {
                (Some((l, _, _)), Some(code)) => {
                    lua::cframes(l, &mut cframes);
                    Some(VmHint {
                        code,
                        cframes: &cframes,
                        innermost: l.cframe,
                    })
                }
                _ => None,
            };
            let stack = unwind_user(space, &s.regs, s.user_stack, cache, hint);
            match (lua, hint) {
                (Some((l, ctx, _)), Some(hint)) => {
                    let jit = |a: &CodeAddress| {
                        a.region.is_none_or(|i| space.region_at(i).image.is_none())
                    };
                    let mut merged = Vec::new();
                    let state = luajit::state_frame(l.vmstate);
                    lua::merge(stack.frames, l, &hint, jit, state, &mut merged);
                    out.user = merged
                        .iter()
                        .map(|m| {
                            frames.id(match *m {
                                Merged::Native(i) => locate(space, &stack.frames[i]),
                                Merged::Lua(i) => ctx.frame(s.pid, l, i, space),
                                Merged::State(name) => UserFrame::LuaState(name),
                            })
                        })
                        .collect();
                }
                _ => {
                    out.user = stack
                        .frames
                        .iter()
                        .map(|a| frames.id(locate(space, a)))
                        .collect();
                }
            }
            out.end = stack.end;
            out.without_unwind_info = stack
                .without_unwind_info
                .iter()
                .filter_map(|&start| space.region(start))
                .map(|r| match r.image {
                    Some(i) => WithoutUnwindInfo::Image(i),
                    None => WithoutUnwindInfo::Region(r.name.clone()),
                })
                .collect();
        }
    }
    out
}

fn locate(space: &AddressSpace, address: &CodeAddress) -> UserFrame {
    let Some(r) = address.region.map(|i| space.region_at(i)) else {
        return UserFrame::Unmapped;
    };
    if r.name.is_empty() {
        return UserFrame::Unmapped;
    }
    let file_offset = r.file_offset(address.avma);
    match (r.image, r.bias) {
        (Some(image), Some(bias)) => UserFrame::Image {
            image,
            lookup_svma: address.lookup_avma().wrapping_sub(bias),
            file_offset,
        },
        _ => UserFrame::Mapped {
            module: r.name.clone(),
            file_offset,
        },
    }
}

/// Per image: the functions at each looked-up address.
type ImageNames = HashMap<u64, Vec<FunctionAt>>;
type Names = Vec<ImageNames>;

/// Names every address seen in each image, one image per task (symbolizers are not Sync).
fn symbolize_images(
    images: &[Image],
    frames: &[UserFrame],
    warnings: &mut WarningCounter,
) -> Names {
    let mut wanted: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); images.len()];
    for frame in frames {
        if let UserFrame::Image {
            image, lookup_svma, ..
        } = frame
        {
            wanted[*image].insert(*lookup_svma);
        }
    }
    let results: Vec<(ImageNames, Vec<String>)> = images
        .par_iter()
        .zip(wanted.into_par_iter())
        .map(|(image, addresses)| {
            if addresses.is_empty() {
                return (HashMap::new(), Vec::new());
            }
            let symbolizer = ImageSymbolizer::new(image);
            let names = addresses
                .into_iter()
                .map(|a| (a, symbolizer.functions_at(a)))
                .collect();
            (names, symbolizer.problems)
        })
        .collect();
    results
        .into_iter()
        .map(|(names, problems)| {
            problems.into_iter().for_each(|p| warnings.add(p));
            names
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    meta: &Metadata,
    header: lrec_format::Header,
    images: &[Image],
    unwound: Vec<UnwoundChunk>,
    distinct: &DistinctFrames,
    names: &Names,
    kernel: &KernelSymbolizer,
    mut warnings: WarningCounter,
) -> Profile {
    let mut thread_samples: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for s in unwound.iter().flat_map(|c| &c.samples) {
        *thread_samples.entry((s.pid, s.tid)).or_default() += 1;
    }
    let thread_index: HashMap<(u32, u32), usize> = thread_samples
        .keys()
        .enumerate()
        .map(|(i, k)| (*k, i))
        .collect();
    let threads = thread_samples
        .iter()
        .map(|(&(pid, tid), &samples)| Thread {
            pid,
            tid,
            name: thread_name(meta, pid, tid),
            samples,
        })
        .collect();

    // Name each distinct address once; samples then only look their frame ids up.
    let mut frames: Interner<Frame> = Interner::default();
    let user_ids: Vec<Vec<FrameId>> = distinct
        .user
        .iter()
        .map(|f| {
            let mut ids = Vec::new();
            user_frames(f, meta, images, names, |frame| ids.push(frames.id(frame)));
            ids
        })
        .collect();
    let kernel_ids: FxHashMap<(u64, bool), FrameId> = distinct
        .kernel
        .iter()
        .map(|&(addr, leaf)| ((addr, leaf), frames.id(kernel_frame(addr, leaf, kernel))))
        .collect();
    let samples: Vec<ProfileSample> = unwound
        .par_iter()
        .zip(distinct.remap.par_iter())
        .flat_map_iter(|(chunk, remap)| chunk.samples.iter().map(move |s| (s, remap)))
        .map(|(s, remap)| {
            let mut ids = Vec::with_capacity(s.user.len() + s.kernel.len());
            for &local in s.user.iter().rev() {
                ids.extend_from_slice(&user_ids[remap[local as usize] as usize]);
            }
            for (i, &addr) in s.kernel.iter().enumerate().rev() {
                ids.push(kernel_ids[&(addr, i == 0)]);
            }
            ProfileSample {
                time_ns: s.time_ns,
                pid: s.pid,
                tid: s.tid,
                thread: thread_index[&(s.pid, s.tid)],
                frames: ids,
                truncated: s.end != StackEnd::Complete,
            }
        })
        .collect();

    let mut stats = Stats {
        lost: meta.lost,
        ..Stats::default()
    };
    let mut no_unwind_info: BTreeMap<WithoutUnwindInfo, u64> = BTreeMap::new();
    let mut no_mappings: BTreeMap<u32, u64> = BTreeMap::new();
    for s in unwound.into_iter().flat_map(|c| c.samples) {
        stats.samples += 1;
        stats.first_time_ns = Some(stats.first_time_ns.map_or(s.time_ns, |t| t.min(s.time_ns)));
        stats.last_time_ns = Some(stats.last_time_ns.map_or(s.time_ns, |t| t.max(s.time_ns)));
        match s.end {
            StackEnd::Complete => {}
            StackEnd::Truncated => stats.truncated += 1,
            StackEnd::Failed => stats.failed_unwinds += 1,
        }
        stats.kernel_samples += u64::from(s.kernel_mode);
        if let Some(state) = s.vm_state {
            *stats
                .vm_states
                .entry(luajit::state_name(state))
                .or_default() += 1;
        }
        if s.no_mappings {
            *no_mappings.entry(s.pid).or_default() += 1;
        }
        for w in s.without_unwind_info {
            *no_unwind_info.entry(w).or_default() += 1;
        }
    }

    for (pid, n) in no_mappings {
        warnings.add_n(
            format!(
                "pid {pid}: the capture holds no memory mappings; its user stacks are [unknown]"
            ),
            n,
        );
    }
    let mut binaries: Vec<BinaryInfo> = images.iter().map(binary_info).collect();
    for (owner, n) in no_unwind_info {
        let name = match owner {
            WithoutUnwindInfo::Image(i) => {
                binaries[i].samples_without_unwind_info = n;
                images[i].path.clone()
            }
            WithoutUnwindInfo::Region(name) if name.is_empty() => {
                "anonymous memory (JIT code?)".into()
            }
            WithoutUnwindInfo::Region(name) => name.to_string(),
        };
        warnings.add_n(
            format!("{name}: no unwind info; stacks through it end there, marked [truncated]"),
            n,
        );
    }
    for image in images {
        if let Some(e) = &image.error {
            if image.resolved_locally.is_empty() {
                warnings.add(format!(
                    "{}: lrec could not embed it ({e}) and no matching local file was found",
                    image.path
                ));
            }
        }
    }
    let mut lua_vms: Vec<LuaVmInfo> = meta
        .lua_runtimes
        .values()
        .map(|r| LuaVmInfo {
            pid: r.pid,
            vm: r.vm.clone(),
            layout: r.layout.clone(),
            path: r.path.clone(),
            error: r.error.clone(),
        })
        .collect();
    lua_vms.sort_by_key(|v| v.pid);
    for vm in &lua_vms {
        if let Some(e) = &vm.error {
            warnings.add(e.clone());
        }
    }
    if stats.kernel_samples > 0 && kernel.is_empty() {
        warnings.add("the capture holds no kernel symbols; kernel frames are [unknown]".into());
    }

    Profile {
        header,
        end_reason: meta.end.as_ref().map(|e| e.reason.clone()),
        samples,
        frames: frames.list,
        threads,
        binaries,
        lua_vms,
        stats,
        warnings: warnings.into_sorted(),
    }
}

/// A kernel frame. Kernel stacks are recorded innermost first; all but the first entry
/// (`leaf`) are return addresses, looked up one byte before.
fn kernel_frame(addr: u64, leaf: bool, kernel: &KernelSymbolizer) -> Frame {
    let lookup = if leaf { addr } else { addr.wrapping_sub(1) };
    Frame {
        function: kernel.name(lookup).unwrap_or("[unknown]").to_owned(),
        module: None,
        kind: FrameKind::Kernel,
    }
}

/// The frames (outermost first) for one located user address.
fn user_frames(
    frame: &UserFrame,
    meta: &Metadata,
    images: &[Image],
    names: &Names,
    mut push: impl FnMut(Frame),
) {
    let (module, file_offset): (&str, &u64) = match frame {
        UserFrame::Lua {
            pid,
            proto,
            line,
            called_from,
            jit,
        } => {
            let mut frame = lua_function_frame(meta, *pid, *proto, *line, *called_from);
            if *jit {
                // perf's mark for JIT-compiled code.
                frame.function.push_str("_[j]");
            }
            push(frame);
            return;
        }
        UserFrame::LuaBuiltin { pid, id } => {
            let builtins = meta.lua_runtimes.get(pid).map(|r| r.builtins.as_slice());
            push(Frame {
                function: luajit::builtin_name(builtins.unwrap_or_default(), *id),
                module: None,
                kind: FrameKind::Lua,
            });
            return;
        }
        UserFrame::LuaState(name) => {
            push(Frame {
                function: name.to_string(),
                module: None,
                kind: FrameKind::Lua,
            });
            return;
        }
        UserFrame::Image {
            image,
            lookup_svma,
            file_offset,
        } => {
            let functions = names[*image].get(lookup_svma).map(Vec::as_slice);
            if let Some(functions) = functions.filter(|f| !f.is_empty()) {
                let module = Some(images[*image].basename().to_owned());
                for f in functions {
                    push(Frame {
                        function: f.name.clone(),
                        module: module.clone(),
                        kind: if f.inlined {
                            FrameKind::Inlined
                        } else {
                            FrameKind::User
                        },
                    });
                }
                return;
            }
            (images[*image].basename(), file_offset)
        }
        UserFrame::Mapped {
            module,
            file_offset,
        } => (module, file_offset),
        UserFrame::Unmapped => {
            push(Frame {
                function: "[unknown]".into(),
                module: None,
                kind: FrameKind::User,
            });
            return;
        }
    };
    push(Frame {
        function: format!("{module}+0x{file_offset:x}"),
        module: Some(module.to_string()),
        kind: FrameKind::User,
    });
}

/// A Lua function: `NAME CHUNK:LINEDEFINED` (`CHUNK:LINEDEFINED` when the call gives no
/// name), with `@LINE` for the current line when asked.
fn lua_function_frame(
    meta: &Metadata,
    pid: u32,
    proto: u32,
    line: u32,
    (caller, pos): (u32, u32),
) -> Frame {
    let name = meta.lua_protos.get(&(pid, caller)).and_then(|c| {
        let i = c.callee_names.binary_search_by_key(&pos, |n| n.0).ok()?;
        Some(c.callee_names[i].1.as_str())
    });
    let (function, module) = match meta.lua_protos.get(&(pid, proto)) {
        Some(p) => {
            let chunk = luajit::chunk_label(&p.chunkname);
            let mut label = match name {
                Some(n) => format!("{n} {chunk}:{}", p.firstline),
                None => format!("{chunk}:{}", p.firstline),
            };
            if line != u32::MAX {
                label.push_str(&format!("@{line}"));
            }
            (label, Some(chunk))
        }
        None => ("[unknown Lua function]".to_string(), None),
    };
    Frame {
        function,
        module,
        kind: FrameKind::Lua,
    }
}

fn thread_name(meta: &Metadata, pid: u32, tid: u32) -> String {
    if let Some(name) = meta.thread_names.get(&(pid, tid)) {
        return name.clone();
    }
    if pid == tid {
        if let Some(p) = meta.processes.iter().find(|p| p.pid == pid) {
            let name = basename(&p.exe);
            if !name.is_empty() {
                return name.to_owned();
            }
        }
    }
    format!("[tid {tid}]")
}

fn binary_info(image: &Image) -> BinaryInfo {
    BinaryInfo {
        path: image.path.clone(),
        build_id: image.build_id.clone(),
        sections_embedded: image.sections_embedded,
        dwarf_embedded: image.dwarf_embedded,
        resolved_locally: image.resolved_locally.clone(),
        has_unwind_info: image.has_unwind_info(),
        has_dwarf: image.has_dwarf(),
        error: image.error.clone(),
        samples_without_unwind_info: 0,
    }
}

/// Warnings, each kept once with how often it happened, in order of first occurrence
/// (capture order, which is deterministic).
#[derive(Default)]
struct WarningCounter {
    messages: Interner<String>,
    counts: Vec<u64>,
}

impl WarningCounter {
    fn add(&mut self, message: String) {
        self.add_n(message, 1);
    }

    fn add_n(&mut self, message: String, n: u64) {
        let i = self.messages.id(message) as usize;
        if i == self.counts.len() {
            self.counts.push(0);
        }
        self.counts[i] += n;
    }

    fn into_sorted(self) -> Vec<Warning> {
        let counts = self.counts.into_iter();
        let messages = self.messages.list.into_iter();
        messages
            .zip(counts)
            .map(|(message, count)| Warning { message, count })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded kernel stack (innermost first) as frames outermost first, as assembled.
    fn kernel_frames(stack: &[u64], k: &KernelSymbolizer) -> Vec<Frame> {
        let frames = stack.iter().enumerate().rev();
        frames.map(|(i, &a)| kernel_frame(a, i == 0, k)).collect()
    }

    #[test]
    fn kernel_frames_go_outermost_first_with_return_addresses_looked_up_before() {
        let k = KernelSymbolizer::new(vec![
            (0x1000, 0x1100, "entry_SYSCALL_64".into()),
            (0x2000, 0x2100, "do_syscall_64".into()),
            (0x3000, 0x3100, "__x64_sys_read".into()),
            (0x3100, 0x3200, "next_after_read".into()),
        ]);
        // Innermost (the interrupted instruction) first; 0x3100 is a return address whose
        // call lies at the end of __x64_sys_read.
        let names: Vec<String> = kernel_frames(&[0x3100, 0x2050, 0x1010, 0x9999], &k)
            .iter()
            .map(Frame::display_name)
            .collect();
        assert_eq!(
            names,
            [
                "[unknown]_[k]",
                "entry_SYSCALL_64_[k]",
                "do_syscall_64_[k]",
                "next_after_read_[k]",
            ]
        );
        let names: Vec<String> = kernel_frames(&[0x3050, 0x3100], &k)
            .iter()
            .map(Frame::display_name)
            .collect();
        assert_eq!(names, ["__x64_sys_read_[k]", "__x64_sys_read_[k]"]);
    }
}

//! The analysis pipeline: metadata pass, images, per-process maps, parallel unwinding,
//! per-image symbolization, and assembly of the [`Profile`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use lrec_format::{
    kind, kind_bit, lua_flags, lua_frame_kind, sample_flags, task_state_letter, Capture, LuaStack,
    Mapping, Record, RecordRef, SampleRef, LUA_LINK_JIT, OFF_CPU_LUA_YIELD,
};
use rayon::prelude::*;

use crate::address_space::{build_process_maps, AddressSpace, ProcessMaps};
use crate::image::Image;
use crate::lua::{self, luajit, Merged};
use crate::metadata::{read_metadata, BinaryKey, Metadata};
use crate::profile::{Mode, OffCpu, Profile, SampleKind, Wait};
use crate::stages::{
    locate, ChunkFrames, DistinctFrames, ImageNames, Names, UnwoundChunk, UnwoundSample, UserFrame,
    WarningCounter, WithoutUnwindInfo,
};
use crate::symbolize::{ImageSymbolizer, KernelSymbolizer};
use crate::unwind::{unwind_user, CodeAddress, StackEnd, UnwindCache, VmHint};
use crate::{AnalyzeError, BinaryLocator, Options, Wanted};

const DEFAULT_PAGE_SIZE: u64 = 4096;

pub fn run(
    capture: &Capture,
    opts: &Options,
    locator: &dyn BinaryLocator,
) -> Result<Profile, AnalyzeError> {
    run_with_images(capture, opts, locator).map(|(profile, _)| profile)
}

/// The profile, and the images of the capture's binaries as the analysis completed them
/// (none for a stripped capture).
pub(crate) fn run_with_images(
    capture: &Capture,
    opts: &Options,
    locator: &dyn BinaryLocator,
) -> Result<(Profile, Vec<Image>), AnalyzeError> {
    let mut meta = read_metadata(capture);
    if crate::strip::is_stripped(&meta) {
        if opts.mode != Mode::Cpu {
            return Err(AnalyzeError::StrippedCpuOnly);
        }
        return Ok((crate::strip::read_stripped(&mut meta, opts), Vec::new()));
    }
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
    let mut images = build_images(&meta, locator);
    let image_of = meta.binary_index();
    let mut mappings_by_pid: BTreeMap<u32, Vec<&Mapping>> = BTreeMap::new();
    for m in &meta.mappings {
        mappings_by_pid.entry(m.pid).or_default().push(m);
    }
    let maps: HashMap<u32, ProcessMaps> = mappings_by_pid
        .into_par_iter()
        .map(|(pid, ms)| (pid, build_process_maps(ms, &images, &image_of, page_size)))
        .collect();

    let (cpu, off) = match opts.mode {
        Mode::Cpu => (true, false),
        Mode::OffCpu => (false, true),
        Mode::Wall => (true, true),
        // Blocked intervals recorded with stacks lend them to the states taken meanwhile.
        Mode::States => (false, true),
    };
    let wanted = (if cpu { kind_bit(kind::SAMPLE) } else { 0 })
        | (if off { kind_bit(kind::OFF_CPU) } else { 0 });
    let mut unwound: Vec<UnwoundChunk> = capture
        .chunks()
        .par_iter()
        .filter(|chunk| chunk.kinds & wanted != 0)
        .map_init(UnwindCache::new, |cache, chunk| {
            let mut frames = ChunkFrames::default();
            let mut samples = Vec::with_capacity(chunk.records as usize);
            // A sample's Lua stack comes just before it.
            let mut lua_stack: Option<LuaStack> = None;
            let mut unwind = |s: SampleRef, when: u64, kind: SampleKind, lua: Option<LuaStack>| {
                let lua = lua.filter(|l| l.tid == s.tid && l.time_ns == s.time_ns);
                if opts.keeps(header.monotonic_start_ns, s.pid, s.tid, when) {
                    let maps = maps.get(&s.pid);
                    let lua = lua.as_ref().map(|l| (l, &meta));
                    let bare_vm = meta.luajit_code(s.pid).filter(|_| lua.is_none());
                    let mut u = unwind_sample(s, maps, lua, bare_vm, cache, &mut frames);
                    u.kind = kind;
                    samples.push(u);
                }
            };
            capture.visit_chunk(
                chunk,
                |k| k == kind::SAMPLE || k == kind::OFF_CPU || k == kind::LUA_STACK,
                |r| match r {
                    RecordRef::Other(Record::LuaStack(l)) => lua_stack = Some(l),
                    RecordRef::Sample(s) if cpu => {
                        let when = s.time_ns;
                        unwind(s, when, SampleKind::Cpu, lua_stack.take())
                    }
                    RecordRef::OffCpu(o) if off => {
                        let interval = OffCpu {
                            start_ns: o.start_ns,
                            duration_ns: o.duration_ns,
                            wait: if o.state == OFF_CPU_LUA_YIELD {
                                Wait::LuaYield
                            } else {
                                Wait::Blocked(task_state_letter(o.state, 0))
                            },
                        };
                        unwind(
                            o.sample,
                            o.start_ns,
                            SampleKind::OffCpu(interval),
                            lua_stack.take(),
                        )
                    }
                    _ => lua_stack = None,
                },
            );
            UnwoundChunk {
                frames: frames.list,
                samples,
            }
        })
        .collect();
    if opts.mode == Mode::States {
        let mut states = crate::waits::state_samples(&meta, &maps, opts);
        crate::waits::states_with_off_cpu_stacks(&mut unwound, &mut states);
        unwound.push(states);
    } else if off {
        unwound.push(crate::waits::unstacked_off_cpu(&meta, opts, &mut warnings));
    }

    // Symbolization and assembly work per distinct address, not per frame of each sample.
    let distinct = distinct_frames(&unwound);
    drop(maps);
    fetch_missing_names(&mut images, &meta, &distinct.user, locator);
    let names = symbolize_images(&images, &distinct.user, &mut warnings);
    let mut profile = crate::assemble::assemble(
        &meta, header, &images, unwound, &distinct, &names, &kernel, warnings,
    );
    profile.latency = meta.latencies(opts);
    Ok((profile, images))
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

/// Completes the images that stacks ran in and that nothing names but their exported
/// symbols, from the locator's remote source (debuginfod), in parallel.
fn fetch_missing_names(
    images: &mut [Image],
    meta: &Metadata,
    frames: &[UserFrame],
    locator: &dyn BinaryLocator,
) {
    let mut used = vec![false; images.len()];
    for f in frames {
        if let UserFrame::Image { image, .. } = f {
            used[*image] = true;
        }
    }
    images
        .par_iter_mut()
        .zip(&meta.binaries)
        .zip(used)
        .filter(|((image, _), used)| *used && !image.has_full_names())
        .for_each(|((image, binary), _)| {
            if let Some(file) = locator.fetch_debug_info(binary) {
                image.complete_from(file);
            }
        });
}

/// Frame `i` of `stack`, located, with its current line.
fn lua_frame(
    meta: &Metadata,
    pid: u32,
    stack: &LuaStack,
    i: usize,
    puc: bool,
    space: &AddressSpace,
) -> UserFrame {
    let f = &stack.frames[i];
    match f.kind {
        lua_frame_kind::LUA => {
            let line = meta
                .lua_protos
                .get(&(pid, f.function))
                .and_then(|p| p.lines.get(f.pos as usize).copied())
                .unwrap_or(0);
            // Called by a Lua function (or a metamethod it triggered): the calling
            // instruction names the callee.
            let caller = stack.frames.get(i + 1).filter(|c| {
                c.kind == lua_frame_kind::LUA
                    && if puc {
                        lua::puc::called_by_lua(f, c)
                    } else {
                        luajit::called_by_lua(f.link)
                    }
            });
            let called_from = caller.map(|c| (c.function, c.pos));
            // A trace's start frame and the functions inlined into it run compiled
            // code (captures before lrec marked them: the innermost frame in a trace).
            let jit = !puc && (f.link & LUA_LINK_JIT != 0 || (i == 0 && stack.vmstate >= 0));
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
                vm_work: false,
            },
        ),
    }
}

fn unwind_sample(
    s: SampleRef,
    maps: Option<&ProcessMaps>,
    lua: Option<(&LuaStack, &Metadata)>,
    bare_vm: Option<(u64, u64)>,
    cache: &mut UnwindCache,
    frames: &mut ChunkFrames,
) -> UnwoundSample {
    let space = maps.and_then(|m| m.at(s.time_ns));
    let no_regs = s.flags & sample_flags::NO_USER_REGS != 0 || s.regs.ip == 0;
    let kernel_mode = s.flags & sample_flags::KERNEL_MODE != 0;
    let mut out = UnwoundSample::unwalked(
        s.time_ns,
        s.pid,
        s.tid,
        Vec::new(),
        s.kernel_stack,
        SampleKind::Cpu,
    );
    out.kernel_mode |= kernel_mode;
    out.vm_state = lua.map(|(l, _)| l.vmstate);
    out.lua_vm = lua.map(|(l, _)| (l.vm, l.flags & lua_flags::PUC != 0));
    out.jit_mapped = lua.and_then(|(l, _)| {
        if l.flags & lua_flags::JIT_MAPPED != 0 {
            Some(true)
        } else if l.flags & lua_flags::JIT_UNMAPPED != 0 {
            Some(false)
        } else {
            None
        }
    });
    // The Lua VM the sample ran in, if its runtime is known.
    let lua = lua.and_then(|(l, meta)| Some((l, meta, meta.lua_runtime(s.pid, l.flags)?)));
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
            // LuaJIT's VM frames are stepped over with a hint (its C frames); PUC Lua's
            // luaV_execute frames unwind as any C function.
            let puc = lua.is_some_and(|(_, _, rt)| lua::is_puc(rt));
            let mut cframes = Vec::new();
            let code = lua.map(|(_, _, rt)| [(rt.vm_start, rt.vm_end)]);
            let bare = bare_vm.map(|c| [c]);
            let hint = match (lua, &code, &bare) {
                (Some((l, _, _)), Some(code), _) if !puc => {
                    lua::cframes(l, &mut cframes);
                    Some(VmHint {
                        code,
                        cframes: &cframes,
                        innermost: l.cframe,
                    })
                }
                // A LuaJIT VM without Lua stacks: its C frames are searched for.
                (None, _, Some(code)) => Some(VmHint {
                    code,
                    cframes: &[],
                    innermost: 0,
                }),
                _ => None,
            };
            let stack = unwind_user(space, &s.regs, s.user_stack, cache, hint);
            match lua {
                Some((l, meta, rt)) => {
                    let mut merged = Vec::new();
                    let placed = match hint {
                        Some(hint) => {
                            let state = luajit::state_frame(l.vmstate);
                            lua::merge(stack.frames, l, &hint, state, &mut merged)
                        }
                        None => {
                            let execute = (rt.vm_start, rt.vm_end);
                            lua::puc::merge(stack.frames, l, execute, &mut merged)
                        }
                    };
                    if !placed && stack.end == StackEnd::Complete {
                        // The native stack is whole and holds no interpreter frame for
                        // some Lua frames: they cannot be placed, and are not guessed.
                        out.lua_unplaced = true;
                        merged.clear();
                        merged.extend((0..stack.frames.len()).map(Merged::Native));
                    }
                    out.user = merged
                        .iter()
                        .map(|m| {
                            frames.id(match *m {
                                Merged::Native(i) => locate(space, &stack.frames[i]),
                                Merged::Lua(i) => lua_frame(meta, s.pid, l, i, puc, space),
                                Merged::State(name) => UserFrame::LuaState(name),
                            })
                        })
                        .collect();
                }
                // A LuaJIT VM without its Lua frames: its work (a trace, a helper, its
                // frames found by searching) shows as one frame.
                None if hint.is_some() => {
                    let vm = frames.id(UserFrame::LuaState("[LuaJIT VM]"));
                    out.user.clear();
                    for a in stack.frames.iter() {
                        let id = if a.vm_work {
                            vm
                        } else {
                            frames.id(locate(space, a))
                        };
                        if !(a.vm_work && out.user.last() == Some(&vm)) {
                            out.user.push(id);
                        }
                    }
                }
                None => {
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

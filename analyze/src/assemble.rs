//! The last stage of the analysis: each distinct frame named once, each sample turned
//! into frame ids, and the counters, warnings and binary facts of the [`Profile`].

use std::collections::{BTreeMap, BTreeSet};

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::image::Image;
use crate::lua::luajit;
use crate::metadata::Metadata;
use crate::profile::{
    BinaryInfo, BinaryNames, Frame, FrameId, FrameKind, LuaLines, LuaVmInfo, Naming, Profile,
    ProfileSample, SampleKind, Wait,
};
use crate::stages::{
    index_threads, sample_stats, DistinctFrames, Interner, Names, UnwoundChunk, UserFrame,
    WarningCounter, WithoutUnwindInfo,
};
use crate::symbolize::KernelSymbolizer;
use crate::waits::wait_frame;

#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble(
    meta: &Metadata,
    header: lrec_format::Header,
    images: &[Image],
    unwound: Vec<UnwoundChunk>,
    distinct: &DistinctFrames,
    names: &Names,
    kernel: &KernelSymbolizer,
    mut warnings: WarningCounter,
) -> Profile {
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
    let min_ns = meta.off_cpu_totals.as_ref().map_or(0, |t| t.min_ns);
    let wait_ids: FxHashMap<Wait, FrameId> = unwound
        .iter()
        .flat_map(|c| c.samples.iter())
        .filter_map(|s| match s.kind {
            SampleKind::OffCpu(o) => Some(o),
            _ => None,
        })
        .map(|o| o.wait)
        .collect::<BTreeSet<Wait>>()
        .into_iter()
        .map(|wait| (wait, frames.id(wait_frame(wait, min_ns))))
        .collect();
    let mut samples: Vec<ProfileSample> = unwound
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
            if let SampleKind::OffCpu(o) = s.kind {
                ids.push(wait_ids[&o.wait]);
            }
            ProfileSample {
                time_ns: s.time_ns,
                pid: s.pid,
                tid: s.tid,
                thread: 0,
                frames: ids,
                end: s.end,
                kernel_mode: s.kernel_mode,
                vm_state: s.vm_state,
                jit_mapped: s.jit_mapped,
                kind: s.kind,
            }
        })
        .collect();
    let threads = index_threads(&mut samples, |pid, tid| meta.thread_name(pid, tid));
    let processes = meta.process_names(&threads);

    let mut stats = sample_stats(&samples, meta.lost, meta.lost_causes.clone());
    let mut no_unwind_info: BTreeMap<WithoutUnwindInfo, u64> = BTreeMap::new();
    let mut no_mappings: BTreeMap<u32, u64> = BTreeMap::new();
    let mut lua_unplaced: BTreeMap<u32, u64> = BTreeMap::new();
    let mut lua_states: BTreeSet<(u32, bool, u64)> = BTreeSet::new();
    let mut coverage = NamingCoverage::new(images, distinct, names);
    let samples_with_remap = unwound
        .into_iter()
        .zip(&distinct.remap)
        .flat_map(|(c, remap)| c.samples.into_iter().map(move |s| (s, remap)));
    for (s, remap) in samples_with_remap {
        coverage.add(&s.user, remap);
        if let Some((g, puc)) = s.lua_vm {
            lua_states.insert((s.pid, puc, g));
        }
        if s.no_mappings {
            *no_mappings.entry(s.pid).or_default() += 1;
        }
        if s.lua_unplaced {
            *lua_unplaced.entry(s.pid).or_default() += 1;
        }
        for w in s.without_unwind_info {
            *no_unwind_info.entry(w).or_default() += 1;
        }
    }

    let binary_names = coverage.per_image;
    for (pid, n) in no_mappings {
        warnings.add_n(
            format!(
                "pid {pid}: the capture holds no memory mappings; its user stacks are [unknown]"
            ),
            n,
        );
    }
    for (pid, puc, _) in lua_states {
        *stats.lua_states.entry((pid, puc)).or_default() += 1;
    }
    for (pid, n) in lua_unplaced {
        warnings.add_n(
            format!(
                "pid {pid}: Lua frames without a native interpreter frame to stand in for \
                 (the interpreter is not where lrec found it): those samples show native \
                 frames only"
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
            if !image.completed() {
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
    lua_vms.sort_by(|a, b| (a.pid, &a.path).cmp(&(b.pid, &b.path)));
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
        processes,
        binaries,
        binary_names,
        lua_vms,
        stats,
        warnings: warnings.into_sorted(),
        naming: Naming::default(),
        mode: Default::default(),
        latency: None,
        window: crate::waits::recording_window(meta),
    }
}

/// Per image: what names it, the samples with a frame in it, and of those the samples with
/// a frame in it that nothing names.
struct NamingCoverage {
    per_image: Vec<BinaryNames>,
    /// Per distinct frame: its image and whether it has a name.
    place: Vec<Option<(usize, bool)>>,
    /// One sample's (image, unnamed) pairs.
    seen: Vec<(usize, bool)>,
}

impl NamingCoverage {
    fn new(images: &[Image], distinct: &DistinctFrames, names: &Names) -> NamingCoverage {
        let place = distinct
            .user
            .iter()
            .map(|f| match f {
                UserFrame::Image {
                    image, lookup_svma, ..
                } => {
                    let named = names[*image]
                        .get(lookup_svma)
                        .is_some_and(|f| !f.is_empty());
                    Some((*image, named))
                }
                _ => None,
            })
            .collect();
        let per_image = images
            .iter()
            .map(|i| BinaryNames {
                names_from: i.names_from(),
                ..BinaryNames::default()
            })
            .collect();
        NamingCoverage {
            per_image,
            place,
            seen: Vec::new(),
        }
    }

    /// Counts a sample of user frames `user` (its chunk's indices, `remap`ped to distinct).
    fn add(&mut self, user: &[u32], remap: &[u32]) {
        self.seen.clear();
        let frames = user.iter().map(|&l| self.place[remap[l as usize] as usize]);
        self.seen
            .extend(frames.flatten().map(|(i, named)| (i, !named)));
        // One entry per image: unnamed if any of its frames is.
        self.seen.sort_unstable();
        self.seen.dedup_by(|b, a| {
            a.0 == b.0 && {
                a.1 |= b.1;
                true
            }
        });
        for &(i, unnamed) in &self.seen {
            self.per_image[i].samples += 1;
            self.per_image[i].unnamed += u64::from(unnamed);
        }
    }
}

/// A kernel frame. Kernel stacks are recorded innermost first; all but the first entry
/// (`leaf`) are return addresses, looked up one byte before.
fn kernel_frame(addr: u64, leaf: bool, kernel: &KernelSymbolizer) -> Frame {
    let lookup = if leaf { addr } else { addr.wrapping_sub(1) };
    Frame::named(
        kernel.name(lookup).unwrap_or("[unknown]"),
        None,
        FrameKind::Kernel,
    )
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
            push(lua_function_frame(
                meta,
                *pid,
                *proto,
                *line,
                *called_from,
                *jit,
            ));
            return;
        }
        UserFrame::LuaBuiltin { pid, id } => {
            // Built-ins are LuaJIT's fast functions.
            let builtins = meta.lua_runtime(*pid, 0).map(|r| r.builtins.as_slice());
            push(Frame::named(
                luajit::builtin_name(builtins.unwrap_or_default(), *id),
                None,
                FrameKind::Lua,
            ));
            return;
        }
        UserFrame::LuaState(name) => {
            push(Frame::named(*name, None, FrameKind::Lua));
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
                    let kind = if f.inlined {
                        FrameKind::Inlined
                    } else {
                        FrameKind::User
                    };
                    push(Frame::named(f.name.clone(), module.clone(), kind));
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
            push(Frame::named("[unknown]", None, FrameKind::User));
            return;
        }
    };
    push(Frame::named(
        format!("{module}+0x{file_offset:x}"),
        Some(module.to_string()),
        FrameKind::User,
    ));
}

/// A Lua function: `NAME CHUNK:LINEDEFINED` (`CHUNK:LINEDEFINED` when the call gives no
/// name), running `line` (0: unknown), JIT-compiled or not.
fn lua_function_frame(
    meta: &Metadata,
    pid: u32,
    proto: u32,
    line: u32,
    called_from: Option<(u32, u32)>,
    jit: bool,
) -> Frame {
    let name = called_from.and_then(|(caller, pos)| {
        let c = meta.lua_protos.get(&(pid, caller))?;
        let i = c.callee_names.binary_search_by_key(&pos, |n| n.0).ok()?;
        Some(c.callee_names[i].1.as_str())
    });
    let (function, module, first) = match meta.lua_protos.get(&(pid, proto)) {
        Some(p) => {
            let chunk = luajit::chunk_label(&p.chunkname);
            let label = match name {
                Some(n) => format!("{n} {chunk}:{}", p.firstline),
                None => format!("{chunk}:{}", p.firstline),
            };
            let first = u32::try_from(p.firstline).unwrap_or(0);
            (label, Some(chunk), Some(first))
        }
        None => ("[unknown Lua function]".to_string(), None, None),
    };
    Frame {
        lines: first.map(|first| LuaLines {
            first,
            current: line,
        }),
        jit,
        function,
        module,
        kind: FrameKind::Lua,
    }
}

fn binary_info(image: &Image) -> BinaryInfo {
    BinaryInfo {
        path: image.path.clone(),
        build_id: image.build_id.clone(),
        sections_embedded: image.sections_embedded,
        dwarf_embedded: image.dwarf_embedded,
        resolved_locally: image.resolved_locally(),
        has_unwind_info: image.has_unwind_info(),
        has_dwarf: image.has_dwarf(),
        error: image.error.clone(),
        samples_without_unwind_info: 0,
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
            .map(|f| f.display_name(Naming::default()))
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
            .map(|f| f.display_name(Naming::default()))
            .collect();
        assert_eq!(names, ["__x64_sys_read_[k]", "__x64_sys_read_[k]"]);
    }
}

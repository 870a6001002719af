//! The memory map of a process over time, and a framehop unwinder for each state of it.

use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::sync::Arc;

use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use lrec_format::Mapping;

use crate::cfi::{CfiIndex, Special};
use crate::image::{basename, Image};

/// Section bytes shared by every module made from one image.
#[derive(Clone, Default)]
pub struct SharedBytes(Arc<[u8]>);

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

pub type ProcessUnwinder = UnwinderX86_64<SharedBytes>;

/// A mapping, with the image it maps and the translation to the image's addresses.
#[derive(Debug, Clone)]
pub struct MappedRegion {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub executable: bool,
    /// Basename of the mapped path (`[vdso]`, `libc.so.6`); empty for anonymous memory.
    pub name: Arc<str>,
    /// Index into the analysis' images.
    pub image: Option<usize>,
    /// `avma - svma`, when the image's segments place the mapping.
    pub bias: Option<u64>,
    /// The unwinder has a module with unwind info for this region.
    pub has_unwind_info: bool,
    /// The addresses of the image its CFI covers (shared by the image's regions).
    pub cfi: Option<Arc<CfiIndex>>,
}

impl MappedRegion {
    /// The image's CFI index and `avma` as its SVMA, when the image has usable unwind info.
    fn cfi_at(&self, avma: u64) -> Option<(&CfiIndex, u64)> {
        match (&self.cfi, self.bias) {
            (Some(cfi), Some(bias)) if self.has_unwind_info => Some((cfi, avma.wrapping_sub(bias))),
            _ => None,
        }
    }

    /// Whether the image's CFI covers `avma`: only then does framehop unwind it by its
    /// unwind info rather than by frame-pointer guesswork.
    pub fn cfi_covers(&self, avma: u64) -> bool {
        self.cfi_at(avma)
            .is_some_and(|(cfi, svma)| cfi.covers(svma))
    }

    /// How to unwind `avma` where framehop would not do it right ([`Special`]).
    pub fn cfi_special(&self, avma: u64, first_frame: bool) -> Option<Special> {
        self.cfi_at(avma)
            .and_then(|(cfi, svma)| cfi.special(svma, first_frame))
    }

    pub fn file_offset(&self, avma: u64) -> u64 {
        avma - self.start + self.offset
    }
}

/// The mappings of a process from some time on.
pub struct AddressSpace {
    /// Sorted by start, non-overlapping.
    regions: Vec<MappedRegion>,
    pub unwinder: ProcessUnwinder,
}

impl AddressSpace {
    pub fn region(&self, avma: u64) -> Option<&MappedRegion> {
        self.region_index(avma).map(|i| &self.regions[i])
    }

    /// Index of the region holding `avma`, for [`AddressSpace::region_at`].
    pub fn region_index(&self, avma: u64) -> Option<usize> {
        let i = self.regions.partition_point(|r| r.start <= avma);
        (i > 0 && avma < self.regions[i - 1].end).then(|| i - 1)
    }

    pub fn region_at(&self, index: usize) -> &MappedRegion {
        &self.regions[index]
    }

    /// Whether any mapping is known at all (kernel threads have none).
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

/// Every state of one process's memory map: a new state starts at each time mappings
/// were read. A state also holds mappings read later that overlap nothing it knows.
pub struct ProcessMaps {
    /// Sorted by time.
    states: Vec<(u64, AddressSpace)>,
}

impl ProcessMaps {
    /// The state at `time_ns`: the latest read at or before it, else the earliest.
    pub fn at(&self, time_ns: u64) -> Option<&AddressSpace> {
        let i = self.states.partition_point(|(t, _)| *t <= time_ns);
        self.states.get(i.saturating_sub(1)).map(|(_, s)| s)
    }
}

/// Builds the states of one process from its mappings (any order). `image_of` finds the
/// image a mapping maps.
pub fn build_process_maps(
    mut mappings: Vec<&Mapping>,
    images: &[Image],
    image_of: impl Fn(&Mapping) -> Option<usize>,
    page_size: u64,
) -> ProcessMaps {
    mappings.sort_by_key(|m| m.time_ns);
    let regions: Vec<(u64, MappedRegion)> = mappings
        .iter()
        .filter(|m| m.end > m.start)
        .map(|m| {
            let image = image_of(m);
            let region = MappedRegion {
                start: m.start,
                end: m.end,
                offset: m.offset,
                executable: m.perms.contains('x'),
                name: basename(&m.path).into(),
                image,
                bias: image.and_then(|x| images[x].bias(m, page_size)),
                has_unwind_info: false,
                cfi: None,
            };
            (m.time_ns, region)
        })
        .collect();
    // Forward: each read's mappings replace what they overlap from their time on.
    let mut snapshots: Vec<(u64, Vec<MappedRegion>)> = Vec::new();
    let mut current: Vec<MappedRegion> = Vec::new();
    for (i, (time, region)) in regions.iter().enumerate() {
        current = current
            .into_iter()
            .flat_map(|r| cut_out(r, region.start..region.end))
            .collect();
        current.push(region.clone());
        if regions.get(i + 1).is_none_or(|(next, _)| next != time) {
            snapshots.push((*time, current.clone()));
        }
    }
    // Backward: a mapping read later was most likely there already where nothing known
    // earlier overlaps it (maps are read after the fact, e.g. after a dlopen was seen).
    for (time, snapshot) in &mut snapshots {
        for (_, later) in regions.iter().filter(|(t, _)| t > time) {
            if !snapshot
                .iter()
                .any(|r| r.start < later.end && later.start < r.end)
            {
                snapshot.push(later.clone());
            }
        }
        snapshot.sort_by_key(|r| r.start);
    }
    let mut modules: HashMap<(u64, u64, usize, u64), Module<SharedBytes>> = HashMap::new();
    let mut section_cache: HashMap<usize, Option<UnwindSections>> = HashMap::new();
    let mut cfi_cache: HashMap<usize, Arc<CfiIndex>> = HashMap::new();
    let states = snapshots
        .into_iter()
        .map(|(time, mut regions)| {
            let mut unwinder = ProcessUnwinder::new();
            for r in regions.iter_mut().filter(|r| r.executable) {
                let (Some(image), Some(bias)) = (r.image, r.bias) else {
                    continue;
                };
                let sections = section_cache
                    .entry(image)
                    .or_insert_with(|| UnwindSections::of(&images[image]));
                let Some(sections) = sections else { continue };
                let module = modules
                    .entry((r.start, r.end, image, bias))
                    .or_insert_with(|| sections.module(&r.name, r.start..r.end, bias));
                unwinder.add_module(module.clone());
                r.has_unwind_info = true;
                let cfi = cfi_cache
                    .entry(image)
                    .or_insert_with(|| Arc::new(CfiIndex::of(&images[image])));
                r.cfi = Some(cfi.clone());
            }
            let space = AddressSpace { regions, unwinder };
            (time, space)
        })
        .collect();
    ProcessMaps { states }
}

/// What remains of `region` outside `hole`: nothing, itself, or one or two pieces.
fn cut_out(region: MappedRegion, hole: Range<u64>) -> Vec<MappedRegion> {
    if region.end <= hole.start || region.start >= hole.end {
        return vec![region];
    }
    let mut pieces = Vec::new();
    if region.start < hole.start {
        pieces.push(MappedRegion {
            end: hole.start,
            ..region.clone()
        });
    }
    if region.end > hole.end {
        pieces.push(MappedRegion {
            start: hole.end,
            offset: region.offset + (hole.end - region.start),
            ..region
        });
    }
    pieces
}

/// The unwind sections of an image, copied once and shared by its modules.
struct UnwindSections {
    info: ExplicitModuleSectionInfo<SharedBytes>,
}

impl UnwindSections {
    fn of(image: &Image) -> Option<UnwindSections> {
        if !image.has_unwind_info() {
            return None;
        }
        let bytes = |name: &str| image.data(name).map(|d| SharedBytes(d.into()));
        let range = |name: &str| {
            image
                .section(name)
                .map(|s| s.addr..s.addr.saturating_add(s.size))
        };
        Some(UnwindSections {
            info: ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: range(".text"),
                eh_frame_svma: range(".eh_frame"),
                eh_frame: bytes(".eh_frame"),
                eh_frame_hdr_svma: range(".eh_frame_hdr"),
                eh_frame_hdr: bytes(".eh_frame_hdr"),
                debug_frame: bytes(".debug_frame"),
                ..ExplicitModuleSectionInfo::default()
            },
        })
    }

    fn module(&self, name: &str, avma: Range<u64>, bias: u64) -> Module<SharedBytes> {
        Module::new(name.to_owned(), avma, bias, self.info.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(time_ns: u64, start: u64, end: u64, path: &str) -> Mapping {
        Mapping {
            time_ns,
            start,
            end,
            perms: "r-xp".into(),
            path: path.into(),
            ..Mapping::default()
        }
    }

    #[test]
    fn later_mappings_replace_overlapping_ones_from_their_time_on() {
        let a = mapping(100, 0x1000, 0x3000, "/lib/a.so");
        let b = mapping(200, 0x2000, 0x4000, "/lib/b.so");
        let c = mapping(200, 0x8000, 0x9000, "/lib/c.so");
        let maps = build_process_maps(vec![&b, &a, &c], &[], |_| None, 4096);
        let name = |t, addr| {
            maps.at(t)
                .and_then(|s| s.region(addr))
                .map(|r| r.name.clone())
        };
        // Before the first read, the earliest state is used.
        assert_eq!(name(50, 0x1000).as_deref(), Some("a.so"));
        assert_eq!(name(150, 0x2500).as_deref(), Some("a.so"));
        // c.so, read later, overlaps nothing known before: it was there already.
        assert_eq!(name(150, 0x8000).as_deref(), Some("c.so"));
        assert_eq!(name(200, 0x2500).as_deref(), Some("b.so"));
        assert_eq!(
            name(200, 0x1500).as_deref(),
            Some("a.so"),
            "a.so keeps its head"
        );
        assert_eq!(name(300, 0x8fff).as_deref(), Some("c.so"));
        assert_eq!(name(300, 0x9000), None);
    }
}

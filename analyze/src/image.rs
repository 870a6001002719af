//! One binary as the analysis sees it: the capture's embedded sections, completed by local
//! files when allowed, and the address translation between the binary and a mapping.

use lrec_format::{Binary, Mapping, Section, Segment};

use crate::{Located, Source};

/// Sections that name functions, best first.
const NAMING_SECTIONS: [&str; 3] = [".debug_info", ".symtab", ".dynsym"];
/// Those that name static functions too, not only exported ones.
pub const FULL_NAMES: [&str; 2] = [".debug_info", ".symtab"];

const PF_X: u32 = 1;
const PF_W: u32 = 2;

/// A binary's segments and sections, whichever source they came from.
#[derive(Debug, Clone, Default)]
pub struct Image {
    pub path: String,
    pub build_id: Option<Vec<u8>>,
    pub segments: Vec<Segment>,
    sections: Vec<Section>,
    pub sections_embedded: bool,
    pub dwarf_embedded: bool,
    pub error: Option<String>,
    /// The sections files supplied, each with where from; the capture's own are not listed.
    pub origins: Vec<Origin>,
}

/// A section a file supplied: its name, the file's path and what found the file.
#[derive(Debug, Clone)]
pub struct Origin {
    pub section: String,
    pub path: String,
    pub source: Source,
}

impl Image {
    pub fn from_binary(binary: &Binary) -> Image {
        let mut image = Image {
            path: binary.path.clone(),
            build_id: binary.build_id.clone(),
            segments: binary.segments.clone(),
            sections: binary.sections.clone(),
            error: binary.error.clone(),
            ..Image::default()
        };
        image.sections_embedded = image.has_unwind_info() || image.data(".symtab").is_some();
        image.dwarf_embedded = image.has_dwarf();
        image
    }

    /// Adds the sections of a file that this image lacks (and its segments, if the
    /// capture had none).
    pub fn complete_from(&mut self, located: Located) {
        let Located { file, source } = located;
        if self.segments.is_empty() {
            self.segments = file.segments;
        }
        for s in file.sections {
            let lacking = match self.section(&s.name) {
                None => true,
                Some(have) => have.data.is_empty() && !s.data.is_empty(),
            };
            if lacking && (!s.data.is_empty() || s.name == ".text") {
                if !s.data.is_empty() {
                    self.origins.push(Origin {
                        section: s.name.clone(),
                        path: file.path.clone(),
                        source: source.clone(),
                    });
                }
                self.sections.retain(|h| h.name != s.name);
                self.sections.push(s);
            }
        }
    }

    /// The files that supplied sections, in the order they were read.
    pub fn resolved_locally(&self) -> Vec<String> {
        let mut paths: Vec<String> = Vec::new();
        for o in &self.origins {
            if !paths.contains(&o.path) {
                paths.push(o.path.clone());
            }
        }
        paths
    }

    /// Has a symbol table or DWARF: names static functions, not only exported ones.
    pub fn has_full_names(&self) -> bool {
        FULL_NAMES.iter().any(|n| self.data(n).is_some())
    }

    /// What names this image's functions and where it came from: `DWARF (separate debug
    /// file /usr/lib/debug/…)`, `exported symbols only (.dynsym, embedded)`, `none`.
    pub fn names_from(&self) -> String {
        let Some(&section) = NAMING_SECTIONS.iter().find(|n| self.data(n).is_some()) else {
            return "none".into();
        };
        let what = match section {
            ".debug_info" => "DWARF",
            ".symtab" => "symbol table",
            _ => "exported symbols only (.dynsym)",
        };
        let origin = self.origins.iter().find(|o| o.section == section);
        let from = match origin.map(|o| (&o.source, &o.path)) {
            None => "embedded in the capture".to_owned(),
            Some((Source::LocalBinary, path)) => format!("local file {path}"),
            Some((Source::DebugFile, path)) => format!("separate debug file {path}"),
            Some((Source::DebuginfodCache, path)) => format!("debuginfod, cached at {path}"),
            Some((Source::Debuginfod(server), _)) => format!("debuginfod {server}"),
        };
        format!("{what}, {from}")
    }

    /// Files supplied sections the capture lacked.
    pub fn completed(&self) -> bool {
        !self.origins.is_empty()
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// A section's bytes, if present and non-empty.
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        self.section(name)
            .map(|s| s.data.as_slice())
            .filter(|d| !d.is_empty())
    }

    pub fn has_unwind_info(&self) -> bool {
        self.data(".eh_frame").is_some() || self.data(".debug_frame").is_some()
    }

    pub fn has_dwarf(&self) -> bool {
        self.data(".debug_info").is_some()
    }

    pub fn basename(&self) -> &str {
        basename(&self.path)
    }

    /// `avma - svma` for addresses of `mapping`, from the PT_LOAD segment that holds the
    /// mapping's file offset. None if no segment holds it.
    pub fn bias(&self, mapping: &Mapping, page_size: u64) -> Option<u64> {
        bias_for_mapping(&self.segments, mapping, page_size)
    }
}

/// `avma - svma` for `mapping`. A file offset `f` in segment `s` has the stated address
/// `f - s.offset + s.vaddr`, and the address `mapping.start + f - mapping.offset` in the
/// process; the difference does not depend on `f`.
pub fn bias_for_mapping(segments: &[Segment], mapping: &Mapping, page_size: u64) -> Option<u64> {
    let page_mask = !(page_size.max(1) - 1);
    let executable = mapping.perms.contains('x');
    let writable = mapping.perms.contains('w');
    let holds = |s: &&Segment| {
        let first = s.offset & page_mask;
        mapping.offset >= first && mapping.offset < s.offset.saturating_add(s.filesz.max(1))
    };
    // A file page can belong to two segments (the end of one, the start of the next):
    // the permissions tell which one a mapping is. Only executable mappings matter for
    // code addresses, and their segment is the one with PF_X.
    let is_x = |s: &&Segment| (s.flags & PF_X != 0) == executable;
    let is_w = |s: &&Segment| (s.flags & PF_W != 0) == writable;
    let segment = segments
        .iter()
        .filter(holds)
        .find(|s| is_x(s) && is_w(s))
        .or_else(|| segments.iter().filter(holds).find(is_x))
        .or_else(|| segments.iter().find(holds))?;
    Some(
        mapping
            .start
            .wrapping_sub(mapping.offset)
            .wrapping_add(segment.offset)
            .wrapping_sub(segment.vaddr),
    )
}

pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(vaddr: u64, offset: u64, filesz: u64, flags: u32) -> Segment {
        Segment {
            vaddr,
            offset,
            filesz,
            memsz: filesz,
            flags,
        }
    }

    fn map(start: u64, end: u64, offset: u64, perms: &str) -> Mapping {
        Mapping {
            start,
            end,
            offset,
            perms: perms.into(),
            ..Mapping::default()
        }
    }

    /// `gcc -pie` with `-z separate-code`: R, RX, R, RW segments.
    fn pie_segments() -> Vec<Segment> {
        vec![
            seg(0x0, 0x0, 0x6a0, 4),
            seg(0x1000, 0x1000, 0x1f5, 5),
            seg(0x2000, 0x2000, 0x134, 4),
            seg(0x3db8, 0x2db8, 0x258, 6),
        ]
    }

    #[test]
    fn pie_executable() {
        let segs = pie_segments();
        let text = map(0x5555_5555_5000, 0x5555_5555_6000, 0x1000, "r-xp");
        let bias = bias_for_mapping(&segs, &text, 4096).unwrap();
        assert_eq!(bias, 0x5555_5555_4000);
        // main at svma 0x1139 is at avma 0x555555555139.
        assert_eq!(0x1139 + bias, 0x5555_5555_5139);
        // The RW mapping, where vaddr and offset differ by a page, gives the same bias.
        let data = map(0x5555_5555_7000, 0x5555_5555_8000, 0x2000, "rw-p");
        assert_eq!(bias_for_mapping(&segs, &data, 4096), Some(bias));
    }

    #[test]
    fn shared_library_mapped_at_an_offset() {
        // libc.so.6: the RX segment starts at file offset 0x28000 == vaddr 0x28000.
        let segs = vec![
            seg(0x0, 0x0, 0x27f60, 4),
            seg(0x28000, 0x28000, 0x195f3d, 5),
            seg(0x1be000, 0x1be000, 0x4e0e0, 4),
            seg(0x20c8f0, 0x20b8f0, 0x6a20, 6),
        ];
        let text = map(0x7fff_f7dd_6000, 0x7fff_f7f6_c000, 0x28000, "r-xp");
        let bias = bias_for_mapping(&segs, &text, 4096).unwrap();
        assert_eq!(bias, 0x7fff_f7dd_6000 - 0x28000);
        // A mapping split by mprotect: starts in the middle of the segment.
        let tail = map(0x7fff_f7e0_0000, 0x7fff_f7f6_c000, 0x52000, "r-xp");
        assert_eq!(bias_for_mapping(&segs, &tail, 4096), Some(bias));
    }

    #[test]
    fn segment_vaddr_not_page_aligned_with_offset() {
        // lld-style layout: RX segment at vaddr 0x1640, offset 0x640 (congruent mod page).
        let segs = vec![seg(0x0, 0x0, 0x640, 4), seg(0x1640, 0x640, 0x300, 5)];
        let text = map(0x7f00_0000_1000, 0x7f00_0000_2000, 0x0, "r-xp");
        let bias = bias_for_mapping(&segs, &text, 4096).unwrap();
        // svma 0x1640 lives at file offset 0x640, i.e. avma start + 0x640.
        assert_eq!(0x1640 + bias, 0x7f00_0000_1640);
    }

    #[test]
    fn non_pie_executable_has_zero_bias() {
        let segs = vec![
            seg(0x400000, 0x0, 0x4f8, 4),
            seg(0x401000, 0x1000, 0x1a5, 5),
            seg(0x402000, 0x2000, 0x10c, 4),
            seg(0x403e10, 0x2e10, 0x220, 6),
        ];
        let text = map(0x401000, 0x402000, 0x1000, "r-xp");
        assert_eq!(bias_for_mapping(&segs, &text, 4096), Some(0));
        let data = map(0x403000, 0x404000, 0x2000, "rw-p");
        assert_eq!(bias_for_mapping(&segs, &data, 4096), Some(0));
    }

    #[test]
    fn offset_outside_every_segment() {
        let text = map(0x1000, 0x2000, 0x9000_0000, "r-xp");
        assert_eq!(bias_for_mapping(&pie_segments(), &text, 4096), None);
        assert_eq!(bias_for_mapping(&[], &text, 4096), None);
    }
}

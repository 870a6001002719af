//! Which addresses of an image its call frame information covers.
//!
//! framehop unwinds an address without CFI by frame-pointer heuristics, silently; in code
//! built without frame pointers (or in JIT code, or a static binary's `.iplt`) that skips
//! callers and yields a wrong stack. The unwinder asks this index first and stops, marking
//! the stack truncated, where no FDE covers a frame.

use gimli::{
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, UnwindSection,
};

use crate::image::Image;

/// Sorted, merged `[start, end)` ranges of SVMAs covered by an FDE.
#[derive(Debug, Default)]
pub struct CfiIndex {
    ranges: Vec<(u64, u64)>,
}

impl CfiIndex {
    pub fn of(image: &Image) -> CfiIndex {
        let mut ranges = Vec::new();
        let addr = |name: &str| image.section(name).map_or(0, |s| s.addr);
        if let Some(data) = image.data(".eh_frame") {
            let bases = BaseAddresses::default()
                .set_eh_frame(addr(".eh_frame"))
                .set_eh_frame_hdr(addr(".eh_frame_hdr"))
                .set_text(addr(".text"));
            collect(&EhFrame::new(data, LittleEndian), &bases, &mut ranges);
        }
        if let Some(data) = image.data(".debug_frame") {
            collect(
                &DebugFrame::new(data, LittleEndian),
                &BaseAddresses::default(),
                &mut ranges,
            );
        }
        CfiIndex::from_ranges(ranges)
    }

    pub fn from_ranges(mut ranges: Vec<(u64, u64)>) -> CfiIndex {
        ranges.retain(|(s, e)| s < e);
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        CfiIndex { ranges: merged }
    }

    pub fn covers(&self, svma: u64) -> bool {
        let i = self.ranges.partition_point(|&(s, _)| s <= svma);
        i > 0 && svma < self.ranges[i - 1].1
    }
}

/// Adds the range of every FDE that parses; a damaged entry ends the walk (what was found
/// before it still counts).
fn collect<'a, S>(section: &S, bases: &BaseAddresses, ranges: &mut Vec<(u64, u64)>)
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(S::cie_from_offset) {
                let start = fde.initial_address();
                ranges.push((start, start.saturating_add(fde.len())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_answer() {
        let idx = CfiIndex::from_ranges(vec![(30, 40), (10, 20), (20, 25), (50, 50)]);
        assert_eq!(idx.ranges, vec![(10, 25), (30, 40)]);
        assert!(idx.covers(10) && idx.covers(24) && idx.covers(30));
        assert!(!idx.covers(9) && !idx.covers(25) && !idx.covers(40) && !idx.covers(50));
        assert!(!CfiIndex::default().covers(0));
    }

    #[test]
    fn this_test_binary_is_covered_at_its_own_code() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let binary = lrec_format::elf::binary_record(
            &exe.to_string_lossy(),
            &data,
            lrec_format::elf::DebugInfo::None,
        );
        let idx = CfiIndex::of(&Image::from_binary(&binary));
        assert!(idx.ranges.len() > 100, "{} ranges", idx.ranges.len());
        let text = binary.section(".text").unwrap();
        // Most of .text is covered; the last byte after all code is not.
        assert!(idx.covers(idx.ranges[idx.ranges.len() / 2].0));
        assert!(!idx.covers(text.addr + text.size + 0x100_0000));
    }
}

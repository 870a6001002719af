//! A process's memory as a heap snapshot copied it: regions in address order, read by
//! address. Reads outside the copy answer `None`: the walkers treat such a pointer as
//! no object (a live copy may hold pointers to memory that changed meanwhile).

use lrec_format::LuaHeapMemory;

#[derive(Default)]
pub struct Memory {
    /// (start, bytes), sorted by start; adjacent pieces merged.
    regions: Vec<(u64, Vec<u8>)>,
}

impl Memory {
    /// The memory of a snapshot from its pieces, in any order.
    pub fn from_pieces(mut pieces: Vec<LuaHeapMemory>) -> Memory {
        pieces.sort_by_key(|p| p.start);
        let mut regions: Vec<(u64, Vec<u8>)> = Vec::new();
        for p in pieces {
            match regions.last_mut() {
                Some((start, data)) if *start + data.len() as u64 == p.start => {
                    data.extend_from_slice(&p.data)
                }
                _ => regions.push((p.start, p.data)),
            }
        }
        Memory { regions }
    }

    /// Bytes copied.
    pub fn len(&self) -> u64 {
        self.regions.iter().map(|(_, d)| d.len() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The `len` bytes at `addr`, when the copy holds all of them.
    pub fn bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let i = self
            .regions
            .partition_point(|(s, _)| *s <= addr)
            .checked_sub(1)?;
        let (start, data) = &self.regions[i];
        let off = usize::try_from(addr - start).ok()?;
        data.get(off..off.checked_add(len)?)
    }

    pub fn u8(&self, addr: u64) -> Option<u8> {
        self.bytes(addr, 1).map(|b| b[0])
    }

    pub fn u16(&self, addr: u64) -> Option<u16> {
        self.bytes(addr, 2)
            .map(|b| u16::from_le_bytes(b.try_into().unwrap()))
    }

    pub fn u32(&self, addr: u64) -> Option<u32> {
        self.bytes(addr, 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }

    pub fn u64(&self, addr: u64) -> Option<u64> {
        self.bytes(addr, 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_merged_and_read_by_address() {
        let piece = |start, data: &[u8]| LuaHeapMemory {
            pid: 1,
            snapshot: 0,
            start,
            data: data.to_vec(),
        };
        let m = Memory::from_pieces(vec![
            piece(0x1004, &[5, 6, 7, 8]),
            piece(0x1000, &[1, 2, 3, 4]),
            piece(0x2000, &[9]),
        ]);
        assert_eq!(m.u64(0x1000), Some(0x0807060504030201));
        assert_eq!(m.u32(0x1006), None, "runs past the region");
        assert_eq!(m.u8(0x2000), Some(9));
        assert_eq!(m.u8(0x1fff), None);
        assert_eq!(m.len(), 9);
    }
}

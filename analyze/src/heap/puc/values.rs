//! Reading PUC Lua values out of a snapshot's copy: pointers, tagged values, object
//! headers, strings and tables (their array and node parts, fields by name, weakness).

use super::{Heap, Parts, Tag, MAX_LIST, MAX_NAME};

impl Heap<'_> {
    pub(super) fn ptr(&self, addr: u64) -> u64 {
        self.mem.u64(addr).unwrap_or(0)
    }

    pub(super) fn int(&self, addr: u64) -> u64 {
        self.mem.u32(addr).unwrap_or(0) as u64
    }

    /// The type of a value's tag (a TValue's, or a 5.4 node key's), if collectable.
    pub(super) fn tag_of(&self, tt: u32) -> Option<Tag> {
        let ty = match self.r.minor {
            1 => (4..=8).contains(&tt).then_some(tt)?,
            _ => (tt & 0x40 != 0).then_some(tt & 0x3f)?,
        };
        Some(match ty {
            4 | 20 => Tag::Str,
            5 => Tag::Table,
            6 => Tag::LClosure,
            38 => Tag::CClosure,
            7 => Tag::Udata,
            8 => Tag::Thread,
            _ => return None,
        })
    }

    /// A TValue's collectable object.
    pub(super) fn tv_gc(&self, addr: u64) -> Option<(Tag, u64)> {
        let tt = match self.r.minor {
            4.. => self.mem.u8(addr + 8)? as u32,
            _ => self.mem.u32(addr + 8)?,
        };
        let tag = self.tag_of(tt)?;
        let p = self.mem.u64(addr)?;
        (p != 0).then_some((tag, p))
    }

    /// The type of the object at `addr`, from its header.
    pub(super) fn header_tag(&self, addr: u64) -> Option<Tag> {
        let tt = self.mem.u8(addr + 8)?;
        let r = &self.r;
        Some(match (r.minor, tt) {
            (_, 4) => Tag::Str,
            (2.., 20) => Tag::Str,
            (_, 5) => Tag::Table,
            (1, 6) => match self.mem.u8(addr + r.cl_isc?)? {
                0 => Tag::LClosure,
                _ => Tag::CClosure,
            },
            (_, 6) => Tag::LClosure,
            (2.., 38) => Tag::CClosure,
            (_, 7) => Tag::Udata,
            (_, 8) => Tag::Thread,
            (1..=3, 9) | (4.., 10) => Tag::Proto,
            (1..=2, 10) | (4.., 9) => Tag::Upval,
            _ => return None,
        })
    }

    pub(super) fn str_len(&self, s: u64) -> Option<u64> {
        match self.r.s_shrlen {
            Some(off) if self.mem.u8(s + 8)? == 4 => self.mem.u8(s + off).map(u64::from),
            _ => self.mem.u64(s + self.r.s_len),
        }
    }

    /// A string's size as its release frees it (5.5: a long string's kind decides).
    pub(super) fn str_size(&self, s: u64) -> Option<u64> {
        let (r, len) = (&self.r, self.str_len(s)?);
        if r.minor < 5 || self.mem.u8(s + 8)? == 4 {
            return Some(r.s_data + len + 1);
        }
        // luaS_sizelngstr: LSTRREG holds its bytes after `falloc`'s offset; LSTRFIX
        // (fixed external bytes) stops there; LSTRMEM keeps falloc and ud.
        Some(match self.mem.u8(s + r.s_shrlen?)? as i8 {
            -1 => r.s_data + 8 + len + 1,
            -2 => r.s_data + 8,
            _ => r.s_data + 24,
        })
    }

    pub(super) fn string(&self, s: u64) -> Option<String> {
        let len = self.str_len(s)? as usize;
        let mut data = s + self.r.s_data;
        if self.r.minor == 5 && self.mem.u8(s + 8)? == 20 {
            // 5.5's long strings point to their bytes.
            data = self.ptr(data);
        }
        let b = self.mem.bytes(data, len.min(MAX_NAME))?;
        Some(String::from_utf8_lossy(b).into_owned())
    }

    /// Slot `k` of a table's array part (5.5: values below `array`, tags above it).
    pub(super) fn array_slot(&self, array: u64, k: u64) -> Option<(Tag, u64)> {
        if self.r.minor < 5 {
            return self.tv_gc(array + 16 * k);
        }
        let tag = self.tag_of(self.mem.u8(array + 4 + k)? as u32)?;
        let p = self.mem.u64(array - 8 * (k + 1))?;
        (p != 0).then_some((tag, p))
    }

    /// Bytes of a table's array part of `asize` slots, and where they start.
    pub(super) fn array_bytes(&self, array: u64, asize: u64) -> (u64, u64) {
        match (self.r.minor, asize) {
            (_, 0) => (array, 0),
            // concretesize: the values, an unsigned, the tags.
            (5, n) => (array.wrapping_sub(8 * n), 9 * n + 4),
            (_, n) => (array, 16 * n),
        }
    }

    /// The array and node parts of table `t`.
    pub(super) fn table_parts(&self, t: u64) -> Option<Parts> {
        let r = &self.r;
        let mut asize = self.mem.u32(t + r.t_sizearray)? as u64;
        if r.minor == 4 && self.mem.u8(t + r.t_flags)? & 0x80 != 0 && !asize.is_power_of_two() {
            // luaH_realasize: 'alimit' is not the size; the size is the next power of 2.
            asize = asize.next_power_of_two();
        }
        let lsizenode = self.mem.u8(t + r.t_lsizenode)? as u32;
        let node = self.ptr(t + r.t_node);
        let nodes = 1u64 << lsizenode.min(40);
        // The shared dummy node is static (not in the heap copy); 5.3 and 5.4 mark it
        // with lastfree == NULL, 5.5 with a flag.
        let allocated = match r.minor {
            5 => self.mem.u8(t + r.t_flags)? & (1 << 6) == 0,
            3.. => self.ptr(t + r.t_lastfree) != 0,
            _ => self.mem.u8(node).is_some(),
        };
        // Parts the copy does not hold (a damaged or changing heap) are not read.
        let array = self.ptr(t + r.t_array);
        let readable = |at: u64, len: u64| {
            len == 0 || (len <= 64 * MAX_LIST as u64 && self.mem.bytes(at, len as usize).is_some())
        };
        let (start, len) = self.array_bytes(array, asize);
        let held = readable(start, len) && (!allocated || readable(node, r.node_size * nodes));
        Some(Parts {
            held,
            array,
            asize,
            node,
            nodes,
            allocated,
        })
    }

    /// A node's key, when collectable.
    pub(super) fn node_key(&self, n: u64) -> Option<(Tag, u64)> {
        let r = &self.r;
        let tt = match r.minor {
            4.. => self.mem.u8(n + r.node_key_tt)? as u32,
            _ => self.mem.u32(n + r.node_key_tt)?,
        };
        let tag = self.tag_of(tt)?;
        Some((tag, self.mem.u64(n + r.node_key)?))
    }

    pub(super) fn field(&self, t: u64, key: &str) -> Option<u64> {
        let Parts {
            held,
            node,
            nodes,
            allocated,
            ..
        } = self.table_parts(t)?;
        if !allocated || !held {
            return None;
        }
        (0..nodes).find_map(|i| {
            let n = node + i * self.r.node_size;
            let (Tag::Str, k) = self.node_key(n)? else {
                return None;
            };
            (self.string(k)? == key).then_some(())?;
            self.tv_gc(n).map(|(_, v)| v)
        })
    }

    pub(super) fn weakness(&self, t: u64) -> (bool, bool) {
        let mt = self.ptr(t + self.r.t_meta);
        if mt == 0 {
            return (false, false);
        }
        let mode = self
            .field(mt, "__mode")
            .and_then(|s| self.string(s))
            .unwrap_or_default();
        (mode.contains('k'), mode.contains('v'))
    }
}

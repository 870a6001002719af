//! What a LuaJIT VM allocates for itself and its collector counts: the main thread's
//! block (GG_State), each thread's lua_State, the string interning table, the temporary
//! buffer and the FFI's C type state and table; and a cdata's size by its C type.

use super::{Heap, Kind, Object, GCT_STR};

/// sizeof(CTState) in upstream 2.1 (forks differ by a few dozen bytes).
const CTSTATE_SIZE: u64 = 464;
/// Bytes of GG_State past the dispatch table (bcff: GG_NUM_ASMFF instructions).
const GG_TAIL: u64 = 57 * 4;

impl Heap<'_> {
    /// The FFI's C type state (g->ctype_state).
    pub(super) fn ctype_state(&self) -> Option<u64> {
        let at = self.f.ctype_state;
        self.gcref(self.g + at.unwrap_or(self.f.jit_base + self.o.refsize))
    }

    /// The string interning table (g->str: its slot array and mask), which stock builds
    /// keep 32 bytes before vmstate and forks elsewhere between the collector's state and
    /// vmstate: the pointer and mask there whose first chains (up to 64) hold strings only.
    pub(super) fn string_table(&self) -> Option<(u64, u64)> {
        let end = self.g + self.f.vmstate;
        let stock = end.checked_sub(32)?;
        let first = self.g + 16 + 8 * self.o.refsize;
        let others = (0..end.saturating_sub(16).saturating_sub(first) / 4).map(|i| first + 4 * i);
        std::iter::once(stock)
            .chain(others.filter(|&at| at != stock))
            .find_map(|at| self.strings_at(at))
    }

    /// The slot array and mask at `at` if they read as the interning table.
    fn strings_at(&self, at: u64) -> Option<(u64, u64)> {
        let tab = self.mem.u64(at)?;
        let mask = u64::from(self.mem.u32(at + 8)?);
        let num = u64::from(self.mem.u32(at + 12)?);
        if tab == 0 || !(mask + 1).is_power_of_two() || mask >= 1 << 28 || num > 8 * (mask + 1) {
            return None;
        }
        let mut heads = (0..=mask)
            .filter_map(|i| self.gcref(tab + i * self.o.refsize).map(|h| h & !1))
            .filter(|&h| h != 0)
            .take(64)
            .peekable();
        heads.peek()?;
        heads
            .all(|h| self.gct(h) == Some(GCT_STR))
            .then_some((tab, mask))
    }

    /// sizeof(lua_State).
    pub(super) fn lua_state_size(&self) -> u64 {
        self.f.l_size
    }

    /// The main thread's block, GG_State: up to the end of its dispatch table (the
    /// words from its start on that point near its first, into the interpreter).
    pub(super) fn vm_state_size(&self) -> u64 {
        let dispatch = self.g + self.f.g2disp;
        let Some(first) = self.mem.u64(dispatch) else {
            return self.lua_state_size();
        };
        let mut n = 0;
        while n < 4096
            && self
                .mem
                .u64(dispatch + 8 * n)
                .is_some_and(|w| w.abs_diff(first) < 1 << 20)
        {
            n += 1;
        }
        dispatch + 8 * n + GG_TAIL - self.main
    }

    /// What the collector counts outside objects that can be found: the temporary string
    /// buffer (g->tmpbuf) and the FFI's C type state and table.
    pub(super) fn vm_buffers(&self) -> Vec<Object> {
        let mut out = Vec::new();
        let tmpbuf = self.g + self.f.mainthref + self.o.refsize;
        if let (Some(e), Some(b)) = (self.mem.u64(tmpbuf + 8), self.mem.u64(tmpbuf + 16)) {
            if b != 0 && e > b && e - b < 1 << 32 {
                out.push(Object {
                    addr: b,
                    kind: Kind::Vm,
                    size: e - b,
                });
            }
        }
        let cts = self.ctype_state().unwrap_or(0);
        if cts != 0 {
            out.push(Object {
                addr: cts,
                kind: Kind::Vm,
                size: CTSTATE_SIZE,
            });
            let tab = self.mem.u64(cts).unwrap_or(0);
            let sizetab = self.mem.u32(cts + 12).unwrap_or(0) as u64;
            if tab != 0 && sizetab < 1 << 24 {
                out.push(Object {
                    addr: tab,
                    kind: Kind::Vm,
                    size: sizetab * self.o.ctype_size,
                });
            }
        }
        out
    }

    /// A cdata's size as lj_cdata_free frees it: a variable-length one's allocation, else
    /// its header and its C type's size (a pointer's where the type has none).
    pub(super) fn cdata_size(&self, cd: u64) -> Option<u64> {
        let o = self.o;
        if self.mem.u8(cd + o.gct - 1)? & 0x80 != 0 {
            return self.mem.u32(cd - 4).map(u64::from);
        }
        let cts = self.ctype_state()?;
        let tab = self.mem.u64(cts)?;
        let mut id = self.mem.u16(cd + o.cd_ctypeid)? as u64;
        for _ in 0..16 {
            let ct = tab + id * o.ctype_size;
            let info = self.mem.u32(ct)?;
            let ty = info >> 28;
            // CT_ATTRIB: look through to the type it qualifies.
            if ty == 8 {
                id = (info & 0xffff) as u64;
                continue;
            }
            let size = match ty <= 5 {
                true => self.mem.u32(ct + 4)? as u64,
                false => 8,
            };
            return Some(o.cd_size + size);
        }
        None
    }
}

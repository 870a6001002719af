//! Naming a sample's Lua frames: each prototype is read once per process (from BPF's copy
//! taken with the sample, and the live process for its callees' names), given an id and
//! recorded; its later frames carry the id.

use lrec_format::{lua_frame_kind, LuaFrame, LuaProto, Record};

use super::{luajit, puc, LuaVms, ProtoKey};
use crate::raw::{RawLuaFrame, RawLuaProto, RawPucConfig};
use lrec_inspect::lua::puc::Layout as PucLayout;

impl LuaVms {
    pub(super) fn frame(
        &mut self,
        f: &RawLuaFrame,
        proto: impl FnOnce(&mut Self, &RawLuaFrame) -> u32,
    ) -> LuaFrame {
        let (kind, function, address) = match f.ffid {
            0 => (lua_frame_kind::LUA, proto(self, f), 0),
            1 => (lua_frame_kind::C, u32::MAX, f.ptr),
            _ => (lua_frame_kind::BUILTIN, u32::MAX, f.ptr),
        };
        LuaFrame {
            kind,
            builtin: f.ffid,
            link: f.link,
            function,
            address,
            pos: f.pos,
            cframe: f.cframe,
        }
    }

    /// The id of a frame's proto, reading and writing it the first time. A proto freed
    /// and replaced at the same address differs in its chunk name, lines or size, and
    /// gets a new id; one that cannot be read gets `u32::MAX`.
    pub(super) fn proto(
        &mut self,
        pid: u32,
        layout: &lrec_inspect::lua::luajit::Offsets,
        f: &RawLuaFrame,
    ) -> u32 {
        let key = proto_key!(pid, f);
        if let Some(id) = self.protos.get(&key) {
            return id.unwrap_or(u32::MAX);
        }
        // BPF's copy was taken when the sample ran the proto: it names it. The live
        // proto adds the names of callees, if it still is the same code (its chunk name
        // and lines may since belong to another: memory is reused after GC).
        let mem = self.luajit.get(&pid).and_then(|p| p.mem.as_ref());
        let live = mem.and_then(|m| luajit::read_proto(m, layout, f));
        let read = match self.copied.remove(&key).map(|c| luajit_copy(&c)) {
            Some(copy) => Some(match live {
                Some(l) if l.chunkname == copy.chunkname && l.lines == copy.lines => l,
                _ => copy,
            }),
            None => live,
        };
        match read {
            Some(read) => self.new_proto(key, Some(read)),
            None => self.reserve(key, false),
        }
    }

    /// The id of a PUC Lua frame's proto, from BPF's copy (see [`Self::proto`]).
    pub(super) fn puc_proto(&mut self, pid: u32, rel: &PucLayout, f: &RawLuaFrame) -> u32 {
        let key = proto_key!(pid, f);
        if let Some(id) = self.protos.get(&key) {
            return id.unwrap_or(u32::MAX);
        }
        let mem = self.puc.get(&pid).and_then(|p| p.mem.as_ref());
        let Some(c) = self.copied.remove(&key) else {
            return self.reserve(key, true);
        };
        let mut p = puc_copy(&c, rel);
        // The callees' names, from the live proto if it still is this one.
        let head = &c.code_head[..(c.code_words as usize).min(c.code_head.len())];
        if let Some(code) = mem.and_then(|m| puc::read_code(m, rel, f, &p.chunkname, head)) {
            p.callee_names = crate::lua::puc_names::callee_names(&code);
        }
        self.new_proto(key, Some(p))
    }

    /// A frame's proto whose copy has not reached lrec yet (BPF's two rings are read in
    /// turn, and a sample on one CPU may name a proto another CPU's sample is still
    /// sending): its id now, its record when the copy comes ([`Self::late_copy`]).
    fn reserve(&mut self, key: ProtoKey, puc: bool) -> u32 {
        let id = self.next_proto;
        self.next_proto += 1;
        self.late.insert(key, (id, puc));
        self.protos.insert(key, Some(id));
        id
    }

    /// BPF's copy `c` of a proto that frames already named by a reserved id: its record,
    /// written now (lanalyze reads a capture's protos before its frames), if frames wait
    /// for it.
    pub(super) fn late_copy(&mut self, key: &ProtoKey, c: &RawLuaProto) {
        let Some((id, puc)) = self.late.remove(key) else {
            return;
        };
        let proto = match puc {
            false => Some(luajit_copy(c)),
            true => self.puc.get(&key.pid).and_then(|p| match &p.detection {
                super::Detection::Puc(rel) => Some(puc_copy(c, rel)),
                _ => None,
            }),
        };
        if let Some(mut proto) = proto.filter(|p| self.is_named(p)) {
            proto.pid = key.pid;
            // Frames name `id` already: its record is written even if another id has
            // this content.
            self.by_content.entry(proto.clone()).or_insert(id);
            proto.id = id;
            self.records.push(Record::LuaProto(proto));
        }
    }

    /// Whether a proto's chunk name reads as a name; the summary counts those that do not.
    fn is_named(&mut self, p: &LuaProto) -> bool {
        let ok = luajit::is_name(p.chunkname.as_bytes()) && !p.chunkname.contains('\u{fffd}');
        self.unnamed += u64::from(!ok);
        ok
    }

    /// Gives a proto read for `key` its id and queues its record. A chunk name that does
    /// not read as a name (control bytes, invalid UTF-8: memory read with a wrong layout,
    /// or freed) is no name: the frame stays unnamed, and the summary counts it.
    fn new_proto(&mut self, key: ProtoKey, read: Option<LuaProto>) -> u32 {
        let read = read.filter(|p| self.is_named(p));
        let id = read.map(|mut proto| {
            proto.pid = key.pid;
            self.id_of(proto)
        });
        self.protos.insert(key, id);
        id.unwrap_or(u32::MAX)
    }
}

impl LuaVms {
    /// The id of a proto read (its id 0): that of a record with the same content written
    /// before, else a new one, its record queued.
    fn id_of(&mut self, proto: LuaProto) -> u32 {
        if let Some(&id) = self.by_content.get(&proto) {
            return id;
        }
        let id = self.next_proto;
        self.next_proto += 1;
        let mut record = proto.clone();
        record.id = id;
        self.records.push(Record::LuaProto(record));
        self.by_content.insert(proto, id);
        id
    }
}

/// A LuaJIT proto from BPF's copy.
fn luajit_copy(c: &RawLuaProto) -> LuaProto {
    let raw = &c.lineinfo[..(c.lineinfo_len as usize).min(c.lineinfo.len())];
    copied_proto(c, luajit::lines(raw, c.firstline, c.numline, c.sizebc))
}

/// A PUC Lua proto from BPF's copy (the frame's numline is lastlinedefined).
fn puc_copy(c: &RawLuaProto, rel: &PucLayout) -> LuaProto {
    let mut p = copied_proto(c, puc::lines(c, &RawPucConfig::new(rel)));
    p.numline = (c.numline as i32 - c.firstline).max(0) as u32;
    p
}

/// A proto from BPF's copy: its chunk name, and its lines as the VM's decoder read them
/// from the copied line table (no callee names).
fn copied_proto(c: &RawLuaProto, lines: Vec<u32>) -> LuaProto {
    let name_len = (c.chunkname_len as usize).min(c.name.len());
    LuaProto {
        pid: 0,
        id: 0,
        chunkname: String::from_utf8_lossy(&c.name[..name_len]).into_owned(),
        firstline: c.firstline,
        numline: c.numline,
        lines,
        callee_names: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ptr: u64, chunkname: u64) -> ProtoKey {
        ProtoKey {
            pid: 7,
            ptr,
            chunkname,
            firstline: 3,
            numline: 2,
            sizebc: 9,
            name_id: 1,
        }
    }

    fn proto(chunkname: &str) -> LuaProto {
        LuaProto {
            chunkname: chunkname.into(),
            firstline: 3,
            numline: 2,
            lines: vec![3, 4, 5],
            ..LuaProto::default()
        }
    }

    #[test]
    fn the_same_code_at_other_addresses_is_one_proto_written_once() {
        let mut vms = LuaVms::default();
        let a = vms.new_proto(key(0x1000, 0x2000), Some(proto("@a.lua")));
        // The next VM's copy of the chunk, elsewhere.
        let again = vms.new_proto(key(0x5000, 0x6000), Some(proto("@a.lua")));
        // Other code where the first one was.
        let b = vms.new_proto(key(0x1000, 0x2000 + 8), Some(proto("@b.lua")));
        assert_eq!(a, again);
        assert_ne!(a, b);
        let records = vms.take_records();
        assert_eq!(records.len(), 2, "{records:?}");
    }

    #[test]
    fn a_late_copy_writes_the_id_frames_named() {
        let mut vms = LuaVms::default();
        let k = key(0x1000, 0x2000);
        let reserved = vms.reserve(k, false);
        // A copy as BPF sends it: up to its line table's end (none here).
        let short = [0u8; std::mem::offset_of!(RawLuaProto, lineinfo)];
        let mut c = RawLuaProto::decode(&short).unwrap();
        (
            c.tgid,
            c.ptr,
            c.chunkname,
            c.firstline,
            c.numline,
            c.sizebc,
            c.name_id,
        ) = (7, 0x1000, 0x2000, 3, 2, 9, 1);
        c.name[..6].copy_from_slice(b"@a.lua");
        c.chunkname_len = 6;
        vms.late_copy(&k, &c);
        let records = vms.take_records();
        assert!(
            matches!(&records[..], [Record::LuaProto(p)] if p.id == reserved && p.chunkname == "@a.lua"),
            "{records:?}"
        );
        // The same code read later gets that id.
        let mut p = luajit_copy(&c);
        p.pid = 7;
        assert_eq!(vms.id_of(p), reserved);
    }
}

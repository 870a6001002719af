//! Rust mirror of ebpf/sample.h, the one ABI shared with the BPF program.

use std::borrow::Cow;

use lrec_format::{sample_flags, Regs, Sample, ThreadState};

mod vm_config;
pub use vm_config::*;

pub const MAX_STACK: u32 = 64 * 1024;
pub const MAX_KSTACK: usize = 127;

/// `struct lrec_sample`; `stack_len` bytes of user stack follow it in the ring record.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawSample {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub flags: u32,
    pub stack_len: u32,
    pub kstack_len: u32,
    pub lua_offset: u32,
    pub lua_len: u32,
    /// `struct lrec_regs`.
    pub regs: Regs,
    /// `KIND_CPU` or `KIND_OFF_CPU`.
    pub kind: u32,
    pub off_state: u32,
    pub off_start: u64,
    pub off_ns: u64,
    pub kstack: [u64; MAX_KSTACK],
}

/// `lrec_sample.kind`.
pub const KIND_OFF_CPU: u32 = 1;

/// A blocked interval: `(start_ns, duration_ns, state)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffInterval {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub state: u32,
}

/// `struct lrec_thread_state`, followed by `kstack_len` kernel addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawThreadState {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub state: u32,
    pub exit_state: u32,
    pub on_cpu: u32,
    pub syscall: i32,
    pub syscall_ns: u64,
    pub off_since: u64,
    pub user_ip: u64,
    pub user_sp: u64,
    pub kstack_len: u32,
    pub pad: u32,
}

impl RawThreadState {
    /// Decodes the records one read of the iterator gave: `(time_ns, states)`.
    pub fn decode_all(mut bytes: &[u8]) -> Result<Vec<(u64, ThreadState)>, RawError> {
        let hdr = std::mem::size_of::<RawThreadState>();
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let err = |what| RawError {
                len: bytes.len(),
                what,
            };
            let raw: RawThreadState =
                read_pod(bytes, 0).ok_or_else(|| err("short thread state"))?;
            let k = (raw.kstack_len as usize).min(MAX_KSTACK);
            let kernel_stack = (0..k)
                .map(|i| read_pod::<u64>(bytes, hdr + i * 8))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| err("kernel stack runs past the record"))?;
            out.push((
                raw.time_ns,
                ThreadState {
                    pid: raw.pid,
                    tid: raw.tid,
                    state: raw.state,
                    exit_state: raw.exit_state,
                    on_cpu: raw.on_cpu != 0,
                    syscall: u32::try_from(raw.syscall).ok(),
                    syscall_since_ns: raw.syscall_ns,
                    off_cpu_since_ns: raw.off_since,
                    user_ip: raw.user_ip,
                    kernel_stack,
                },
            ));
            bytes = &bytes[hdr + k * 8..];
        }
        Ok(out)
    }
}

/// One ring-buffer record, decoded (its Lua frames borrowed from the record's bytes where
/// they lie aligned, as the ring buffer lays them).
pub struct Decoded<'a> {
    pub sample: Sample,
    pub lua: Option<LuaWalk<'a>>,
    /// Set for an off-CPU record.
    pub off_cpu: Option<OffInterval>,
}

// The flag bits are the format's: one meaning on both sides.
const _: () = assert!(sample_flags::KERNEL_MODE == 1);
const _: () = assert!(sample_flags::STACK_FAULTED == 2);
const _: () = assert!(sample_flags::NO_USER_REGS == 4);

/// Why a ring-buffer record could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("malformed sample record of {len} bytes from BPF: {what}")]
pub struct RawError {
    pub len: usize,
    pub what: &'static str,
}

/// `struct lrec_lua_stack`, followed by `nframes` [`RawLuaFrame`]s.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawLuaStack {
    pub g: u64,
    pub l: u64,
    pub cframe: u64,
    pub vmstate: i32,
    pub nframes: u16,
    pub flags: u16,
    /// Call sites remembered in earlier samples whose proto, read in this one, was no
    /// longer the one remembered (read in full).
    pub stale: u32,
    pub pad: u32,
    /// The walk's run of frames from its CPU's memo, or the memo it made
    /// (`lua::memo`, ebpf/luajit_memo.h).
    pub memo_seq: u64,
    pub memo_at: u16,
    pub memo_from: u16,
    pub memo_len: u16,
    pub memo: u8,
    pub memo_pad: u8,
}

/// `struct lrec_lua_frame`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawLuaFrame {
    pub ptr: u64,
    pub chunkname: u64,
    pub cframe: u64,
    pub firstline: i32,
    pub numline: u32,
    pub sizebc: u32,
    pub pos: u32,
    pub ffid: u8,
    pub link: u8,
    /// [`FRAME_FROM_SITE`] or 0.
    pub check: u8,
    pub pad: u8,
    /// The chunk name's identity (a new name at a freed one's address): LuaJIT its string
    /// id and hash, PUC Lua its length and last bytes.
    pub name_id: u32,
}

// No padding: its bytes are its fields (frames_of borrows them; reuse.rs compares them).
const _: () = assert!(std::mem::size_of::<RawLuaFrame>() == 3 * 8 + 4 * 4 + 4 + 4);

pub const LUA_CHUNKNAME: usize = 512;
pub const LUA_LINEINFO: usize = 4096;
/// PUC Lua: the instructions BPF copies from a proto's code ([`RawLuaProto::code_head`]).
pub const LUA_CODE_HEAD: usize = 7;
/// PUC Lua 5.4+: where the absolute lines begin in [`RawLuaProto::lineinfo`].
pub const PUC_ABS_AT: usize = 3072;

// `lrec_lua_frame.link` bits of PUC Lua frames are the format's.
const _: () = assert!(lrec_format::puc_link::FRESH == 1);
const _: () = assert!(lrec_format::puc_link::TAIL == 2);

/// `struct lrec_lua_proto`: a proto's chunk name and line table, copied by BPF.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawLuaProto {
    pub tgid: u32,
    pub chunkname_len: u32,
    pub ptr: u64,
    pub chunkname: u64,
    pub firstline: i32,
    pub numline: u32,
    pub sizebc: u32,
    pub lineinfo_len: u32,
    /// PUC Lua 5.4+: bytes of `abslineinfo` copied at [`PUC_ABS_AT`] in `lineinfo`.
    pub abs_len: u32,
    pub name_id: u32,
    /// PUC Lua: instructions copied into `code_head`.
    pub code_words: u32,
    /// PUC Lua: the code's first instructions when the sample ran it.
    pub code_head: [u32; LUA_CODE_HEAD],
    pub name: [u8; LUA_CHUNKNAME],
    pub lineinfo: [u8; LUA_LINEINFO],
}

impl RawLuaProto {
    /// BPF sends a copy up to the last byte of its line table it filled
    /// (ebpf/lua_protos.h, lua_proto_commit): the rest reads as zeros.
    pub fn decode(bytes: &[u8]) -> Option<RawLuaProto> {
        let size = std::mem::size_of::<RawLuaProto>();
        if bytes.len() < std::mem::offset_of!(RawLuaProto, lineinfo) || bytes.len() > size {
            return None;
        }
        let mut whole = [0u8; std::mem::size_of::<RawLuaProto>()];
        whole[..bytes.len()].copy_from_slice(bytes);
        read_pod(&whole, 0)
    }
}

pub const MAX_LUA_RANGES: usize = 4;
/// `RawLuaFrame::check`: the frame's proto fields (`ptr` to `name_id`) come from a call
/// site BPF remembered in an earlier sample, proved in this one: the proto at `ptr`, read
/// in the sample, has them (`LREC_FRAME_FROM_SITE`).
pub const FRAME_FROM_SITE: u8 = 1;
// The Lua flag bits are the format's too.
const _: () = assert!(lrec_format::lua_flags::TRUNCATED == 1);
const _: () = assert!(lrec_format::lua_flags::BROKEN == 2);
const _: () = assert!(lrec_format::lua_flags::JIT_MAPPED == 4);
const _: () = assert!(lrec_format::lua_flags::JIT_UNMAPPED == 8);
const _: () = assert!(lrec_format::LUA_LINK_JIT == 0x80);

/// A sample's Lua stack as BPF walked it.
#[derive(Debug, Clone, Default)]
pub struct LuaWalk<'a> {
    pub header: RawLuaStack,
    pub frames: Cow<'a, [RawLuaFrame]>,
}

/// The frames whose bytes are `all` (a whole number of them): borrowed when aligned, as
/// the ring buffer's 8-byte aligned records lay them, else copied.
fn frames_of(all: &[u8]) -> Cow<'_, [RawLuaFrame]> {
    let n = all.len() / std::mem::size_of::<RawLuaFrame>();
    if all
        .as_ptr()
        .align_offset(std::mem::align_of::<RawLuaFrame>())
        == 0
    {
        // SAFETY: `all` is aligned for RawLuaFrame and holds n of them; RawLuaFrame is
        // plain old data without padding, valid for any bytes; the slice borrows `all`.
        return Cow::Borrowed(unsafe { std::slice::from_raw_parts(all.as_ptr().cast(), n) });
    }
    Cow::Owned(
        (0..n)
            .map_while(|i| read_pod(all, i * std::mem::size_of::<RawLuaFrame>()))
            .collect(),
    )
}

fn read_pod<T: Copy>(bytes: &[u8], at: usize) -> Option<T> {
    let b = bytes.get(at..at.checked_add(std::mem::size_of::<T>())?)?;
    // SAFETY: T is a plain-old-data mirror of a C struct and `b` is long enough;
    // read_unaligned does not need alignment.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) })
}

impl RawSample {
    /// Decodes one ring-buffer record into a capture sample, its Lua stack, if any, and
    /// its blocked interval for an off-CPU record.
    pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, RawError> {
        let hdr = std::mem::size_of::<RawSample>();
        let err = |what| RawError {
            len: bytes.len(),
            what,
        };
        if bytes.len() < hdr {
            return Err(err("shorter than its header"));
        }
        // SAFETY: RawSample is plain old data and the slice is long enough; the ring
        // buffer gives 8-byte aligned records but read_unaligned does not rely on it.
        let raw: RawSample = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let stack = bytes
            .get(hdr..hdr + raw.stack_len as usize)
            .ok_or_else(|| err("stack_len runs past the record"))?;
        let k = (raw.kstack_len as usize).min(MAX_KSTACK);
        let lua = match raw.lua_len {
            0 => None,
            _ => {
                let at = hdr + raw.lua_offset as usize;
                let header: RawLuaStack =
                    read_pod(bytes, at).ok_or_else(|| err("Lua stack runs past the record"))?;
                let first = at + std::mem::size_of::<RawLuaStack>();
                let n = header.nframes as usize;
                let all = bytes
                    .get(first..first + n * std::mem::size_of::<RawLuaFrame>())
                    .ok_or_else(|| err("Lua frames run past the record"))?;
                Some(LuaWalk {
                    header,
                    frames: frames_of(all),
                })
            }
        };
        let sample = Sample {
            time_ns: raw.time_ns,
            pid: raw.pid,
            tid: raw.tid,
            cpu: raw.cpu,
            flags: raw.flags,
            regs: raw.regs,
            user_stack: stack.to_vec(),
            kernel_stack: raw.kstack[..k].to_vec(),
        };
        let off_cpu = (raw.kind == KIND_OFF_CPU).then_some(OffInterval {
            start_ns: raw.off_start,
            duration_ns: raw.off_ns,
            state: raw.off_state,
        });
        Ok(Decoded {
            sample,
            lua,
            off_cpu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrec_format::ThreadOffCpuTotals;
    use std::mem::{offset_of, size_of};

    /// Offsets as laid out by clang for ebpf/sample.h.
    #[test]
    fn layout_matches_sample_h() {
        assert_eq!(size_of::<Regs>(), 18 * 8);
        assert_eq!(offset_of!(Regs, ip), 0);
        assert_eq!(offset_of!(Regs, sp), 8);
        assert_eq!(offset_of!(Regs, bp), 16);
        assert_eq!(offset_of!(Regs, dx), 6 * 8);
        assert_eq!(offset_of!(Regs, r14), 15 * 8);
        assert_eq!(offset_of!(Regs, flags), 17 * 8);
        assert_eq!(offset_of!(RawSample, time_ns), 0);
        assert_eq!(offset_of!(RawSample, pid), 8);
        assert_eq!(offset_of!(RawSample, tid), 12);
        assert_eq!(offset_of!(RawSample, cpu), 16);
        assert_eq!(offset_of!(RawSample, flags), 20);
        assert_eq!(offset_of!(RawSample, stack_len), 24);
        assert_eq!(offset_of!(RawSample, kstack_len), 28);
        assert_eq!(offset_of!(RawSample, lua_offset), 32);
        assert_eq!(offset_of!(RawSample, lua_len), 36);
        assert_eq!(offset_of!(RawSample, regs), 40);
        assert_eq!(offset_of!(RawSample, kind), 40 + 144);
        assert_eq!(offset_of!(RawSample, off_start), 40 + 144 + 8);
        assert_eq!(offset_of!(RawSample, kstack), 40 + 144 + 24);
        assert_eq!(size_of::<RawSample>(), 40 + 144 + 24 + 127 * 8);
        assert_eq!(size_of::<ThreadOffCpuTotals>(), 56);
        assert_eq!(offset_of!(ThreadOffCpuTotals, tid), 4);
        assert_eq!(offset_of!(ThreadOffCpuTotals, unpaired_ns), 48);
        assert_eq!(size_of::<RawThreadState>(), 72);
        assert_eq!(offset_of!(RawThreadState, syscall_ns), 32);
        assert_eq!(offset_of!(RawThreadState, kstack_len), 64);
        assert_eq!(size_of::<RawLuaStack>(), 56);
        assert_eq!(offset_of!(RawLuaStack, memo_seq), 40);
        assert_eq!(offset_of!(RawLuaStack, memo), 54);
        assert_eq!(size_of::<RawLuaFrame>(), 48);
        assert_eq!(offset_of!(RawLuaFrame, firstline), 24);
        assert_eq!(offset_of!(RawLuaFrame, pos), 36);
        assert_eq!(offset_of!(RawLuaFrame, ffid), 40);
        assert_eq!(offset_of!(RawLuaFrame, check), 42);
        assert_eq!(size_of::<RawLuaConfig>(), 8 * 8 + 36 * 4 + 8 * 2);
        assert_eq!(size_of::<RawLuaProto>(), 48 + 32 + 512 + 4096);
        assert_eq!(offset_of!(RawLuaProto, name), 80);
        assert_eq!(size_of::<RawPucConfig>(), 44 * 4);
        assert_eq!(offset_of!(RawLuaConfig, gc64), 64);
        assert_eq!(offset_of!(RawLuaConfig, pt_firstline), 64 + 21 * 4);
    }

    #[test]
    fn decodes_a_record() {
        let mut bytes = vec![0u8; size_of::<RawSample>() + 3];
        bytes[24] = 3; // stack_len
        bytes[28] = 1; // kstack_len
        bytes[208..216].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
        let n = bytes.len();
        bytes[n - 3..].copy_from_slice(&[7, 8, 9]);
        let d = RawSample::decode(&bytes).unwrap();
        assert!(d.lua.is_none() && d.off_cpu.is_none());
        assert_eq!(d.sample.user_stack, vec![7, 8, 9]);
        assert_eq!(d.sample.kernel_stack, vec![0xffff_ffff_8100_0000]);
        bytes[184] = 1; // kind: off CPU
        bytes[200] = 5; // off_ns
        let d = RawSample::decode(&bytes).unwrap();
        assert_eq!(d.off_cpu.map(|o| o.duration_ns), Some(5));
        assert!(RawSample::decode(&bytes[..10]).is_err());
        assert!(RawSample::decode(&bytes[..n - 1]).is_err());
    }
}

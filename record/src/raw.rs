//! Rust mirror of ebpf/sample.h, the one ABI shared with the BPF program.

use lrec_format::{sample_flags, Regs, Sample, ThreadOffCpuTotals, ThreadState};
use lrec_inspect::lua::named::ABSENT;
use lrec_inspect::lua::{luajit, puc};

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

/// A `struct lrec_thread_totals` as read from its map.
pub fn decode_totals(bytes: &[u8; size_of::<ThreadOffCpuTotals>()]) -> ThreadOffCpuTotals {
    read_pod(bytes, 0).expect("the array has the struct's size")
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

/// One ring-buffer record, decoded.
pub struct Decoded {
    pub sample: Sample,
    pub lua: Option<LuaWalk>,
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

/// `struct lrec_lua_config`: a LuaJIT layout, written into the `lua_config` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawLuaConfig {
    pub vm_start: [u64; MAX_LUA_RANGES],
    pub vm_end: [u64; MAX_LUA_RANGES],
    pub gc64: u32,
    pub g2disp: u32,
    pub g_vmstate: u32,
    pub g_cur_l: u32,
    pub g_jit_base: u32,
    pub l_glref: u32,
    pub l_base: u32,
    pub l_stack: u32,
    pub l_cframe: u32,
    pub l_maxstack: u32,
    pub cf_size: u32,
    pub cf_l: u32,
    pub cf_pc: u32,
    pub cf_prev: u32,
    pub cf_nres: u32,
    pub fn_ffid: u32,
    pub fn_pc: u32,
    pub fn_f: u32,
    pub pt_size: u32,
    pub pt_sizebc: u32,
    pub pt_chunkname: u32,
    pub pt_firstline: u32,
    pub pt_lineinfo: u32,
    pub str_len: u32,
    pub str_data: u32,
    pub j_trace: u32,
    pub tr_nsnap: u16,
    pub tr_ir: u16,
    pub tr_snap: u16,
    pub tr_snapmap: u16,
    pub tr_nsnapmap: u16,
    pub tr_szmcode: u16,
    pub tr_mcode: u16,
    pub tr_traceno: u16,
    pub cts_stack: u32,
    pub g_ctype_state: u32,
    pub str_id: u32,
    pub pt_numline: u32,
    /// Derived from the offsets above ([`RawLuaConfig::new`]): the proto fields' span, the
    /// bytes of a lua_State read at once, and where and how many bytes of global_State.
    pub pt_lo: u32,
    pub pt_span: u32,
    pub pad: u32,
    pub lh_size: u32,
    pub gh_lo: u32,
    pub gh_size: u32,
}

impl RawLuaConfig {
    /// The walker's configuration for a LuaJIT layout and the interpreter's mapped ranges
    /// (`code`: start, end), with the trace array at `j_trace` from G (0: not known).
    pub fn new(o: &luajit::Offsets, code: &[(u64, u64)], j_trace: u32) -> RawLuaConfig {
        let mut c = RawLuaConfig {
            gc64: o.gc64,
            g2disp: o.g2disp,
            g_vmstate: o.g_vmstate,
            g_cur_l: o.g_cur_l,
            g_jit_base: o.g_jit_base,
            l_glref: o.l_glref,
            l_base: o.l_base,
            l_stack: o.l_stack,
            l_cframe: o.l_cframe,
            l_maxstack: o.l_maxstack,
            cf_size: o.cf_size,
            cf_l: o.cf_l,
            cf_pc: o.cf_pc,
            cf_prev: o.cf_prev,
            cf_nres: o.cf_nres,
            fn_ffid: o.fn_ffid,
            fn_pc: o.fn_pc,
            fn_f: o.fn_f,
            pt_size: o.pt_size,
            pt_sizebc: o.pt_sizebc,
            pt_chunkname: o.pt_chunkname,
            pt_firstline: o.pt_firstline,
            pt_lineinfo: o.pt_lineinfo,
            str_len: o.str_len,
            str_data: o.str_data,
            j_trace,
            tr_nsnap: o.tr_nsnap as u16,
            tr_ir: o.tr_ir as u16,
            tr_snap: o.tr_snap as u16,
            tr_snapmap: o.tr_snapmap as u16,
            tr_nsnapmap: o.tr_nsnapmap as u16,
            tr_szmcode: o.tr_szmcode as u16,
            tr_mcode: o.tr_mcode as u16,
            tr_traceno: o.tr_traceno as u16,
            // Unknown (a build without the FFI's callbacks known): never an FFI callback.
            cts_stack: if o.cts_cb_stack == ABSENT {
                0
            } else {
                o.cts_cb_stack
            },
            g_ctype_state: if o.g_ctype_state == ABSENT {
                0
            } else {
                o.g_ctype_state
            },
            str_id: o.str_hash,
            pt_numline: o.pt_numline,
            ..RawLuaConfig::default()
        };
        for (i, &(start, end)) in code.iter().take(MAX_LUA_RANGES).enumerate() {
            c.vm_start[i] = start;
            c.vm_end[i] = end;
        }
        c.read_spans()
    }

    /// Fills the read spans the BPF walk reads fields with, once: the proto's key fields
    /// (at most 128 bytes, else the layout is refused), the lua_State fields it reads up to
    /// the last one (at most 128 bytes), and global_State's vmstate, cur_L, jit_base and
    /// ctype_state (at most 256); 0 where the fields lie farther apart (each is then read
    /// alone).
    fn read_spans(mut self) -> Self {
        let pt = [
            self.pt_sizebc,
            self.pt_chunkname,
            self.pt_firstline,
            self.pt_numline,
        ];
        self.pt_lo = pt.into_iter().min().unwrap_or(0);
        self.pt_span = pt.into_iter().max().unwrap_or(0) + 8 - self.pt_lo;
        let l_last = [
            self.l_glref,
            self.l_base,
            self.l_stack,
            self.l_cframe,
            self.l_maxstack,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        self.lh_size = if l_last <= 120 { l_last + 8 } else { 0 };
        let mut g = vec![self.g_vmstate, self.g_cur_l, self.g_jit_base];
        if self.g_ctype_state != 0 {
            g.push(self.g_ctype_state);
        }
        let lo = g.iter().copied().min().unwrap_or(0);
        let hi = g.iter().copied().max().unwrap_or(0) + 16;
        self.gh_lo = lo;
        self.gh_size = if hi - lo <= 256 { hi - lo } else { 0 };
        self
    }

    /// Whether BPF can read this layout's proto fields at once (their span is at most
    /// 128 bytes).
    pub fn readable(&self) -> bool {
        self.pt_span <= 120
    }
}

pub const LUA_CHUNKNAME: usize = 512;
pub const LUA_LINEINFO: usize = 4096;
/// PUC Lua: the instructions BPF copies from a proto's code ([`RawLuaProto::code_head`]).
pub const LUA_CODE_HEAD: usize = 7;
/// PUC Lua 5.4+: where the absolute lines begin in [`RawLuaProto::lineinfo`].
pub const PUC_ABS_AT: usize = 3072;

// `lrec_lua_frame.link` bits of PUC Lua frames are the format's.
const _: () = assert!(lrec_format::puc_link::FRESH == 1);
const _: () = assert!(lrec_format::puc_link::TAIL == 2);

/// `struct lrec_puc_config`: a PUC Lua layout, written into the `puc_config` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawPucConfig {
    pub version: u32,
    pub fresh_rule: u32,
    pub cist_fresh: u32,
    pub cist_tail: u32,
    pub callstatus_size: u32,
    pub l_g: u32,
    pub l_ci: u32,
    pub l_status: u32,
    pub l_base_ci: u32,
    pub l_savedpc: u32,
    pub l_errorjmp: u32,
    pub g_mainthread: u32,
    pub ci_func: u32,
    pub ci_previous: u32,
    pub ci_savedpc: u32,
    pub ci_callstatus: u32,
    pub ci_size: u32,
    pub tag_lcl: u32,
    pub tag_ccl: u32,
    pub tag_lcf: u32,
    pub tag_thread: u32,
    pub cl_isc: u32,
    pub cl_p: u32,
    pub ccl_f: u32,
    pub ccl_upvalue: u32,
    pub p_source: u32,
    pub p_linedefined: u32,
    pub p_lastlinedefined: u32,
    pub p_code: u32,
    pub p_sizecode: u32,
    pub p_lineinfo: u32,
    pub p_sizelineinfo: u32,
    pub p_abslineinfo: u32,
    pub p_sizeabslineinfo: u32,
    pub strings: u32,
    pub str_len: u32,
    pub str_shrlen: u32,
    pub str_data: u32,
    pub op_call: u32,
    pub op_tailcall: u32,
    pub l_size: u32,
    pub p_size: u32,
    pub ci_tailcalls: u32,
    pub str_hdr: u32,
}

/// sizeof a struct the walker reads whole: known, else past the last field it reads
/// (`width` bytes each, rounded up to 8), which bounds the read as well.
fn bound(size: u32, read: &[u32], width: u32) -> u32 {
    if size != ABSENT {
        return size;
    }
    let last = read
        .iter()
        .copied()
        .filter(|&v| v != ABSENT)
        .max()
        .unwrap_or(0);
    (last + width).next_multiple_of(8)
}

impl RawPucConfig {
    /// The walker's configuration for a PUC Lua layout.
    pub fn new(l: &puc::Layout) -> RawPucConfig {
        let (r, o) = (&l.rules, &l.offsets);
        // An absent field the walker does not read in this release (5.1's CallInfo links).
        let or0 = |v: u32| if v == ABSENT { 0 } else { v };
        RawPucConfig {
            version: r.version,
            fresh_rule: match r.fresh {
                puc::FreshRule::Fresh => puc_rule::FRESH,
                puc::FreshRule::Reentry => puc_rule::REENTRY,
                puc::FreshRule::All => puc_rule::ALL,
                puc::FreshRule::Opcode => puc_rule::OPCODE,
            },
            cist_fresh: r.cist_fresh,
            cist_tail: r.cist_tail,
            callstatus_size: if o.ci_callstatus_size == ABSENT {
                1
            } else {
                o.ci_callstatus_size
            },
            l_g: o.l_g,
            l_ci: o.l_ci,
            l_status: o.l_status,
            l_base_ci: o.l_base_ci,
            l_savedpc: or0(o.l_savedpc),
            l_errorjmp: o.l_errorjmp,
            g_mainthread: o.g_mainthread,
            ci_func: o.ci_func,
            ci_previous: or0(o.ci_previous),
            ci_savedpc: o.ci_savedpc,
            ci_callstatus: or0(o.ci_callstatus),
            ci_size: bound(
                o.ci_size,
                &[
                    o.ci_func,
                    or0(o.ci_previous),
                    o.ci_savedpc,
                    or0(o.ci_callstatus),
                    or0(o.ci_tailcalls),
                ],
                8,
            ),
            tag_lcl: r.tag_lcl,
            tag_ccl: r.tag_ccl,
            tag_lcf: r.tag_lcf,
            tag_thread: r.tag_thread,
            cl_isc: or0(o.cl_isc),
            cl_p: o.lcl_p,
            ccl_f: o.ccl_f,
            ccl_upvalue: o.ccl_upvalue,
            p_source: o.p_source,
            p_linedefined: o.p_linedefined,
            p_lastlinedefined: o.p_lastlinedefined,
            p_code: o.p_code,
            p_sizecode: o.p_sizecode,
            p_lineinfo: o.p_lineinfo,
            p_sizelineinfo: o.p_sizelineinfo,
            p_abslineinfo: or0(o.p_abslineinfo),
            p_sizeabslineinfo: or0(o.p_sizeabslineinfo),
            strings: match r.strings {
                puc::Strings::Len => puc_strings::LEN,
                puc::Strings::ShortLong => puc_strings::SHORT_LONG,
                puc::Strings::V55 => puc_strings::V55,
            },
            str_len: o.s_len,
            str_shrlen: or0(o.s_shrlen),
            str_data: o.s_data,
            op_call: r.op_call,
            op_tailcall: r.op_tailcall,
            l_size: bound(
                o.l_size,
                &[
                    o.l_g,
                    o.l_ci,
                    o.l_status,
                    o.l_base_ci,
                    o.l_errorjmp,
                    or0(o.l_savedpc),
                ],
                8,
            ),
            p_size: bound(
                o.p_size,
                &[
                    o.p_source,
                    o.p_linedefined,
                    o.p_lastlinedefined,
                    o.p_code,
                    o.p_sizecode,
                    o.p_lineinfo,
                    o.p_sizelineinfo,
                    or0(o.p_abslineinfo),
                    or0(o.p_sizeabslineinfo),
                ],
                8,
            ),
            ci_tailcalls: or0(o.ci_tailcalls),
            // The type byte, the short length and the long one (the text's pointer, in
            // 5.5, is read on its own).
            str_hdr: [9, or0(o.s_shrlen) + 1, o.s_len + 8]
                .into_iter()
                .max()
                .unwrap_or(24),
        }
    }
}

/// `lrec_puc_config.fresh_rule`.
pub mod puc_rule {
    pub const FRESH: u32 = 0;
    pub const REENTRY: u32 = 1;
    pub const ALL: u32 = 2;
    pub const OPCODE: u32 = 3;
}

/// `lrec_puc_config.strings`.
pub mod puc_strings {
    pub const LEN: u32 = 0;
    pub const SHORT_LONG: u32 = 1;
    pub const V55: u32 = 2;
}

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
    pub fn decode(bytes: &[u8]) -> Option<RawLuaProto> {
        read_pod(bytes, 0)
    }
}

// SAFETY: plain old data without padding (asserted in the layout test).
unsafe impl aya::Pod for RawLuaConfig {}
// SAFETY: as above: u32 fields only.
unsafe impl aya::Pod for RawPucConfig {}

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
pub struct LuaWalk {
    pub header: RawLuaStack,
    pub frames: Vec<RawLuaFrame>,
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
    pub fn decode(bytes: &[u8]) -> Result<Decoded, RawError> {
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
                let mut frames: Vec<RawLuaFrame> = Vec::with_capacity(n);
                // SAFETY: `all` holds exactly n frames' bytes, copied into the capacity of
                // n frames (a byte copy needs no alignment of the source); RawLuaFrame is
                // plain old data, valid for any bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        all.as_ptr(),
                        frames.as_mut_ptr().cast::<u8>(),
                        all.len(),
                    );
                    frames.set_len(n);
                }
                Some(LuaWalk { header, frames })
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
        assert_eq!(size_of::<RawLuaStack>(), 40);
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

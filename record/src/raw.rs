//! Rust mirror of ebpf/sample.h, the one ABI shared with the BPF program.

use lrec_format::{sample_flags, Regs, Sample};

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
    /// `struct lrec_regs`.
    pub regs: Regs,
    pub kstack: [u64; MAX_KSTACK],
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

impl RawSample {
    /// Decodes one ring-buffer record into a capture sample.
    pub fn decode(bytes: &[u8]) -> Result<Sample, RawError> {
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
        Ok(Sample {
            time_ns: raw.time_ns,
            pid: raw.pid,
            tid: raw.tid,
            cpu: raw.cpu,
            flags: raw.flags,
            regs: raw.regs,
            user_stack: stack.to_vec(),
            kernel_stack: raw.kstack[..k].to_vec(),
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
        assert_eq!(offset_of!(RawSample, regs), 32);
        assert_eq!(offset_of!(RawSample, kstack), 32 + 144);
        assert_eq!(size_of::<RawSample>(), 32 + 144 + 127 * 8);
    }

    #[test]
    fn decodes_a_record() {
        let mut bytes = vec![0u8; size_of::<RawSample>() + 3];
        bytes[24] = 3; // stack_len
        bytes[28] = 1; // kstack_len
        bytes[176..184].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
        let n = bytes.len();
        bytes[n - 3..].copy_from_slice(&[7, 8, 9]);
        let s = RawSample::decode(&bytes).unwrap();
        assert_eq!(s.user_stack, vec![7, 8, 9]);
        assert_eq!(s.kernel_stack, vec![0xffff_ffff_8100_0000]);
        assert!(RawSample::decode(&bytes[..10]).is_err());
        assert!(RawSample::decode(&bytes[..n - 1]).is_err());
    }
}

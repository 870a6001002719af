//! Hand-written bincode for the hottest records, at a fraction of serde's cost, in the
//! very bytes bincode's serde path reads and writes (standard configuration: little-endian
//! varint integers, zigzag for signed ones, `u8` as one byte, a length before each
//! sequence):
//! - lanalyze decodes every [`SampleRef`] with [`sample_ref`]; anything unexpected returns
//!   `None`, and the caller then decodes with serde, which gives the error;
//! - lrec encodes every [`LuaStack`] (up to hundreds of frames a sample) with
//!   [`encode_lua_stack`], and lanalyze decodes it with [`lua_stack`] (`None`: serde then).

use serde::Deserialize;

use crate::v1::{kind, record_kinds, LuaFrame, LuaStack, Record, Regs, SampleRef};

/// Decodes a whole payload with serde (bincode), trailing bytes being an error.
pub(crate) fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, String> {
    match bincode::serde::borrow_decode_from_slice(body, crate::bincode_config()) {
        Ok((v, n)) if n == body.len() => Ok(v),
        Ok((_, n)) => Err(format!("{} trailing bytes", body.len() - n)),
        Err(e) => Err(e.to_string()),
    }
}

/// Every record kind's encoding and decoding ([`record_kinds`]): serde's bincode, but for
/// [`LuaStack`], hand-written ([`encode_lua_stack`]).
macro_rules! record_codec {
    ($($variant:ident = $kind:ident),* $(,)?) => {
        impl Record {
            /// Appends the record's payload (bincode) to `buf`.
            pub(crate) fn encode_payload(
                &self,
                buf: &mut Vec<u8>,
            ) -> Result<(), bincode::error::EncodeError> {
                let cfg = crate::bincode_config();
                if let Record::LuaStack(r) = self {
                    encode_lua_stack(r, buf);
                    return Ok(());
                }
                match self {
                    $(Record::$variant(r) => {
                        bincode::serde::encode_into_std_write(r, buf, cfg).map(drop)
                    })*
                    Record::Unknown { payload, .. } => {
                        buf.extend_from_slice(payload);
                        Ok(())
                    }
                }
            }

            /// Decodes a payload of kind `k`; `Ok(None)` for kinds this version lacks.
            pub(crate) fn decode_payload(k: u16, body: &[u8]) -> Result<Option<Record>, String> {
                Ok(Some(match k {
                    $(kind::$kind => Record::$variant(decode(body)?),)*
                    _ => return Ok(None),
                }))
            }
        }
    };
}

record_kinds!(record_codec);

/// bincode's varint markers: a value below 251 is one byte; these announce a u16, u32, u64.
const U16: u8 = 251;
const U32: u8 = 252;
const U64: u8 = 253;

struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.rest.split_at_checked(n)?;
        self.rest = tail;
        Some(head)
    }

    #[inline]
    fn varint(&mut self) -> Option<u64> {
        let (&first, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(match first {
            U16 => u64::from(u16::from_le_bytes(self.take(2)?.try_into().ok()?)),
            U32 => u64::from(u32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            U64 => u64::from_le_bytes(self.take(8)?.try_into().ok()?),
            b if b < U16 => u64::from(b),
            _ => return None,
        })
    }

    #[inline]
    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }

    #[inline]
    fn len(&mut self) -> Option<usize> {
        let n = usize::try_from(self.varint()?).ok()?;
        // Every element takes at least a byte: a longer length is damage.
        (n <= self.rest.len()).then_some(n)
    }
}

/// Decodes a whole `SampleRef` record body, or `None` when it is not exactly one.
pub(crate) fn sample_ref(body: &[u8]) -> Option<SampleRef<'_>> {
    let mut c = Cursor { rest: body };
    let time_ns = c.varint()?;
    let pid = c.u32()?;
    let tid = c.u32()?;
    let cpu = c.u32()?;
    let flags = c.u32()?;
    let mut r = [0u64; 18];
    for v in &mut r {
        *v = c.varint()?;
    }
    let regs = Regs {
        ip: r[0],
        sp: r[1],
        bp: r[2],
        ax: r[3],
        bx: r[4],
        cx: r[5],
        dx: r[6],
        si: r[7],
        di: r[8],
        r8: r[9],
        r9: r[10],
        r10: r[11],
        r11: r[12],
        r12: r[13],
        r13: r[14],
        r14: r[15],
        r15: r[16],
        flags: r[17],
    };
    let n = c.len()?;
    let user_stack = c.take(n)?;
    let n = c.len()?;
    let mut kernel_stack = Vec::with_capacity(n);
    for _ in 0..n {
        kernel_stack.push(c.varint()?);
    }
    c.rest.is_empty().then_some(SampleRef {
        time_ns,
        pid,
        tid,
        cpu,
        flags,
        regs,
        user_stack,
        kernel_stack,
    })
}

/// Decodes a whole `LuaStack` record body, or `None` when it is not exactly one.
pub(crate) fn lua_stack(body: &[u8]) -> Option<LuaStack> {
    let mut c = Cursor { rest: body };
    let stack = lua_stack_at(&mut c)?;
    c.rest.is_empty().then_some(stack)
}

/// Decodes a whole `LUA_STACK_SHARED` record body: a `LuaStack` of its innermost frames,
/// and how many outer frames it shares with its thread's previous stack.
pub(crate) fn lua_stack_shared(body: &[u8]) -> Option<(LuaStack, usize)> {
    let mut c = Cursor { rest: body };
    let stack = lua_stack_at(&mut c)?;
    let shared = usize::try_from(c.varint()?).ok()?;
    c.rest.is_empty().then_some((stack, shared))
}

fn lua_stack_at(c: &mut Cursor<'_>) -> Option<LuaStack> {
    let pid = c.u32()?;
    let tid = c.u32()?;
    let time_ns = c.varint()?;
    let vm = c.varint()?;
    let state = c.varint()?;
    let cframe = c.varint()?;
    let vmstate = unzigzag(c.u32()?);
    let flags = c.u32()?;
    let n = c.len()?;
    let mut frames = Vec::with_capacity(n);
    for _ in 0..n {
        let &[kind, builtin, link] = c.take(3)? else {
            return None;
        };
        frames.push(LuaFrame {
            kind,
            builtin,
            link,
            function: c.u32()?,
            address: c.varint()?,
            pos: c.u32()?,
            cframe: c.varint()?,
        });
    }
    Some(LuaStack {
        pid,
        tid,
        time_ns,
        vm,
        state,
        cframe,
        vmstate,
        flags,
        frames,
    })
}

/// The last Lua stack of each thread in a chunk (tid → pid, frames), which a
/// `LUA_STACK_SHARED` record shares its outer frames with: the writer finds them with
/// [`LastLuaStacks::share`], the reader puts them back with [`LastLuaStacks::complete`].
#[derive(Default)]
pub(crate) struct LastLuaStacks(std::collections::HashMap<u32, (u32, Vec<LuaFrame>)>);

impl LastLuaStacks {
    /// How many outer frames `stack` shares with the last stack of its thread, which it
    /// then replaces.
    pub(crate) fn share(&mut self, stack: &LuaStack) -> usize {
        let known = match self.0.get(&stack.tid) {
            Some((pid, last)) if *pid == stack.pid => (last.iter().rev())
                .zip(stack.frames.iter().rev())
                .take_while(|(a, b)| a == b)
                .count(),
            _ => 0,
        };
        self.share_known(stack.tid, stack.pid, &stack.frames, known)
    }

    /// [`Self::share`] for a stack of thread `tid` of `pid` whose `frames` share `known`
    /// outer frames with the last stack pushed for that thread, as its pusher knows: taken
    /// as shared, without comparing them, when this chunk holds that stack (else none).
    pub(crate) fn share_known(
        &mut self,
        tid: u32,
        pid: u32,
        frames: &[LuaFrame],
        known: usize,
    ) -> usize {
        let (last_pid, last) = self.0.entry(tid).or_default();
        let shared = match *last_pid == pid && known <= last.len().min(frames.len()) {
            true => known,
            false => 0,
        };
        *last_pid = pid;
        // The shared frames are in place: the others replace the last stack's.
        let (old, new) = (last.len() - shared, frames.len() - shared);
        last.splice(..old, frames[..new].iter().cloned());
        shared
    }

    /// Appends to `stack` the `shared` outer frames of the last stack of its thread, which
    /// it then replaces.
    pub(crate) fn complete(&mut self, stack: &mut LuaStack, shared: usize) -> Result<(), String> {
        let (pid, last) = self.0.entry(stack.tid).or_default();
        if shared > 0 {
            if *pid != stack.pid || shared > last.len() {
                return Err(format!(
                    "shares {shared} frames with an earlier stack of thread {} that the \
                     chunk lacks",
                    stack.tid
                ));
            }
            stack.frames.extend_from_slice(&last[last.len() - shared..]);
        }
        *pid = stack.pid;
        last.clone_from(&stack.frames);
        Ok(())
    }

    /// Forgets every stack: none can be shared from after one could not be read.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Appends `stack` as bincode's serde path would.
pub(crate) fn encode_lua_stack(stack: &LuaStack, buf: &mut Vec<u8>) {
    encode_lua_frames(stack, &stack.frames, buf);
}

/// Appends the body of `stack` with `frames` for its frames: a `LUA_STACK_SHARED` one
/// (without its `shared` outermost frames, then `shared`) when frames are shared, else a
/// `LUA_STACK` one.
pub(crate) fn encode_lua_parts(
    stack: &LuaStack,
    frames: &[LuaFrame],
    shared: usize,
    buf: &mut Vec<u8>,
) {
    encode_lua_frames(stack, &frames[..frames.len() - shared], buf);
    if shared == 0 {
        return;
    }
    let mut b = Staged::default();
    b.varint(shared as u64);
    b.flush(buf);
}

/// Appends `stack` with `frames` for its frames, as bincode's serde path would.
fn encode_lua_frames(stack: &LuaStack, frames: &[LuaFrame], buf: &mut Vec<u8>) {
    let mut b = Staged::default();
    b.varint(u64::from(stack.pid));
    b.varint(u64::from(stack.tid));
    b.varint(stack.time_ns);
    b.varint(stack.vm);
    b.varint(stack.state);
    b.varint(stack.cframe);
    b.varint(u64::from(zigzag(stack.vmstate)));
    b.varint(u64::from(stack.flags));
    b.varint(frames.len() as u64);
    b.flush(buf);
    for f in frames {
        b.bytes(&[f.kind, f.builtin, f.link]);
        b.varint(u64::from(f.function));
        b.varint(f.address);
        b.varint(u64::from(f.pos));
        b.varint(f.cframe);
        b.flush(buf);
    }
}

/// Bytes built on the stack and appended to the buffer at once: one capacity check for a
/// frame's fields, not one per field.
struct Staged {
    bytes: [u8; 96],
    len: usize,
}

impl Default for Staged {
    fn default() -> Self {
        Staged {
            bytes: [0; 96],
            len: 0,
        }
    }
}

impl Staged {
    /// Appends at most 9 varints' or 96 bytes' worth before a flush.
    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.bytes[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    #[inline]
    fn varint(&mut self, v: u64) {
        if v < u64::from(U16) {
            self.bytes(&[v as u8]);
        } else if let Ok(v) = u16::try_from(v) {
            self.bytes(&[U16]);
            self.bytes(&v.to_le_bytes());
        } else if let Ok(v) = u32::try_from(v) {
            self.bytes(&[U32]);
            self.bytes(&v.to_le_bytes());
        } else {
            self.bytes(&[U64]);
            self.bytes(&v.to_le_bytes());
        }
    }

    /// Appends the staged bytes. All 96 are copied (a fixed size compiles to a few stores,
    /// where a variable one is a call to memcpy), and the length grows by those staged.
    #[inline]
    fn flush(&mut self, buf: &mut Vec<u8>) {
        buf.reserve(self.bytes.len());
        let spare = &mut buf.spare_capacity_mut()[..self.bytes.len()];
        for (to, &from) in spare.iter_mut().zip(&self.bytes) {
            to.write(from);
        }
        // SAFETY: the capacity past the length holds at least 96 bytes, all just
        // initialized; the length grows by `self.len` ≤ 96 of them.
        unsafe { buf.set_len(buf.len() + self.len) };
        self.len = 0;
    }
}

fn unzigzag(v: u32) -> i32 {
    if v & 1 == 0 {
        (v >> 1) as i32
    } else {
        !((v >> 1) as i32)
    }
}

fn zigzag(v: i32) -> u32 {
    if v < 0 {
        !(v as u32) * 2 + 1
    } else {
        (v as u32) * 2
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::v1::Sample;

    fn encode(s: &Sample) -> Vec<u8> {
        bincode::serde::encode_to_vec(s, crate::bincode_config()).unwrap()
    }

    /// Values around each varint boundary.
    fn int() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..260,
            65_530u64..65_540,
            (u32::MAX as u64 - 3)..(u32::MAX as u64 + 3),
            any::<u64>(),
        ]
    }

    proptest! {
        #[test]
        fn decodes_as_serde_does(
            time_ns in int(), pid in any::<u32>(), tid in 0u32..300, flags in 0u32..8,
            regs in proptest::collection::vec(int(), 18),
            user_stack in proptest::collection::vec(any::<u8>(), 0..600),
            kernel_stack in proptest::collection::vec(int(), 0..40),
        ) {
            let r = &regs;
            let s = Sample {
                time_ns, pid, tid, cpu: 3, flags,
                regs: Regs {
                    ip: r[0], sp: r[1], bp: r[2], ax: r[3], bx: r[4], cx: r[5], dx: r[6],
                    si: r[7], di: r[8], r8: r[9], r9: r[10], r10: r[11], r11: r[12],
                    r12: r[13], r13: r[14], r14: r[15], r15: r[16], flags: r[17],
                },
                user_stack, kernel_stack,
            };
            let body = encode(&s);
            let serde: SampleRef = decode(&body).unwrap();
            prop_assert_eq!(sample_ref(&body), Some(serde));
            // Cut anywhere, or with a byte more: never a sample.
            for cut in [0, 1, body.len() / 2, body.len() - 1] {
                prop_assert_eq!(sample_ref(&body[..cut]), None);
            }
            let mut longer = body.clone();
            longer.push(0);
            prop_assert_eq!(sample_ref(&longer), None);
        }
    }

    fn lua_frame() -> impl Strategy<Value = crate::v1::LuaFrame> {
        (
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
            int(),
            any::<u32>(),
            int(),
        )
            .prop_map(|(kind, builtin, link, function, address, pos, cframe)| {
                crate::v1::LuaFrame {
                    kind,
                    builtin,
                    link,
                    function,
                    address,
                    pos,
                    cframe,
                }
            })
    }

    proptest! {
        #[test]
        fn lua_stacks_encode_as_serde_does(
            pid in any::<u32>(), time_ns in int(), vm in int(), state in int(),
            vmstate in prop_oneof![any::<i32>(), -10i32..10, Just(i32::MIN)],
            flags in any::<u32>(),
            frames in proptest::collection::vec(lua_frame(), 0..300),
        ) {
            let s = LuaStack {
                pid, tid: pid / 3, time_ns, vm, state, cframe: vm / 7, vmstate, flags, frames,
            };
            let serde = bincode::serde::encode_to_vec(&s, crate::bincode_config()).unwrap();
            let mut fast = Vec::new();
            encode_lua_stack(&s, &mut fast);
            prop_assert_eq!(&fast, &serde);
            prop_assert_eq!(lua_stack(&serde), Some(s));
            prop_assert_eq!(lua_stack(&serde[..serde.len() - 1]), None);
        }
    }

    #[test]
    fn unknown_markers_are_left_to_serde() {
        let mut body = encode(&Sample::default());
        body[0] = 254; // a u128 marker
        assert_eq!(sample_ref(&body), None);
    }
}

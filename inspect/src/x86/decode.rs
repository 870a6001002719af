//! Instructions read from a file's code, and their operands' sizes and immediates.

use iced_x86::{Code as Opcode, Decoder, DecoderOptions, Instruction, OpKind};

use crate::elf::Code;

/// Bytes of operand `i` (a register's or the memory access's size).
pub(super) fn operand_size(ins: &Instruction, i: u32) -> u8 {
    match ins.op_kind(i) {
        OpKind::Register => ins.op_register(i).size() as u8,
        OpKind::Memory => ins.memory_size().size() as u8,
        _ => {
            // An immediate takes the other operand's size.
            if i > 0 {
                operand_size(ins, 0)
            } else {
                8
            }
        }
    }
}

/// The value of immediate operand `op`, sign-extended from its own width.
pub fn immediate(ins: &Instruction, op: u32) -> Option<i64> {
    let v = ins.immediate(op);
    Some(match ins.op_kind(op) {
        OpKind::Immediate8 => v as u8 as i8 as i64,
        OpKind::Immediate16 | OpKind::Immediate8to16 => v as u16 as i16 as i64,
        OpKind::Immediate32 | OpKind::Immediate8to32 => v as u32 as i32 as i64,
        OpKind::Immediate64 | OpKind::Immediate8to64 | OpKind::Immediate32to64 => v as i64,
        _ => return None,
    })
}

/// Decodes [start, end) of `code` into instructions.
pub fn decode(code: &Code, start: u64, end: u64) -> Vec<Instruction> {
    let Some(bytes) = code.bytes(start, end) else {
        return Vec::new();
    };
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut out = Vec::with_capacity(bytes.len() / 4);
    while decoder.can_decode() {
        let ins = decoder.decode();
        if ins.code() == Opcode::INVALID {
            break;
        }
        out.push(ins);
    }
    out
}

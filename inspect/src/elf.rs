//! What gets embedded in a capture from each mapped ELF file: its build-id, PT_LOAD segments
//! and the sections needed to unwind and symbolize without the file (see
//! [`lrec_format::Binary`]).

use lrec_format::{Binary, Section, Segment};

mod code;
mod functions;

pub use code::Code;
pub use functions::*;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, NoteIterator, ProgramHeader, SectionHeader};
use object::{Endianness, FileKind, LittleEndian, Object, ObjectSection};

/// Which DWARF debug sections to embed besides the unwind and symbol sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugInfo {
    None,
    /// All of them if their total (uncompressed) size is at most this many bytes, else none.
    IfSmall(u64),
    All,
}

/// Sections embedded with their data whenever present.
const UNWIND_AND_SYMBOL_SECTIONS: &[&str] = &[
    ".eh_frame",
    ".eh_frame_hdr",
    ".debug_frame",
    ".symtab",
    ".strtab",
    ".dynsym",
    ".dynstr",
    ".gnu_debuglink",
];

/// Sections embedded with their data as [`DebugInfo`] says.
const DEBUG_INFO_SECTIONS: &[&str] = &[
    ".debug_info",
    ".debug_abbrev",
    ".debug_line",
    ".debug_line_str",
    ".debug_str",
    ".debug_str_offsets",
    ".debug_addr",
    ".debug_ranges",
    ".debug_rnglists",
    ".debug_aranges",
];

/// The offset of the byte order in `e_ident`.
const EI_DATA: usize = 5;

/// Sections recorded without data, only for their address range.
const RANGE_ONLY_SECTIONS: &[&str] = &[".text"];

/// The GNU build-id (NT_GNU_BUILD_ID note) of an ELF file of any class and byte order.
///
/// Looks in the PT_NOTE segments first: they lie near the start of the file, so the file's
/// first pages are enough. Note sections are searched only if the section headers (at the
/// end of the file) are within `data`.
pub fn build_id(data: &[u8]) -> Option<Vec<u8>> {
    match FileKind::parse(data).ok()? {
        FileKind::Elf64 => build_id_of::<elf::FileHeader64<Endianness>>(data),
        FileKind::Elf32 => build_id_of::<elf::FileHeader32<Endianness>>(data),
        _ => None,
    }
}

fn build_id_of<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Option<Vec<u8>> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let find = |mut notes: NoteIterator<'_, Elf>| -> Option<Vec<u8>> {
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                return Some(note.desc().to_vec()).filter(|id| !id.is_empty());
            }
        }
        None
    };
    let phdrs = header.program_headers(endian, data).unwrap_or(&[]);
    let from_segments = phdrs
        .iter()
        .filter_map(|ph| ph.notes(endian, data).ok().flatten())
        .find_map(find);
    from_segments.or_else(|| {
        let sections = header.sections(endian, data).ok()?;
        sections
            .iter()
            .filter_map(|sh| sh.notes(endian, data).ok().flatten())
            .find_map(find)
    })
}

/// The program interpreter (PT_INTERP, e.g. `/lib64/ld-linux-x86-64.so.2`) of an ELF
/// file; `data` need only hold the headers and the interpreter string.
pub fn interpreter(data: &[u8]) -> Option<String> {
    if FileKind::parse(data).ok()? != FileKind::Elf64 {
        return None;
    }
    let header = elf::FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let phdrs = header.program_headers(endian, data).ok()?;
    let interp = phdrs
        .iter()
        .find_map(|ph| ph.interpreter(endian, data).ok().flatten())?;
    String::from_utf8(interp.to_vec()).ok()
}

/// The capture record of the ELF file `data`, read from `path`.
///
/// Never fails: a file that is not a little-endian x86_64 ELF64 file, or whose headers do
/// not parse, gives a record with `error` set and no segments or sections. A section whose
/// data cannot be read (bad offsets, unsupported compression) is recorded without data.
/// Compressed sections are embedded decompressed, and then `size` is the uncompressed size.
pub fn binary_record(path: &str, data: &[u8], debug: DebugInfo) -> Binary {
    record_of(path, data, |file| {
        let embed_debug = match debug {
            DebugInfo::None => false,
            DebugInfo::All => true,
            DebugInfo::IfSmall(limit) => debug_info_size(file) <= limit,
        };
        move |name: &str| {
            if UNWIND_AND_SYMBOL_SECTIONS.contains(&name)
                || (embed_debug && DEBUG_INFO_SECTIONS.contains(&name))
            {
                Embed::Data
            } else if RANGE_ONLY_SECTIONS.contains(&name) {
                Embed::RangeOnly
            } else {
                Embed::Skip
            }
        }
    })
}

/// The record of an ELF file with its segments and unwind sections only (no symbols):
/// what finding a Lua interpreter in it needs ([`luajit_vm`], [`puc_execute`]), cheap to
/// build for every library a process maps.
pub fn unwind_record(path: &str, data: &[u8]) -> Binary {
    record_of(path, data, |_| {
        |name: &str| match name {
            ".eh_frame" | ".eh_frame_hdr" => Embed::Data,
            ".text" => Embed::RangeOnly,
            _ => Embed::Skip,
        }
    })
}

/// A [`Binary`] whose sections are embedded as `embed` (made for the parsed file) says.
fn record_of<'d, F: Fn(&str) -> Embed>(
    path: &str,
    data: &'d [u8],
    embed: impl FnOnce(&ElfFile64<'d, LittleEndian>) -> F,
) -> Binary {
    let mut binary = Binary {
        build_id: build_id(data),
        path: path.to_owned(),
        file_size: data.len() as u64,
        ..Binary::default()
    };
    match parse_x86_64(data) {
        Ok(file) => {
            let endian = file.endian();
            binary.elf_type = file.elf_header().e_type(endian);
            binary.segments = load_segments(&file);
            binary.sections = sections(&file, embed(&file));
        }
        Err(error) => binary.error = Some(error),
    }
    binary
}

/// Parses `data` as the kind of ELF file lrec can unwind: ELF64, little-endian, x86_64.
pub(crate) fn parse_x86_64(data: &[u8]) -> Result<ElfFile64<'_, LittleEndian>, String> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => {}
        Ok(FileKind::Elf32) => return Err("32-bit ELF files are not supported".into()),
        Ok(kind) => return Err(format!("not an ELF file ({kind:?})")),
        Err(e) => return Err(format!("not an ELF file: {e}")),
    }
    if data.get(EI_DATA) != Some(&elf::ELFDATA2LSB) {
        return Err("big-endian ELF files are not supported".into());
    }
    let file = ElfFile64::<LittleEndian>::parse(data).map_err(|e| format!("bad ELF file: {e}"))?;
    let machine = file.elf_header().e_machine(file.endian());
    if machine != elf::EM_X86_64 {
        return Err(format!("ELF machine {machine} is not x86_64"));
    }
    Ok(file)
}

fn load_segments(file: &ElfFile64<'_, LittleEndian>) -> Vec<Segment> {
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
        .map(|ph| Segment {
            vaddr: ph.p_vaddr(endian),
            offset: ph.p_offset(endian),
            filesz: ph.p_filesz(endian),
            memsz: ph.p_memsz(endian),
            flags: ph.p_flags(endian),
        })
        .collect()
}

/// How much of a section to embed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Embed {
    Data,
    RangeOnly,
    Skip,
}

fn sections(file: &ElfFile64<'_, LittleEndian>, embed: impl Fn(&str) -> Embed) -> Vec<Section> {
    let mut out = Vec::new();
    for section in file.sections() {
        let Some(name) = canonical_name(&section) else {
            continue;
        };
        let embed = embed(name);
        if embed == Embed::Skip {
            continue;
        }
        let header = section.elf_section_header();
        let endian = file.endian();
        let mut record = Section {
            name: name.to_owned(),
            addr: header.sh_addr(endian),
            offset: header.sh_offset(endian),
            size: header.sh_size(endian),
            data: Vec::new(),
        };
        if embed == Embed::Data && header.sh_type(endian) != elf::SHT_NOBITS {
            // Unreadable or undecompressable data leaves the section without data: the
            // reader sees that it existed but was not embedded.
            if let Ok(data) = section.uncompressed_data() {
                record.size = data.len() as u64;
                record.data = data.into_owned();
            }
        }
        out.push(record);
    }
    out
}

/// The section's name, with GNU-style `.zdebug_*` (zlib-compressed) names reported as
/// `.debug_*` since their data is embedded decompressed.
fn canonical_name<'data>(
    section: &object::read::elf::ElfSection64<'data, '_, LittleEndian>,
) -> Option<&'data str> {
    let name = section.name().ok()?;
    if let Some(rest) = name.strip_prefix(".zdebug_") {
        return DEBUG_INFO_SECTIONS
            .iter()
            .chain(UNWIND_AND_SYMBOL_SECTIONS)
            .copied()
            .find(|n| n.strip_prefix(".debug_") == Some(rest));
    }
    Some(name)
}

/// The total uncompressed size of the debug info sections present.
fn debug_info_size(file: &ElfFile64<'_, LittleEndian>) -> u64 {
    file.sections()
        .filter(|s| canonical_name(s).is_some_and(|n| DEBUG_INFO_SECTIONS.contains(&n)))
        .filter(|s| s.elf_section_header().sh_type(file.endian()) != elf::SHT_NOBITS)
        .map(|s| {
            s.compressed_file_range()
                .map_or(s.size(), |r| r.uncompressed_size)
        })
        .sum()
}

type EhFrame<'a> = gimli::EhFrame<gimli::EndianSlice<'a, gimli::LittleEndian>>;

pub(crate) type Cie<'a> =
    gimli::CommonInformationEntry<gimli::EndianSlice<'a, gimli::LittleEndian>>;
type Fde<'a> = gimli::FrameDescriptionEntry<gimli::EndianSlice<'a, gimli::LittleEndian>>;

/// Calls `f` with every FDE of a binary's `.eh_frame`.
pub(crate) fn for_each_fde<'a>(
    binary: &'a Binary,
    f: impl FnMut(&Fde<'a>, &EhFrame<'a>, &gimli::BaseAddresses),
) {
    for_each_fde_of(binary, |_| true, f)
}

/// Calls `f` with every FDE of a binary's `.eh_frame` whose CIE `cie` accepts. Each CIE
/// is parsed once, and FDEs of other CIEs are not parsed at all.
pub(crate) fn for_each_fde_of<'a>(
    binary: &'a Binary,
    cie: impl Fn(&Cie<'a>) -> bool,
    mut f: impl FnMut(&Fde<'a>, &EhFrame<'a>, &gimli::BaseAddresses),
) {
    use gimli::UnwindSection;
    let Some(eh) = binary.section(".eh_frame").filter(|s| !s.data.is_empty()) else {
        return;
    };
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(eh.addr);
    if let Some(text) = binary.section(".text") {
        bases = bases.set_text(text.addr);
    }
    if let Some(hdr) = binary.section(".eh_frame_hdr") {
        bases = bases.set_eh_frame_hdr(hdr.addr);
    }
    let frame = gimli::EhFrame::new(&eh.data, gimli::LittleEndian);
    // CIEs by offset, None when `cie` refused it or it does not parse.
    let mut cies: std::collections::HashMap<usize, Option<Cie<'a>>> = Default::default();
    let mut entries = frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let offset = partial.cie_offset().0;
        let parsed = cies.entry(offset).or_insert_with(|| {
            frame
                .cie_from_offset(&bases, partial.cie_offset())
                .ok()
                .filter(|c| cie(c))
        });
        let Some(parsed) = parsed.clone() else {
            continue;
        };
        if let Ok(fde) = partial.parse(|_, _, _| Ok(parsed.clone())) {
            f(&fde, &frame, &bases);
        }
    }
}

/// The code range (SVMA) of the function symbol `name` in an ELF file's `.symtab` or
/// `.dynsym` (a binary, or the separate debug file of one).
pub fn function_symbol(data: &[u8], name: &str) -> Option<(u64, u64)> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let file = parse_x86_64(data).ok()?;
    file.symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.name() == Ok(name))
        .map(|s| (s.address(), s.address() + s.size()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::process::Command;

    /// The build ID that `readelf -n` prints for `path`, as bytes.
    fn readelf_build_id(path: &str) -> Option<Vec<u8>> {
        let out = Command::new("readelf").args(["-n", path]).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let hex = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))?;
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect()
    }

    fn names(binary: &Binary) -> Vec<&str> {
        binary.sections.iter().map(|s| s.name.as_str()).collect()
    }

    /// The libc that /bin/ls links against.
    fn libc_path() -> String {
        let out = Command::new("ldd").arg("/bin/ls").output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                let (_, rest) = l.split_once("libc.so.6 => ")?;
                Some(rest.split(' ').next()?.to_owned())
            })
            .expect("ldd /bin/ls names libc.so.6")
    }

    fn check_common(path: &str) -> Binary {
        let data = std::fs::read(path).unwrap();
        let binary = binary_record(path, &data, DebugInfo::All);
        assert_eq!(binary.error, None, "{path}");
        assert_eq!(binary.file_size, data.len() as u64);
        assert_eq!(binary.build_id, readelf_build_id(path), "{path}");
        assert!(binary.build_id.is_some(), "{path} has a build-id");
        assert_eq!(build_id(&data), binary.build_id);
        // The recorder reads only a file's head for the build-id.
        assert_eq!(
            build_id(&data[..data.len().min(64 << 10)]),
            binary.build_id,
            "{path} head"
        );
        assert!(binary.segments.iter().any(|s| s.flags & elf::PF_X != 0));
        let text = binary.section(".text").unwrap();
        assert!(text.data.is_empty() && text.size > 0 && text.addr > 0);
        let eh_frame = binary.section(".eh_frame").unwrap();
        assert_eq!(eh_frame.data.len() as u64, eh_frame.size);
        assert_eq!(
            &data[eh_frame.offset as usize..][..eh_frame.data.len()],
            &eh_frame.data[..]
        );
        binary
    }

    #[test]
    fn interpreter_of_a_dynamic_program() {
        let data = std::fs::read("/bin/ls").unwrap();
        let interp = interpreter(&data).unwrap();
        assert!(interp.contains("ld-linux"), "{interp}");
        assert_eq!(interpreter(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn stripped_pie() {
        let ls = check_common("/bin/ls");
        assert_eq!(ls.elf_type, elf::ET_DYN);
        for name in [".eh_frame_hdr", ".dynsym", ".dynstr", ".gnu_debuglink"] {
            assert!(
                ls.section(name).is_some_and(|s| !s.data.is_empty()),
                "{name}"
            );
        }
        assert!(ls.section(".symtab").is_none());
        assert!(!names(&ls).iter().any(|n| n.starts_with(".debug_info")));
        assert!(!names(&ls).contains(&".rodata"));
    }

    #[test]
    fn shared_library() {
        let libc = check_common(&libc_path());
        assert_eq!(libc.elf_type, elf::ET_DYN);
        assert!(libc.section(".dynsym").is_some_and(|s| !s.data.is_empty()));
        assert_eq!(
            libc.segments
                .iter()
                .filter(|s| s.flags & elf::PF_X != 0)
                .count(),
            1
        );
    }

    /// Compiles a tiny C program with `gcc -O2 -g` and extra `flags`, returning its bytes.
    fn compile(name: &str, flags: &[&str]) -> Option<(String, Vec<u8>)> {
        let dir = std::env::temp_dir().join(format!("lrec-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("tiny.c");
        std::fs::write(
            &src,
            "int f(int x) { return x * 3; }\nint main(int c, char **v) { return f(c); }\n",
        )
        .unwrap();
        let out = dir.join(name);
        let status = Command::new("gcc")
            .args(["-O2", "-g", "-Wl,--build-id"])
            .args(flags)
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
        let path = out.to_string_lossy().into_owned();
        Some((path, std::fs::read(&out).unwrap()))
    }

    #[test]
    fn debug_info() {
        let Some((path, data)) = compile("tiny", &[]) else {
            eprintln!("SKIPPED: gcc is not available");
            return;
        };
        let all = check_common(&path);
        for name in [
            ".symtab",
            ".strtab",
            ".debug_info",
            ".debug_abbrev",
            ".debug_line",
            ".debug_str",
        ] {
            assert!(
                all.section(name).is_some_and(|s| !s.data.is_empty()),
                "{name}"
            );
        }
        let none = binary_record(&path, &data, DebugInfo::None);
        assert!(none.section(".symtab").is_some());
        assert!(none.section(".debug_info").is_none());
        assert!(none.section(".eh_frame").is_some());
        let small = binary_record(&path, &data, DebugInfo::IfSmall(1 << 20));
        assert_eq!(small, all);
        let too_small = binary_record(&path, &data, DebugInfo::IfSmall(16));
        assert_eq!(too_small, none);
    }

    #[test]
    fn compressed_debug_info() {
        for (name, flag) in [("zlib", "-gz=zlib"), ("zstd", "-gz=zstd")] {
            let Some((path, data)) = compile(name, &[flag]) else {
                eprintln!("SKIPPED: gcc cannot {flag}");
                continue;
            };
            let (_, plain) = compile("plain", &[]).unwrap();
            let plain = binary_record(&path, &plain, DebugInfo::All);
            let binary = binary_record(&path, &data, DebugInfo::All);
            // Same DWARF up to string offsets (the producer string names the -gz flag).
            let info = binary.section(".debug_info").unwrap();
            assert_eq!(
                info.data.len(),
                plain.section(".debug_info").unwrap().data.len()
            );
            assert_eq!(info.size, info.data.len() as u64);
            let abbrev = &binary.section(".debug_abbrev").unwrap().data;
            assert_eq!(
                abbrev,
                &plain.section(".debug_abbrev").unwrap().data,
                "{flag}"
            );
            // The file really held it compressed.
            let file = ElfFile64::<LittleEndian>::parse(&data[..]).unwrap();
            let header = file.section_by_name(".debug_info").unwrap();
            let flags = header.elf_section_header().sh_flags(file.endian());
            assert_ne!(flags & u64::from(elf::SHF_COMPRESSED), 0, "{flag}");
        }
    }

    /// Rewrites the zlib-compressed `.debug_info` of `data` in place as ELFCOMPRESS_ZSTD.
    fn recompress_zstd(data: &mut [u8]) {
        let file = ElfFile64::<LittleEndian>::parse(&*data).unwrap();
        let section = file.section_by_name(".debug_info").unwrap();
        let plain = section.uncompressed_data().unwrap().into_owned();
        let (offset, size) = section.file_range().unwrap();
        // Where sh_size of .debug_info lives: e_shoff + index * e_shentsize + 32.
        let index = section.index().0 as u64;
        let shoff = file.elf_header().e_shoff(file.endian());
        let sh_size_at = (shoff + index * 64 + 32) as usize;
        let frame = zstd::bulk::compress(&plain, 19).unwrap();
        assert!(
            24 + frame.len() as u64 <= size,
            "zstd frame fits where zlib was"
        );
        let at = offset as usize;
        data[at..at + 4].copy_from_slice(&elf::ELFCOMPRESS_ZSTD.to_le_bytes());
        data[at + 24..at + 24 + frame.len()].copy_from_slice(&frame);
        data[sh_size_at..sh_size_at + 8].copy_from_slice(&(24 + frame.len() as u64).to_le_bytes());
    }

    #[test]
    fn zstd_compressed_section() {
        let Some((path, mut data)) = compile("zlib", &["-gz=zlib"]) else {
            eprintln!("SKIPPED: gcc cannot -gz=zlib");
            return;
        };
        let zlib = binary_record(&path, &data, DebugInfo::All);
        recompress_zstd(&mut data);
        let zstd = binary_record(&path, &data, DebugInfo::All);
        assert_eq!(zstd.section(".debug_info"), zlib.section(".debug_info"));
    }

    /// Prints what a Binary record embeds for a few real files: run with
    /// `cargo test embedded_sizes -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn embedded_sizes() {
        let mut paths = vec!["/bin/ls".to_owned(), libc_path()];
        paths.extend(
            std::env::var("LREC_SIZE_FILES")
                .iter()
                .flat_map(|v| v.split(':').map(String::from)),
        );
        for path in paths {
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            for debug in [DebugInfo::None, DebugInfo::All] {
                let b = binary_record(&path, &data, debug);
                let raw: Vec<u8> = b
                    .sections
                    .iter()
                    .flat_map(|s| s.data.iter().copied())
                    .collect();
                let packed = zstd::bulk::compress(&raw, 3).unwrap();
                eprintln!(
                    "{path} ({} bytes) {debug:?}: raw {} zstd-3 {}",
                    data.len(),
                    raw.len(),
                    packed.len()
                );
                for s in b.sections.iter().filter(|s| !s.data.is_empty()) {
                    let z = zstd::bulk::compress(&s.data, 3).unwrap().len();
                    eprintln!("    {:<16} {:>9} -> {:>8}", s.name, s.data.len(), z);
                }
            }
        }
    }

    #[test]
    fn not_elf() {
        let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
        let b = binary_record("garbage", &garbage, DebugInfo::All);
        assert!(
            b.error.as_deref().is_some_and(|e| e.contains("not an ELF")),
            "{:?}",
            b.error
        );
        assert!(b.sections.is_empty() && b.segments.is_empty() && b.build_id.is_none());
        assert_eq!(b.file_size, 4096);
        assert!(binary_record("empty", &[], DebugInfo::All).error.is_some());

        // A truncated ELF file: the header parses, the tables do not.
        let ls = std::fs::read("/bin/ls").unwrap();
        for len in [16, 64, 100, 1000, 5000] {
            let b = binary_record("cut", &ls[..len], DebugInfo::All);
            assert!(
                b.error.is_some() || b.sections.iter().all(|s| s.data.is_empty()),
                "{len}"
            );
        }
        // 32-bit and big-endian headers are rejected by name.
        let mut elf32 = ls.clone();
        elf32[4] = elf::ELFCLASS32; // EI_CLASS
        assert!(binary_record("x", &elf32, DebugInfo::All)
            .error
            .unwrap()
            .contains("32-bit"));
        let mut be = ls.clone();
        be[EI_DATA] = elf::ELFDATA2MSB;
        assert!(binary_record("x", &be, DebugInfo::All)
            .error
            .unwrap()
            .contains("big-endian"));
        let mut arm = ls;
        arm[18..20].copy_from_slice(&elf::EM_AARCH64.to_le_bytes());
        assert!(binary_record("x", &arm, DebugInfo::All)
            .error
            .unwrap()
            .contains("x86_64"));
    }
}

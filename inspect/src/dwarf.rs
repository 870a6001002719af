//! Struct layouts read from an ELF file's DWARF, so that the offsets of a Lua VM's
//! structures (`lua_State`, `CallInfo`, `GCproto`, …) are learned from the binary or its
//! separate debug file instead of trusted from a table of known releases.
//!
//! Big files (tarantool has 8 MB of `.debug_info`) are read in two steps. The *walk* reads
//! only the top-level entries of each unit, jumping over every subtree (function bodies,
//! namespaces, the members of structs not asked for) by its `DW_AT_sibling`, and stops as
//! soon as every requested name has a complete definition. Then only the structs found are
//! read member by member, following member types by reference. Only types at a unit's top
//! level are looked for: C's, not those in C++ namespaces.
//!
//! Debug files processed by dwz (Debian's `-dbg` packages) keep many names and types in a
//! supplementary file named by their `.gnu_debugaltlink` ([`alt_link`]); read them with
//! [`Structs::read_with_sup`]. Not supported (the names are then absent): relocatable
//! objects (`.o`, whose DWARF needs relocating) and split DWARF (`.dwo`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;

use gimli::{AttributeValue, DebuggingInformationEntry, EndianSlice, RunTimeEndian, SectionId};
use object::{Object, ObjectKind, ObjectSection};

type Slice<'d> = EndianSlice<'d, RunTimeEndian>;
type Value<'d> = AttributeValue<Slice<'d>>;
type Entry<'d> = DebuggingInformationEntry<Slice<'d>>;

/// How many struct levels deep member types are expanded: far more than C code nests, and
/// a bound on the work a malformed file (a struct that contains itself) can cause.
const MAX_DEPTH: usize = 32;
/// How many typedef/const/volatile links are followed before giving up on a loop.
const MAX_CHAIN: usize = 64;
/// How many members one read expands at most (the 17 LuaJIT structs lrec reads expand to
/// 1,300 in tarantool): a malformed file whose structs contain each other several times
/// over would otherwise take time and memory exponential in [`MAX_DEPTH`].
const MAX_MEMBERS: usize = 1 << 18;

/// The layouts of some named structs, read from an ELF file's DWARF.
#[derive(Debug, Clone, Default)]
pub struct Structs {
    layouts: HashMap<String, Layout>,
}

/// A struct's or union's size and members.
#[derive(Debug, Clone)]
struct Layout {
    size: Option<u64>,
    members: Vec<Member>,
}

/// One data member; `layout` is its type's (the element type's, for an array) when that is
/// a struct or union, so that dotted paths can go on into it.
#[derive(Debug, Clone)]
struct Member {
    /// None for an anonymous struct or union member (and a C++ base class).
    name: Option<String>,
    offset: u64,
    /// None for a bitfield, or a type without a known size.
    size: Option<u64>,
    layout: Option<Layout>,
}

impl Structs {
    /// Reads the definitions of the structs named in `names` from ELF bytes `data` (an
    /// executable, a shared library, or a separate debug file). A name is a struct tag
    /// (`struct lua_State`) or a typedef name (`typedef struct { … } GCproto;`, `typedef
    /// union GCobj …` also fine). Names not defined in the DWARF are simply absent. A file
    /// without .debug_info gives an empty set (not an error); Err only for a malformed file.
    ///
    /// Names and types that a dwz-processed file keeps in its supplementary file are
    /// absent: use [`Structs::read_with_sup`] for those.
    pub fn read(data: &[u8], names: &[&str]) -> Result<Structs, String> {
        Structs::read_with_sup(data, None, names)
    }

    /// [`Structs::read`], with the bytes of the dwz supplementary file that `data`'s
    /// `.gnu_debugaltlink` names (see [`alt_link`]; the caller finds it and checks its
    /// build-id).
    pub fn read_with_sup(
        data: &[u8],
        sup: Option<&[u8]>,
        names: &[&str],
    ) -> Result<Structs, String> {
        let file = object::File::parse(data).map_err(|e| format!("not an ELF file: {e}"))?;
        if names.is_empty()
            || file.kind() == ObjectKind::Relocatable
            || file.section_by_name(".debug_info").is_none()
        {
            return Ok(Structs::default());
        }
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let sup = sup.map(object::File::parse).transpose();
        let sup = sup.map_err(|e| format!("supplementary file: not an ELF file: {e}"))?;
        let sections = gimli::DwarfSections::load(|id| section(&file, id))?;
        let sup_sections = sup
            .as_ref()
            .map(|sup| gimli::DwarfSections::load(|id| section(sup, id)))
            .transpose()?;
        let cache = gimli::AbbreviationsCacheStrategy::Duplicates;
        let mut dwarf = sections.borrow(|data| EndianSlice::new(data, endian));
        dwarf.populate_abbreviations_cache(cache);
        if let Some(sections) = &sup_sections {
            let mut sup = sections.borrow(|data| EndianSlice::new(data, endian));
            sup.populate_abbreviations_cache(cache);
            dwarf.set_sup(sup);
        }
        let mut dies = Dies::new(&dwarf, endian);
        let malformed = |e: gimli::Error| format!("malformed DWARF: {e}");
        let found = Walk::new(names).run(&mut dies).map_err(malformed)?;
        let mut layouts = HashMap::new();
        for (name, die) in names.iter().zip(found) {
            if let Some(die) = die {
                let layout = dies.struct_layout(&die, 0).map_err(malformed)?;
                layouts.insert(name.to_string(), layout);
            }
        }
        Ok(Structs { layouts })
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.layouts.is_empty()
    }

    /// Whether the struct `name` was found.
    pub fn contains(&self, name: &str) -> bool {
        self.layouts.contains_key(name)
    }

    /// The byte offset of a member path from the start of the named struct:
    /// `"lua_State.l_G"`, `"CallInfo.u.l.savedpc"`, `"global_State.gc.total"`,
    /// `"GG_State.dispatch"`, `"TString.contents"`. Members of anonymous structs and
    /// unions are reached by their own names (C11 anonymous members are transparent), and
    /// named nested members by dotted paths. Array members give the offset of element 0.
    /// A bare struct name gives 0.
    pub fn offset(&self, path: &str) -> Option<u64> {
        self.lookup(path).map(|(offset, _)| offset)
    }

    /// sizeof the named struct, or of the member at a path (`"CallInfo.u"`). None for a
    /// bitfield.
    pub fn size(&self, path: &str) -> Option<u64> {
        self.lookup(path).and_then(|(_, size)| size)
    }

    /// The offset and size of a path.
    fn lookup(&self, path: &str) -> Option<(u64, Option<u64>)> {
        let mut parts = path.split('.');
        let top = self.layouts.get(parts.next()?)?;
        let (mut offset, mut size, mut layout) = (0u64, top.size, Some(top));
        for part in parts {
            let (at, member) = find_member(layout?, part)?;
            offset = offset.checked_add(at)?;
            size = member.size;
            layout = member.layout.as_ref();
        }
        Some((offset, size))
    }
}

/// The member `name` of `layout`, looking into anonymous members, with its offset.
fn find_member<'l>(layout: &'l Layout, name: &str) -> Option<(u64, &'l Member)> {
    layout.members.iter().find_map(|m| match &m.name {
        Some(n) if n == name => Some((m.offset, m)),
        Some(_) => None,
        None => {
            let (at, inner) = find_member(m.layout.as_ref()?, name)?;
            Some((m.offset.checked_add(at)?, inner))
        }
    })
}

/// The dwz supplementary file that a debug file shares names and types with (its
/// `.gnu_debugaltlink`): the file's path (absolute, or relative to the debug file's
/// directory) and its build-id.
pub fn alt_link(data: &[u8]) -> Option<(PathBuf, Vec<u8>)> {
    let file = object::File::parse(data).ok()?;
    let link = file.section_by_name(".gnu_debugaltlink")?.data().ok()?;
    let end = link.iter().position(|&b| b == 0)?;
    let path = std::str::from_utf8(&link[..end]).ok()?;
    let id = &link[end + 1..];
    (!path.is_empty() && !id.is_empty()).then(|| (PathBuf::from(path), id.to_vec()))
}

/// A DWARF section's bytes, decompressed if need be; empty if the file lacks it.
/// The sections a struct's layout is read from: the others (lines, locations, ranges,
/// frames: most of a big file's DWARF) are not loaded.
const LAYOUT_SECTIONS: [SectionId; 6] = [
    SectionId::DebugInfo,
    SectionId::DebugAbbrev,
    SectionId::DebugStr,
    SectionId::DebugStrOffsets,
    SectionId::DebugTypes,
    SectionId::DebugLineStr,
];

/// The largest compressed section inflated in memory (a section mapped as it is costs no
/// memory, only its pages read).
const MAX_INFLATED: u64 = 128 << 20;

fn section<'d>(file: &object::File<'d>, id: SectionId) -> Result<Cow<'d, [u8]>, String> {
    let Some(section) = file
        .section_by_name(id.name())
        .filter(|_| LAYOUT_SECTIONS.contains(&id))
    else {
        return Ok(Cow::Borrowed(&[]));
    };
    let inflated = section
        .compressed_file_range()
        .map_err(|e| format!("{}: {e}", id.name()))?
        .uncompressed_size;
    if inflated > MAX_INFLATED {
        return Err(format!(
            "{} is {} MiB uncompressed, more than lrec inflates ({} MiB)",
            id.name(),
            inflated >> 20,
            MAX_INFLATED >> 20
        ));
    }
    section
        .uncompressed_data()
        .map_err(|e| format!("{}: {e}", id.name()))
}

mod dies;
mod walk;

use dies::*;
use walk::*;
#[cfg(test)]
mod tests;

//! Entries by reference across units (and into a dwz supplementary file), and the layout
//! a struct's members give.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use gimli::constants as dw;
use gimli::{
    Abbreviations, AttributeValue, DebugInfoOffset, DebugStrOffsetsBase, DwTag, DwarfFileType,
    Reader, RunTimeEndian, SectionId, UnitHeader, UnitOffset, UnitType,
};

use super::*;

/// A unit, with what reading its entries needs.
pub(super) struct Cu<'d> {
    /// Whether the unit is in the supplementary file.
    pub(super) sup: bool,
    pub(super) header: UnitHeader<Slice<'d>>,
    pub(super) abbrevs: Arc<Abbreviations>,
    pub(super) str_offsets_base: DebugStrOffsetsBase,
}

impl Cu<'_> {
    pub(super) fn key(&self) -> UnitKey {
        unit_key(self.sup, &self.header)
    }
}

/// A unit's identity: whether in the supplementary file, whether in .debug_types, offset.
pub(super) type UnitKey = (bool, bool, usize);

pub(super) fn unit_key(sup: bool, header: &UnitHeader<Slice<'_>>) -> UnitKey {
    let in_types = header.section() == SectionId::DebugTypes;
    (sup, in_types, header.offset().0)
}

/// An entry: its unit, and its offset in the unit.
#[derive(Clone)]
pub(super) struct Die<'d> {
    pub(super) cu: Rc<Cu<'d>>,
    pub(super) offset: UnitOffset,
}

impl<'d> Die<'d> {
    pub(super) fn entry(&self) -> gimli::Result<Entry<'d>> {
        self.cu.header.entry(&self.cu.abbrevs, self.offset)
    }
}

/// An entry in a unit not kept open: its file, unit header and offset.
#[derive(Clone, Copy)]
pub(super) struct DieAt<'d> {
    pub(super) sup: bool,
    pub(super) header: UnitHeader<Slice<'d>>,
    pub(super) offset: UnitOffset,
}

/// Where a typedef leads.
pub(super) enum Target<'d> {
    Complete(Die<'d>),
    /// Only a declaration of `struct TAG` where the typedef was seen.
    Declared(&'d [u8]),
    Other,
}

/// Entries by reference, across units and into the supplementary file: the DWARF and the
/// units opened so far.
pub(super) struct Dies<'a, 'd> {
    /// The file's DWARF, with the supplementary file's as its `sup()`.
    pub(super) dwarf: &'a gimli::Dwarf<Slice<'d>>,
    pub(super) little_endian: bool,
    /// Units opened for references into them, each once.
    pub(super) cus: HashMap<UnitKey, Rc<Cu<'d>>>,
    /// The .debug_info unit headers in order, of the file and of the supplementary file,
    /// for `DW_FORM_ref_addr` and `DW_FORM_GNU_ref_alt`; read on first use.
    pub(super) headers: [Option<Vec<UnitHeader<Slice<'d>>>>; 2],
    /// Type units by signature, for `DW_FORM_ref_sig8`; read on first use.
    pub(super) signatures: Option<HashMap<u64, (UnitHeader<Slice<'d>>, UnitOffset)>>,
    /// How many more members may be expanded (see [`MAX_MEMBERS`]).
    pub(super) members_left: usize,
    /// The structs being expanded, outermost first, as (unit, offset).
    pub(super) expanding: Vec<(UnitKey, usize)>,
}

impl<'a, 'd> Dies<'a, 'd> {
    pub(super) fn new(dwarf: &'a gimli::Dwarf<Slice<'d>>, endian: RunTimeEndian) -> Self {
        Dies {
            dwarf,
            little_endian: endian == RunTimeEndian::Little,
            cus: HashMap::new(),
            headers: [None, None],
            signatures: None,
            members_left: MAX_MEMBERS,
            expanding: Vec::new(),
        }
    }

    /// The supplementary file's DWARF if `sup` (and there is one), else the file's.
    pub(super) fn file(&self, sup: bool) -> &'a gimli::Dwarf<Slice<'d>> {
        match (sup, self.dwarf.sup()) {
            (true, Some(sup)) => sup,
            _ => self.dwarf,
        }
    }

    /// A unit opened once for references into it (see [`Dies::open`]).
    pub(super) fn cu(
        &mut self,
        sup: bool,
        header: UnitHeader<Slice<'d>>,
    ) -> gimli::Result<Rc<Cu<'d>>> {
        let key = unit_key(sup, &header);
        if let Some(cu) = self.cus.get(&key) {
            return Ok(cu.clone());
        }
        let cu = Rc::new(self.open(sup, header)?);
        self.cus.insert(key, cu.clone());
        Ok(cu)
    }

    /// Opens a unit: its abbreviations, and the string offsets base from its root entry.
    pub(super) fn open(&self, sup: bool, header: UnitHeader<Slice<'d>>) -> gimli::Result<Cu<'d>> {
        let abbrevs = self.file(sup).abbreviations(&header)?;
        let mut str_offsets_base = DebugStrOffsetsBase::default_for_encoding_and_file(
            header.encoding(),
            DwarfFileType::Main,
        );
        let mut raw = header.entries_raw(&abbrevs, None)?;
        if let Some(root) = raw.read_abbreviation()? {
            for spec in root.attributes() {
                if spec.name() == dw::DW_AT_str_offsets_base {
                    if let AttributeValue::DebugStrOffsetsBase(base) =
                        raw.read_attribute(*spec)?.value()
                    {
                        str_offsets_base = base;
                    }
                } else {
                    raw.skip_attributes(std::slice::from_ref(spec))?;
                }
            }
        }
        Ok(Cu {
            sup,
            header,
            abbrevs,
            str_offsets_base,
        })
    }

    /// A string attribute's bytes, in any of the string forms.
    pub(super) fn string(&self, cu: &Cu<'d>, value: Value<'d>) -> Option<&'d [u8]> {
        let dwarf = self.file(cu.sup);
        let s = match value {
            AttributeValue::String(s) => s,
            AttributeValue::DebugStrRef(o) => dwarf.string(o).ok()?,
            AttributeValue::DebugStrRefSup(o) => self.dwarf.sup()?.string(o).ok()?,
            AttributeValue::DebugLineStrRef(o) => dwarf.line_string(o).ok()?,
            AttributeValue::DebugStrOffsetsIndex(i) => {
                let format = cu.header.format();
                let o = dwarf
                    .debug_str_offsets
                    .get_str_offset(format, cu.str_offsets_base, i);
                dwarf.string(o.ok()?).ok()?
            }
            _ => return None,
        };
        Some(s.slice())
    }

    /// The entry a reference attribute of an entry of `from` points to.
    pub(super) fn follow(
        &mut self,
        from: &Die<'d>,
        value: Value<'d>,
    ) -> gimli::Result<Option<Die<'d>>> {
        match value {
            AttributeValue::UnitRef(offset) => Ok(Some(Die {
                cu: from.cu.clone(),
                offset,
            })),
            AttributeValue::DebugInfoRef(offset) => self.die_at(from.cu.sup, offset),
            AttributeValue::DebugInfoRefSup(offset) => self.die_at(true, offset),
            AttributeValue::DebugTypesRef(signature) => self.signature(signature.0),
            _ => Ok(None),
        }
    }

    /// The entry at a .debug_info offset of the file or the supplementary file, in
    /// whichever unit holds it.
    pub(super) fn die_at(
        &mut self,
        sup: bool,
        at: DebugInfoOffset,
    ) -> gimli::Result<Option<Die<'d>>> {
        if sup && self.dwarf.sup().is_none() {
            return Ok(None);
        }
        let file = self.file(sup);
        if self.headers[usize::from(sup)].is_none() {
            let mut headers = Vec::new();
            let mut units = file.units();
            while let Some(header) = units.next()? {
                headers.push(header);
            }
            self.headers[usize::from(sup)] = Some(headers);
        }
        let headers = self.headers[usize::from(sup)]
            .as_deref()
            .unwrap_or_default();
        let after = headers.partition_point(|h| h.offset().0 <= at.0);
        let Some(header) = after.checked_sub(1).map(|i| headers[i]) else {
            return Ok(None);
        };
        let Some(offset) = at.to_unit_offset(&header) else {
            return Ok(None);
        };
        Ok(Some(Die {
            cu: self.cu(sup, header)?,
            offset,
        }))
    }

    /// The type a type unit with this signature defines.
    pub(super) fn signature(&mut self, signature: u64) -> gimli::Result<Option<Die<'d>>> {
        if self.signatures.is_none() {
            let mut map = HashMap::new();
            let mut note = |header: UnitHeader<Slice<'d>>| match header.type_() {
                UnitType::Type {
                    type_signature,
                    type_offset,
                }
                | UnitType::SplitType {
                    type_signature,
                    type_offset,
                } => {
                    map.entry(type_signature.0).or_insert((header, type_offset));
                }
                _ => {}
            };
            let mut units = self.dwarf.units();
            while let Some(header) = units.next()? {
                note(header);
            }
            let mut units = self.dwarf.type_units();
            while let Some(header) = units.next()? {
                note(header);
            }
            self.signatures = Some(map);
        }
        let Some((header, offset)) = self.signatures.as_ref().and_then(|m| m.get(&signature))
        else {
            return Ok(None);
        };
        let (header, offset) = (*header, *offset);
        Ok(Some(Die {
            cu: self.cu(false, header)?,
            offset,
        }))
    }

    /// The entry an entry's `DW_AT_type` names (None for void).
    pub(super) fn type_of(
        &mut self,
        die: &Die<'d>,
        entry: &Entry<'d>,
    ) -> gimli::Result<Option<Die<'d>>> {
        match entry.attr_value(dw::DW_AT_type) {
            Some(value) => self.follow(die, value),
            None => Ok(None),
        }
    }

    /// Follows typedefs and qualifiers from `die` to a struct or union.
    pub(super) fn resolve(&mut self, mut die: Die<'d>) -> gimli::Result<Target<'d>> {
        for _ in 0..MAX_CHAIN {
            let entry = die.entry()?;
            let next = match entry.tag() {
                tag if is_alias(tag) => self.type_of(&die, &entry)?,
                tag if is_struct(tag) && !is_declaration(&entry) => {
                    return Ok(Target::Complete(die))
                }
                tag if is_struct(tag) => match entry.attr_value(dw::DW_AT_signature) {
                    Some(signature) => self.follow(&die, signature)?,
                    None => {
                        let name = entry.attr_value(dw::DW_AT_name);
                        let name = name.and_then(|v| self.string(&die.cu, v));
                        return Ok(name.map_or(Target::Other, Target::Declared));
                    }
                },
                _ => None,
            };
            match next {
                Some(next) => die = next,
                None => return Ok(Target::Other),
            }
        }
        Ok(Target::Other)
    }

    /// The members of the struct or union at `die`, with their types expanded.
    /// A struct met again inside itself (only in a malformed file) gets no members.
    pub(super) fn struct_layout(&mut self, die: &Die<'d>, depth: usize) -> gimli::Result<Layout> {
        let key = (die.cu.key(), die.offset.0);
        let mut found = Vec::new();
        let mut tree = die
            .cu
            .header
            .entries_tree(&die.cu.abbrevs, Some(die.offset))?;
        let root = tree.root()?;
        let size = byte_size(root.entry());
        if self.expanding.contains(&key) {
            return Ok(Layout {
                size,
                members: Vec::new(),
            });
        }
        let mut children = root.children();
        while let Some(child) = children.next()? {
            let Some(left) = self.members_left.checked_sub(1) else {
                break;
            };
            self.members_left = left;
            let entry = child.entry();
            let base_class = entry.tag() == dw::DW_TAG_inheritance;
            let is_static = is_declaration(entry) || entry.attr(dw::DW_AT_external).is_some();
            if !(entry.tag() == dw::DW_TAG_member || base_class) || is_static {
                continue;
            }
            let name = entry.attr_value(dw::DW_AT_name).filter(|_| !base_class);
            let name = name.and_then(|v| self.string(&die.cu, v));
            let place = Place::of(entry);
            let ty = entry.attr_value(dw::DW_AT_type);
            found.push(Unread { name, place, ty });
        }
        self.expanding.push(key);
        let members = self.members(die, found, depth);
        self.expanding.pop();
        Ok(Layout {
            size,
            members: members?,
        })
    }

    /// Members from their names, places and types, with the types expanded.
    pub(super) fn members(
        &mut self,
        die: &Die<'d>,
        found: Vec<Unread<'d>>,
        depth: usize,
    ) -> gimli::Result<Vec<Member>> {
        let mut members = Vec::with_capacity(found.len());
        for Unread { name, place, ty } in found {
            let ty = match ty {
                Some(ty) => self.follow(die, ty)?,
                None => None,
            };
            let ty = match ty {
                Some(ty) => self.type_info(ty, depth)?,
                None => TypeInfo::default(),
            };
            let Some(offset) = place.and_then(|p| p.offset(ty.size, self.little_endian)) else {
                continue;
            };
            let bitfield = place.is_some_and(|p| p.bit_size.is_some());
            members.push(Member {
                name: name.map(|n| String::from_utf8_lossy(n).into_owned()),
                offset,
                size: ty.size.filter(|_| !bitfield),
                layout: ty.layout,
            });
        }
        Ok(members)
    }

    /// The size of the type at `die`, and its members if it is a struct or union (or an
    /// array of them).
    pub(super) fn type_info(&mut self, mut die: Die<'d>, depth: usize) -> gimli::Result<TypeInfo> {
        for _ in 0..MAX_CHAIN {
            let entry = die.entry()?;
            let size = byte_size(&entry);
            let next = match entry.tag() {
                tag if is_alias(tag) => self.type_of(&die, &entry)?,
                tag if is_struct(tag) && is_declaration(&entry) => {
                    match entry.attr_value(dw::DW_AT_signature) {
                        Some(signature) => self.follow(&die, signature)?,
                        None => None,
                    }
                }
                tag if is_struct(tag) && depth < MAX_DEPTH => {
                    let layout = self.struct_layout(&die, depth + 1)?;
                    return Ok(TypeInfo {
                        size: layout.size,
                        layout: Some(layout),
                    });
                }
                dw::DW_TAG_array_type if depth < MAX_DEPTH => {
                    return self.array_info(&die, &entry, depth)
                }
                dw::DW_TAG_pointer_type
                | dw::DW_TAG_reference_type
                | dw::DW_TAG_rvalue_reference_type => {
                    let size = size.or(Some(u64::from(die.cu.header.address_size())));
                    return Ok(TypeInfo { size, layout: None });
                }
                _ => return Ok(TypeInfo { size, layout: None }),
            };
            match next {
                Some(next) => die = next,
                None => return Ok(TypeInfo::default()),
            }
        }
        Ok(TypeInfo::default())
    }

    /// An array's size (element size × the product of its dimensions), and its element
    /// type's members.
    pub(super) fn array_info(
        &mut self,
        die: &Die<'d>,
        entry: &Entry<'d>,
        depth: usize,
    ) -> gimli::Result<TypeInfo> {
        let element = match self.type_of(die, entry)? {
            Some(element) => self.type_info(element, depth + 1)?,
            None => TypeInfo::default(),
        };
        let mut count = Some(1u64);
        let mut dimensions = 0;
        let mut tree = die
            .cu
            .header
            .entries_tree(&die.cu.abbrevs, Some(die.offset))?;
        let mut children = tree.root()?.children();
        while let Some(child) = children.next()? {
            if child.entry().tag() == dw::DW_TAG_subrange_type {
                dimensions += 1;
                count = count
                    .zip(dimension(child.entry()))
                    .and_then(|(a, b)| a.checked_mul(b));
            }
        }
        let computed = count.filter(|_| dimensions > 0).zip(element.size);
        let size = byte_size(entry).or(computed.and_then(|(n, size)| n.checked_mul(size)));
        Ok(TypeInfo {
            size,
            layout: element.layout,
        })
    }
}

/// A member as its entry says, its type not yet read.
pub(super) struct Unread<'d> {
    pub(super) name: Option<&'d [u8]>,
    /// None when its location is not one [`Place::of`] reads.
    pub(super) place: Option<Place>,
    pub(super) ty: Option<Value<'d>>,
}

/// What a member's type gives it: a size, and members if it is a struct or union.
#[derive(Default)]
pub(super) struct TypeInfo {
    pub(super) size: Option<u64>,
    pub(super) layout: Option<Layout>,
}

/// Where a member is, as its attributes say.
#[derive(Clone, Copy)]
pub(super) struct Place {
    /// `DW_AT_data_member_location` (0 when absent: union members, DWARF 5 bitfields).
    pub(super) location: u64,
    /// DWARF 4+ bitfields: bits from the start of the containing struct.
    pub(super) data_bit_offset: Option<u64>,
    /// DWARF 2/3 bitfields: bits from the most significant bit of the storage unit.
    pub(super) bit_offset: Option<i64>,
    pub(super) bit_size: Option<u64>,
    /// The storage unit's size, for `bit_offset`.
    pub(super) byte_size: Option<u64>,
}

impl Place {
    /// None when the location is not a constant or `DW_OP_plus_uconst N`.
    pub(super) fn of(entry: &Entry<'_>) -> Option<Place> {
        let location = match entry.attr_value(dw::DW_AT_data_member_location) {
            None => 0,
            Some(AttributeValue::Exprloc(expr)) => plus_uconst(expr.0)?,
            Some(value) => value.udata_value()?,
        };
        let value = |at| entry.attr(at).map(|a| a.value());
        Some(Place {
            location,
            data_bit_offset: value(dw::DW_AT_data_bit_offset).and_then(|v| v.udata_value()),
            bit_offset: value(dw::DW_AT_bit_offset).and_then(|v| v.sdata_value()),
            bit_size: value(dw::DW_AT_bit_size).and_then(|v| v.udata_value()),
            byte_size: byte_size(entry),
        })
    }

    /// The byte offset; for a bitfield, of the byte that holds its lowest-addressed bit.
    pub(super) fn offset(self, type_size: Option<u64>, little_endian: bool) -> Option<u64> {
        if let Some(bits) = self.data_bit_offset {
            return self.location.checked_add(bits / 8);
        }
        let (Some(bit_offset), Some(bit_size)) = (self.bit_offset, self.bit_size) else {
            return Some(self.location);
        };
        // DW_AT_bit_offset counts from the storage unit's most significant bit, which is
        // its last byte on a little-endian machine.
        let first_bit = if little_endian {
            let storage_bits = self.byte_size.or(type_size)?.checked_mul(8)?;
            i128::from(storage_bits) - i128::from(bit_offset) - i128::from(bit_size)
        } else {
            i128::from(bit_offset)
        };
        let byte = u64::try_from(first_bit.div_euclid(8)).ok()?;
        self.location.checked_add(byte)
    }
}

/// `DW_OP_plus_uconst N` (how DWARF 2/3 producers wrote member offsets) as N.
pub(super) fn plus_uconst(mut expr: Slice<'_>) -> Option<u64> {
    let op = expr.read_u8().ok()?;
    let n = (op == dw::DW_OP_plus_uconst.0).then(|| expr.read_uleb128().ok())??;
    expr.is_empty().then_some(n)
}

/// The element count of an array dimension (`DW_AT_count`, or the bounds).
pub(super) fn dimension(entry: &Entry<'_>) -> Option<u64> {
    if let Some(count) = entry.attr_value(dw::DW_AT_count) {
        return count.udata_value();
    }
    let lower = match entry.attr_value(dw::DW_AT_lower_bound) {
        Some(lower) => lower.udata_value()?,
        None => 0,
    };
    // Bounds are unsigned (C's size_t), except that old producers wrote `T a[0]` with
    // an upper bound of -1: signed, or all ones in 4 or 8 bytes. (One byte of all ones is
    // `T a[256]`.)
    let upper = match entry.attr_value(dw::DW_AT_upper_bound)? {
        AttributeValue::Sdata(-1)
        | AttributeValue::Data4(u32::MAX)
        | AttributeValue::Data8(u64::MAX)
        | AttributeValue::Udata(u64::MAX) => return Some(0),
        upper => upper.udata_value()?,
    };
    upper.checked_sub(lower)?.checked_add(1)
}

pub(super) fn byte_size(entry: &Entry<'_>) -> Option<u64> {
    entry
        .attr_value(dw::DW_AT_byte_size)
        .and_then(|v| v.udata_value())
}

pub(super) fn is_declaration(entry: &Entry<'_>) -> bool {
    matches!(
        entry.attr_value(dw::DW_AT_declaration),
        Some(AttributeValue::Flag(true))
    )
}

pub(super) fn is_struct(tag: DwTag) -> bool {
    matches!(
        tag,
        dw::DW_TAG_structure_type | dw::DW_TAG_union_type | dw::DW_TAG_class_type
    )
}

/// Tags that only name or qualify another type.
pub(super) fn is_alias(tag: DwTag) -> bool {
    matches!(
        tag,
        dw::DW_TAG_typedef
            | dw::DW_TAG_const_type
            | dw::DW_TAG_volatile_type
            | dw::DW_TAG_restrict_type
            | dw::DW_TAG_atomic_type
            | dw::DW_TAG_immutable_type
            | dw::DW_TAG_packed_type
            | dw::DW_TAG_shared_type
    )
}

//! The walk over the units' top-level entries, looking for the requested names.

use std::collections::HashMap;
use std::rc::Rc;

use gimli::constants as dw;
use gimli::{AttributeSpecification, AttributeValue, DwTag, UnitHeader, UnitOffset};

use super::dies::*;
use super::*;

/// The walk over the units' top-level entries, looking for the requested names.
pub(super) struct Walk<'n, 'd> {
    pub(super) names: &'n [&'n str],
    pub(super) found: Vec<Option<Die<'d>>>,
    /// For a typedef seen only with a declared struct: that struct's tag.
    pub(super) pending: Vec<Option<&'d [u8]>>,
    /// The first complete definition of every named struct or union seen so far, by tag,
    /// for typedefs whose struct is defined in another unit (maybe an earlier one).
    pub(super) tags: HashMap<&'d [u8], DieAt<'d>>,
    pub(super) attrs: Vec<gimli::Attribute<Slice<'d>>>,
}

impl<'n, 'd> Walk<'n, 'd> {
    pub(super) fn new(names: &'n [&'n str]) -> Self {
        Walk {
            names,
            found: vec![None; names.len()],
            pending: vec![None; names.len()],
            tags: HashMap::new(),
            attrs: Vec::new(),
        }
    }

    /// The definition found for each name, in order: walks the file's units, its type
    /// units, then the supplementary file's units.
    pub(super) fn run(mut self, dies: &mut Dies<'_, 'd>) -> gimli::Result<Vec<Option<Die<'d>>>> {
        let dwarf = dies.dwarf;
        let mut units = dwarf.units();
        while let Some(header) = units.next()? {
            if self.unit(dies, false, header)? {
                return Ok(self.found);
            }
        }
        let mut units = dwarf.type_units();
        while let Some(header) = units.next()? {
            if self.unit(dies, false, header)? {
                return Ok(self.found);
            }
        }
        if let Some(sup) = dwarf.sup() {
            let mut units = sup.units();
            while let Some(header) = units.next()? {
                if self.unit(dies, true, header)? {
                    break;
                }
            }
        }
        Ok(self.found)
    }

    /// Walks one unit's top-level entries; true once every name is found.
    pub(super) fn unit(
        &mut self,
        dies: &mut Dies<'_, 'd>,
        sup: bool,
        header: UnitHeader<Slice<'d>>,
    ) -> gimli::Result<bool> {
        // Not `dies.cu`: units walked past are not kept (nor their abbreviations).
        let cu = Rc::new(dies.open(sup, header)?);
        let mut raw = cu.header.entries_raw(&cu.abbrevs, None)?;
        let Some(root) = raw.read_abbreviation()? else {
            return Ok(false);
        };
        raw.skip_attributes(root.attributes())?;
        // The depth of the root's children as `raw` counts it (reset by each jump).
        let mut top = raw.next_depth();
        while root.has_children() && !raw.is_empty() {
            // A big file's walk is work of the binary's budget (crate::budget): out of it,
            // the names not found yet stay absent (the caller sees why).
            if !crate::budget::charge(1) {
                return Ok(true);
            }
            let (depth, offset) = (raw.next_depth(), raw.next_offset());
            let Some(abbrev) = raw.read_abbreviation()? else {
                if depth <= top {
                    break; // The end of the root's children.
                }
                continue;
            };
            if depth != top {
                // Inside a subtree without a DW_AT_sibling: skip it entry by entry.
                raw.skip_attributes(abbrev.attributes())?;
                continue;
            }
            let sibling = if is_struct(abbrev.tag()) || abbrev.tag() == dw::DW_TAG_typedef {
                raw.read_attributes(abbrev.attributes(), &mut self.attrs)?;
                self.note(dies, &cu, abbrev.tag(), offset)?;
                let sibling = self.attrs.iter().find(|a| a.name() == dw::DW_AT_sibling);
                sibling.map(|a| a.value())
            } else if abbrev.has_children() {
                sibling_attr(&mut raw, abbrev.attributes())?
            } else {
                raw.skip_attributes(abbrev.attributes())?;
                None
            };
            if let (true, Some(AttributeValue::UnitRef(sibling))) = (abbrev.has_children(), sibling)
            {
                if sibling > raw.next_offset() {
                    raw = cu.header.entries_raw(&cu.abbrevs, Some(sibling))?;
                    top = raw.next_depth();
                }
            }
        }
        for (found, pending) in self.found.iter_mut().zip(&self.pending) {
            if let (None, Some(at)) = (&found, pending.and_then(|tag| self.tags.get(tag))) {
                let cu = dies.cu(at.sup, at.header)?;
                *found = Some(Die {
                    cu,
                    offset: at.offset,
                });
            }
        }
        Ok(self.found.iter().all(Option::is_some))
    }

    /// Notes a top-level struct, union or typedef, whose attributes are in `self.attrs`.
    pub(super) fn note(
        &mut self,
        dies: &mut Dies<'_, 'd>,
        cu: &Rc<Cu<'d>>,
        tag: DwTag,
        offset: UnitOffset,
    ) -> gimli::Result<()> {
        let value = |at| {
            self.attrs
                .iter()
                .find(|a| a.name() == at)
                .map(|a| a.value())
        };
        let Some(name) = value(dw::DW_AT_name).and_then(|v| dies.string(cu, v)) else {
            return Ok(());
        };
        let complete = !matches!(
            value(dw::DW_AT_declaration),
            Some(AttributeValue::Flag(true))
        );
        let die = || Die {
            cu: cu.clone(),
            offset,
        };
        if is_struct(tag) && complete {
            let (sup, header) = (cu.sup, cu.header);
            let at = DieAt {
                sup,
                header,
                offset,
            };
            self.tags.entry(name).or_insert(at);
        }
        let Some(i) = self.names.iter().position(|n| n.as_bytes() == name) else {
            return Ok(());
        };
        if self.found[i].is_some() {
            return Ok(());
        }
        if tag != dw::DW_TAG_typedef {
            self.found[i] = complete.then(die);
            return Ok(());
        }
        match dies.resolve(die())? {
            Target::Complete(def) => self.found[i] = Some(def),
            Target::Declared(tag) => {
                self.pending[i].get_or_insert(tag);
            }
            Target::Other => {}
        }
        Ok(())
    }
}

/// Reads an entry's attributes for its `DW_AT_sibling`, skipping the others.
pub(super) fn sibling_attr<'d>(
    raw: &mut gimli::EntriesRaw<'_, Slice<'d>>,
    specs: &[AttributeSpecification],
) -> gimli::Result<Option<Value<'d>>> {
    let mut sibling = None;
    for spec in specs {
        if spec.name() == dw::DW_AT_sibling {
            sibling = Some(raw.read_attribute(*spec)?.value());
        } else {
            raw.skip_attributes(std::slice::from_ref(spec))?;
        }
    }
    Ok(sibling)
}

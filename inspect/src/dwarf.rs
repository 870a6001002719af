//! Struct layouts from DWARF (being written).

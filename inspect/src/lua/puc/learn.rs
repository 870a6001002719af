//! Learning a PUC Lua build's layout (being written).

//! TODO(issue 9): differential outputs.

use std::io::{self, Write};

use super::StackOptions;
use crate::Profile;

pub fn write_diff_folded(
    _before: &Profile,
    _after: &Profile,
    _opts: StackOptions,
    _out: &mut dyn Write,
) -> io::Result<()> {
    Err(io::Error::other("not implemented yet"))
}

pub fn write_diff_flamegraph(
    _before: &Profile,
    _after: &Profile,
    _opts: StackOptions,
    _out: &mut dyn Write,
) -> io::Result<()> {
    Err(io::Error::other("not implemented yet"))
}

pub fn write_diff_top(
    _before: &Profile,
    _after: &Profile,
    _n: usize,
    _out: &mut dyn Write,
) -> io::Result<()> {
    Err(io::Error::other("not implemented yet"))
}

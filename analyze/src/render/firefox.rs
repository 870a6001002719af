//! TODO(issue 9): firefox output.

use std::io::{self, Write};

use crate::Profile;

/// Not yet written.
pub fn write_firefox(_profile: &Profile, _out: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::other("--firefox is not implemented yet"))
}

//! Where the recorder's records go: a capture file ([`crate::capture_file`]), or the
//! flight recorder's memory ([`Flight`]).

use std::io;

use lrec_format::{CaptureSink, Chunk};

use crate::capture_file::CaptureFile;
use crate::flight::Flight;

/// The records' destination.
pub enum Output {
    /// A capture file, written as recording goes.
    File(CaptureFile),
    /// The flight recorder's window, written out on demand.
    Flight(Box<Flight>),
}

impl Output {
    pub fn flight(&self) -> Option<&Flight> {
        match self {
            Output::File(_) => None,
            Output::Flight(f) => Some(f),
        }
    }

    pub fn flight_mut(&mut self) -> Option<&mut Flight> {
        match self {
            Output::File(_) => None,
            Output::Flight(f) => Some(f),
        }
    }
}

impl CaptureSink for Output {
    fn write_file_header(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::File(f) => f.write_file_header(bytes),
            Output::Flight(f) => f.write_file_header(bytes),
        }
    }

    fn write_chunk(&mut self, chunk: Chunk) -> io::Result<()> {
        match self {
            Output::File(f) => f.write_chunk(chunk),
            Output::Flight(f) => f.write_chunk(chunk),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::File(f) => CaptureSink::flush(f),
            Output::Flight(f) => f.flush(),
        }
    }
}

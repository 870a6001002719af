//! `lanalyze CAPTURE --embed-symbols -o OUT.lrec`: the capture again, each binary's record
//! completed with what this machine supplied (local files, separate debug files,
//! debuginfod), so that the copy names everything with `--offline` on any machine: what a
//! bug report should carry.

use std::collections::HashSet;
use std::io::Write;

use lrec_format::{Binary, Capture, CaptureWriter, FormatError, Record};

use crate::analysis;
use crate::image::Image;
use crate::metadata::BinaryKey;
use crate::{AnalyzeError, BinaryLocator, Options};

/// A binary whose record the copy completes.
#[derive(Debug, Clone)]
pub struct Completed {
    pub path: String,
    /// What names it now (see [`crate::BinaryNames::names_from`]).
    pub names_from: String,
}

/// Writes `capture` to `out` with its binaries completed by `locator`; returns the
/// binaries completed.
pub fn write_with_symbols(
    capture: &Capture,
    opts: &Options,
    locator: &dyn BinaryLocator,
    out: impl Write,
) -> Result<Vec<Completed>, EmbedError> {
    if crate::strip::is_stripped(&crate::metadata::read_metadata(capture)) {
        return Err(EmbedError::Stripped);
    }
    let (profile, images) = analysis::run_with_images(capture, opts, locator)?;
    // Binaries that samples ran in: the others need no names.
    let sampled = |i: usize| profile.binary_names.get(i).is_some_and(|n| n.samples > 0);
    let completed: Vec<&Image> = images
        .iter()
        .enumerate()
        .filter(|&(i, image)| image.completed() && sampled(i))
        .map(|(_, image)| image)
        .collect();
    let mut w = CaptureWriter::new(out, &profile.header)?;
    w.set_level(3);
    let mut written: HashSet<BinaryKey<'_>> = HashSet::new();
    for chunk in capture.chunks() {
        let (records, _) = capture.decode_chunk(chunk);
        for record in records {
            match record {
                // The writer wrote it first.
                Record::Header(_) => {}
                Record::Binary(b) => {
                    let key = BinaryKey::of(&b.build_id, &b.path);
                    let image = completed
                        .iter()
                        .find(|i| BinaryKey::of(&i.build_id, &i.path) == key);
                    match image {
                        Some(image) => {
                            if written.insert(BinaryKey::of(&image.build_id, &image.path)) {
                                w.push(&Record::Binary(complete(b, image)))?;
                            }
                        }
                        None => w.push(&Record::Binary(b))?,
                    }
                }
                r => w.push(&r)?,
            }
        }
        w.flush()?;
    }
    w.finish()?;
    Ok(completed
        .iter()
        .map(|i| Completed {
            path: i.path.clone(),
            names_from: i.names_from(),
        })
        .collect())
}

/// `binary` with the segments and sections of its completed image.
fn complete(binary: Binary, image: &Image) -> Binary {
    Binary {
        segments: image.segments.clone(),
        sections: image.sections().to_vec(),
        error: if image.has_unwind_info() {
            None
        } else {
            binary.error
        },
        ..binary
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Analyze(#[from] AnalyzeError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(
        "the capture is stripped (`--strip`): it holds names already and no binaries to \
         complete; run --embed-symbols on the original capture"
    )]
    Stripped,
}

//! The markers of the Firefox profile: the capture's counts and warnings on the main
//! thread, and each call `lrec --latency-events` timed on its thread.

use fxprof_processed_profile::{
    CategoryHandle, MarkerFieldFlags, MarkerFieldFormat, MarkerTiming, Profile as FxProfile,
    StaticSchemaMarker, StaticSchemaMarkerField, StringHandle, ThreadHandle,
};
use rustc_hash::FxHashMap;

use super::Clock;
use crate::{Latencies, Profile};

/// Markers spanning the samples: the capture's counts, lost samples, and each warning.
pub(super) fn add_markers(
    profile: &Profile,
    clock: &Clock,
    fx: &mut FxProfile,
    thread: ThreadHandle,
) {
    let s = &profile.stats;
    let (Some(first), Some(last)) = (
        profile.samples.iter().map(|s| s.time_ns).min(),
        profile.samples.iter().map(|s| s.time_ns).max(),
    ) else {
        return;
    };
    let span = || MarkerTiming::Interval(clock.at(first), clock.at(last));
    let ended = profile
        .end_reason
        .as_deref()
        .unwrap_or("cut short (no end record)");
    let capture = CaptureMarker {
        samples: s.samples,
        lost: s.lost,
        truncated: s.truncated,
        failed_unwinds: s.failed_unwinds,
        ended: fx.intern_string(ended),
    };
    fx.add_marker(thread, span(), capture);
    if s.lost > 0 {
        fx.add_marker(thread, span(), LostMarker { lost: s.lost });
    }
    for w in &profile.warnings {
        let marker = WarningMarker {
            message: fx.intern_string(&w.message),
            count: w.count,
        };
        fx.add_marker(thread, span(), marker);
    }
}

/// Each timed call as an interval marker named after its probe, on its thread's track
/// (`threads`, by (pid, tid)).
pub(super) fn add_latency_markers(
    l: &Latencies,
    clock: &Clock,
    fx: &mut FxProfile,
    threads: &FxHashMap<(u32, u32), ThreadHandle>,
) {
    let mut names: FxHashMap<u32, StringHandle> = FxHashMap::default();
    for p in &l.record.probes {
        names.insert(p.id, fx.intern_string(&p.name));
    }
    for c in &l.calls {
        let (Some(&thread), Some(&name)) = (threads.get(&(c.pid, c.tid)), names.get(&c.probe))
        else {
            continue;
        };
        let end = c.start_ns.saturating_add(c.duration_ns);
        let timing = MarkerTiming::Interval(clock.at(c.start_ns), clock.at(end));
        fx.add_marker(thread, timing, LatencyMarker { name });
    }
}

const fn field(
    key: &'static str,
    label: &'static str,
    format: MarkerFieldFormat,
) -> StaticSchemaMarkerField {
    StaticSchemaMarkerField {
        key,
        label,
        format,
        flags: MarkerFieldFlags::SEARCHABLE,
    }
}

/// What the capture holds and how well it unwound.
struct CaptureMarker {
    samples: u64,
    lost: u64,
    truncated: u64,
    failed_unwinds: u64,
    ended: StringHandle,
}

impl StaticSchemaMarker for CaptureMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "LrecCapture";
    const DESCRIPTION: Option<&'static str> = Some("The lrec capture: its counts of samples");
    const TABLE_LABEL: Option<&'static str> = Some(
        "{marker.data.samples} samples, {marker.data.lost} lost, {marker.data.truncated} \
         truncated, {marker.data.failedUnwinds} failed unwinds; ended: {marker.data.ended}",
    );
    const FIELDS: &'static [StaticSchemaMarkerField] = &[
        field("samples", "Samples", MarkerFieldFormat::Integer),
        field("lost", "Lost samples", MarkerFieldFormat::Integer),
        field("truncated", "Truncated stacks", MarkerFieldFormat::Integer),
        field(
            "failedUnwinds",
            "Failed unwinds",
            MarkerFieldFormat::Integer,
        ),
        field("ended", "Ended", MarkerFieldFormat::String),
    ];

    fn name(&self, fx: &mut FxProfile) -> StringHandle {
        fx.intern_string("Capture")
    }

    fn category(&self, _: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _: u32) -> StringHandle {
        self.ended
    }

    fn number_field_value(&self, field_index: u32) -> f64 {
        [self.samples, self.lost, self.truncated, self.failed_unwinds][field_index as usize] as f64
    }
}

/// Samples the kernel dropped; the capture counts them but does not say when.
struct LostMarker {
    lost: u64,
}

impl StaticSchemaMarker for LostMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "LrecLostSamples";
    const DESCRIPTION: Option<&'static str> =
        Some("Samples the kernel dropped (its buffer was full); when is not recorded");
    const CHART_LABEL: Option<&'static str> = Some("{marker.data.lost} samples lost");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.data.lost} samples lost");
    const FIELDS: &'static [StaticSchemaMarkerField] =
        &[field("lost", "Lost samples", MarkerFieldFormat::Integer)];

    fn name(&self, fx: &mut FxProfile) -> StringHandle {
        fx.intern_string("Lost samples")
    }

    fn category(&self, _: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _: u32) -> StringHandle {
        unreachable!("LostMarker has no string field")
    }

    fn number_field_value(&self, _: u32) -> f64 {
        self.lost as f64
    }
}

/// A problem lanalyze met, and how often.
struct WarningMarker {
    message: StringHandle,
    count: u64,
}

impl StaticSchemaMarker for WarningMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "LrecWarning";
    const DESCRIPTION: Option<&'static str> = Some("A problem met while analysing the capture");
    const CHART_LABEL: Option<&'static str> = Some("{marker.data.message}");
    const TABLE_LABEL: Option<&'static str> =
        Some("{marker.data.message} ({marker.data.count} times)");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[
        field("message", "Message", MarkerFieldFormat::String),
        field("count", "Times", MarkerFieldFormat::Integer),
    ];

    fn name(&self, fx: &mut FxProfile) -> StringHandle {
        fx.intern_string("Warning")
    }

    fn category(&self, _: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _: u32) -> StringHandle {
        self.message
    }

    fn number_field_value(&self, _: u32) -> f64 {
        self.count as f64
    }
}

/// A call `lrec --latency-events` timed, from its entry to its return.
struct LatencyMarker {
    /// Its probe's name.
    name: StringHandle,
}

impl StaticSchemaMarker for LatencyMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "LrecLatency";
    const DESCRIPTION: Option<&'static str> =
        Some("A call lrec timed (--latency-events), from its entry to its return");
    const CHART_LABEL: Option<&'static str> = Some("{marker.name}");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.name}");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[];

    fn name(&self, _: &mut FxProfile) -> StringHandle {
        self.name
    }

    fn category(&self, _: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _: u32) -> StringHandle {
        unreachable!("LatencyMarker has no field")
    }

    fn number_field_value(&self, _: u32) -> f64 {
        unreachable!("LatencyMarker has no field")
    }
}

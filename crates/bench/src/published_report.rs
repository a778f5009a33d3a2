//! What `ferrofs bench published` measured, and its Markdown report: a row per case (files/s
//! over the 4 mounts, the walk's time, bytes fetched against bytes read, the caches' size;
//! median [min-max] over the runs), then the targets, met or not.

use super::published::Pass;
use super::published_baseline::NAME as BASELINE;
use super::report::Spread;
use super::seeds_results::{Machine, Skipped};
use crate::units::{grouped, human_bytes};
use serde::Serialize;
use std::fmt::Write;

/// Warm cache: at least this fraction of the local disk's files/s.
const WARM_OF_LOCAL: f64 = 0.8;
/// Cold at this delay: the files/s and baseline targets.
const COLD_DELAY_MS: u64 = 20;
const COLD_FILES_PER_S: f64 = 5000.0;
const COLD_OVER_BASELINE: f64 = 3.0;
/// Bytes fetched at most this many times the bytes the readers read.
const FETCHED_OVER_READ: f64 = 2.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Local,
    Published,
    Squashfs,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub source: Source,
    pub delay_ms: u64,
    pub warm: bool,
}

impl Case {
    pub fn name(&self) -> String {
        let cache = if self.warm { "warm" } else { "cold" };
        match self.source {
            Source::Local => "local disk".into(),
            Source::Published => format!("published, {} ms, {cache}", self.delay_ms),
            Source::Squashfs => format!("{BASELINE}, {} ms, {cache}", self.delay_ms),
        }
    }
}

/// One case, one run.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub case: String,
    pub rep: usize,
    /// From the first reader's start to the last one's end.
    pub seconds: f64,
    pub find_seconds: f64,
    /// File bytes the readers read (and checked).
    pub bytes_read: u64,
    /// Bytes fetched from the store, all mounts (none from local disk).
    pub bytes_fetched: Option<u64>,
    /// Bytes the caches held afterwards, all mounts.
    pub cache_bytes: Option<u64>,
}

impl Sample {
    pub fn new(pass: Pass, bytes_fetched: Option<u64>, cache_bytes: Option<u64>) -> Sample {
        Sample {
            case: String::new(),
            rep: 0,
            seconds: pass.seconds,
            find_seconds: pass.find_seconds,
            bytes_read: pass.bytes_read,
            bytes_fetched,
            cache_bytes,
        }
    }
}

/// Everything a run measured.
#[derive(Serialize)]
pub struct Results {
    pub command: String,
    pub machine: Machine,
    pub wall_seconds: f64,
    pub runs: usize,
    pub files: u64,
    pub dirs: u64,
    pub file_bytes: u64,
    pub readers_per_mount: usize,
    /// Bytes allocated to the image file, and to the server's objects after the publish.
    pub image_bytes: u64,
    pub published_bytes: u64,
    pub fill_seconds: f64,
    pub publish_seconds: f64,
    /// The baseline's squashfs image (whole s3backer blocks), if it ran.
    pub squashfs_bytes: Option<u64>,
    pub delays_ms: Vec<u64>,
    /// Case names in report order.
    pub cases: Vec<String>,
    pub skipped: Vec<Skipped>,
    pub samples: Vec<Sample>,
}

impl Results {
    /// The spread of `figure` over the runs of `case`, if it has any.
    fn spread(&self, case: &str, figure: impl Fn(&Sample) -> Option<f64>) -> Option<Spread> {
        let values: Vec<f64> = self.samples.iter().filter(|s| s.case == case).filter_map(figure).collect();
        (!values.is_empty()).then(|| Spread::of(&values))
    }

    fn files_per_s(&self, case: &str) -> Option<Spread> {
        self.spread(case, |s| Some(self.files as f64 / s.seconds))
    }

    fn fetched_over_read(&self, case: &str) -> Option<Spread> {
        self.spread(case, |s| s.bytes_fetched.map(|f| f as f64 / s.bytes_read.max(1) as f64))
    }
}

pub fn markdown(r: &Results) -> String {
    let mut md = String::new();
    let m = &r.machine;
    let _ = writeln!(md, "# ferrofs bench published\n");
    let _ = writeln!(md, "`{}`\n", r.command);
    let _ = writeln!(
        md,
        "{} files of 1-16 KiB ({}) in {} directories; image {} on disk, {} of objects published in \
         {:.1} s (filled in {:.1} s){}. {} read-only mounts, each reading a quarter of the directories \
         with {} threads and checking every file's SHA-256, beside a `find` stat walk of the first; \
         page cache dropped before each case; {} runs: median [min-max].\n",
        grouped(r.files),
        human_bytes(r.file_bytes),
        grouped(r.dirs),
        human_bytes(r.image_bytes),
        human_bytes(r.published_bytes),
        r.publish_seconds,
        r.fill_seconds,
        r.squashfs_bytes.map_or(String::new(), |b| format!("; squashfs image {}", human_bytes(b))),
        super::published::MOUNTS,
        r.readers_per_mount,
        r.runs
    );
    let _ = writeln!(
        md,
        "Machine: {} cores, {} memory, {}; load average {} at the start, {} at the end; {:.0} s in all.\n",
        m.cores,
        human_bytes(m.memory_bytes),
        m.kernel,
        m.loadavg_start,
        m.loadavg_end,
        r.wall_seconds
    );
    let _ = writeln!(md, "| case | files/s, 4 mounts | find walk s | fetched | read | fetched / read | cache |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    let bytes = |v: f64| human_bytes(v as u64);
    for case in &r.cases {
        let Some(rate) = r.files_per_s(case) else {
            let _ = writeln!(md, "| {case} | failed (see below) | | | | | |");
            continue;
        };
        let cell = |s: Option<Spread>, f: &dyn Fn(f64) -> String| s.map_or("-".to_string(), |s| s.cell(f));
        let _ = writeln!(
            md,
            "| {case} | {} | {} | {} | {} | {} | {} |",
            rate.cell(|v| grouped(v as u64)),
            cell(r.spread(case, |s| Some(s.find_seconds)), &|v| format!("{v:.2}")),
            cell(r.spread(case, |s| s.bytes_fetched.map(|b| b as f64)), &bytes),
            cell(r.spread(case, |s| Some(s.bytes_read as f64)), &bytes),
            cell(r.fetched_over_read(case), &|v| format!("{v:.2}")),
            cell(r.spread(case, |s| s.cache_bytes.map(|b| b as f64)), &bytes),
        );
    }
    let checked = r.samples.len() as u64 * r.files;
    let _ = writeln!(md, "\nhash checks passed: {} files read and checked over all cases and runs.", grouped(checked));
    let _ = writeln!(md, "\n## Targets (issue 44)\n");
    for line in targets(r) {
        let _ = writeln!(md, "- {line}");
    }
    if !r.skipped.is_empty() {
        let _ = writeln!(md, "\n## Skipped\n");
        for s in &r.skipped {
            let _ = writeln!(md, "- {} / {}: {}", s.workload, s.target, s.reason);
        }
    }
    md
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// The targets, each with the medians it compares and whether it is met.
fn targets(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    let median = |case: &str| r.files_per_s(case).map(|s| s.median);
    let name = |source, delay_ms, warm| Case { source, delay_ms, warm }.name();
    let local = median(&name(super::published_report::Source::Local, 0, false));
    for &d in &r.delays_ms {
        let warm = name(Source::Published, d, true);
        if let (Some(l), Some(w)) = (local, median(&warm)) {
            out.push(format!(
                "warm >= {WARM_OF_LOCAL}x local disk, {d} ms: {} vs {} files/s = {:.2}x: {}",
                grouped(w as u64),
                grouped(l as u64),
                w / l,
                verdict(w >= WARM_OF_LOCAL * l)
            ));
        }
    }
    let cold = name(Source::Published, COLD_DELAY_MS, false);
    match median(&cold) {
        None => out.push(format!("cold at {COLD_DELAY_MS} ms: not measured (--delay-ms has no {COLD_DELAY_MS})")),
        Some(c) => {
            out.push(format!(
                "cold at {COLD_DELAY_MS} ms >= {} files/s over the 4 mounts: {}: {}",
                grouped(COLD_FILES_PER_S as u64),
                grouped(c as u64),
                verdict(c >= COLD_FILES_PER_S)
            ));
            match median(&name(Source::Squashfs, COLD_DELAY_MS, false)) {
                Some(b) => out.push(format!(
                    "cold at {COLD_DELAY_MS} ms >= {COLD_OVER_BASELINE}x {BASELINE}: {} vs {} files/s = {:.2}x: {}",
                    grouped(c as u64),
                    grouped(b as u64),
                    c / b,
                    verdict(c >= COLD_OVER_BASELINE * b)
                )),
                None => out.push(format!("cold at {COLD_DELAY_MS} ms against {BASELINE}: baseline not measured")),
            }
        }
    }
    for &d in &r.delays_ms {
        let case = name(Source::Published, d, false);
        if let Some(s) = r.fetched_over_read(&case) {
            out.push(format!(
                "bytes fetched <= {FETCHED_OVER_READ}x bytes read, {case}: {:.2}x (worst run {:.2}x): {}",
                s.median,
                s.max,
                verdict(s.max <= FETCHED_OVER_READ)
            ));
        }
    }
    out
}

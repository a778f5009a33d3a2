//! One timed phase: every thread applies an operation to each name of its share, in its
//! directory. Threads are spawned first and released together by a barrier; the clock runs
//! from the release until the last thread is done and `finish` (e.g. sync) returned. The
//! process's CPU time over the same span is taken too (it includes the journal's threads).

use super::names::NameTable;
use super::process;
use crate::failure::{CliResult, Failure};
use indicatif::ProgressBar;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Names a worker handles between progress updates (and checks for a failed peer).
const PROGRESS_CHUNK: usize = 4096;

/// What one thread works on: a directory and a contiguous share of the name table.
#[derive(Clone, Debug)]
pub struct Share {
    pub dir: u64,
    pub names: Range<usize>,
}

/// Wall-clock and CPU time of one phase.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub wall: Duration,
    pub cpu: Duration,
}

/// Everything a phase's workers share.
pub struct Phase<'a, F> {
    pub what: &'static str,
    pub names: &'a NameTable,
    pub bar: &'a ProgressBar,
    pub op: F,
}

impl<F> Phase<'_, F>
where
    F: Fn(u64, &[u8]) -> ferrofs::Result<()> + Sync,
{
    /// Run the phase over `shares` (one thread each); returns the time it took.
    pub fn run(
        &self,
        shares: &[Share],
        finish: impl FnOnce() -> ferrofs::Result<()>,
    ) -> CliResult<Timing> {
        let start_line = Barrier::new(shares.len() + 1);
        let failed = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (start_line, failed) = (&start_line, &failed);
            let workers: Vec<_> = shares
                .iter()
                .map(|share| s.spawn(move || self.work(share, start_line, failed)))
                .collect();
            start_line.wait();
            let (started, cpu_before) = (Instant::now(), process::cpu_time());
            for w in workers {
                w.join()
                    .map_err(|_| Failure::new(self.what, "a benchmark thread panicked"))??;
            }
            finish().map_err(|e| Failure::new(format!("{}: sync", self.what), e))?;
            Ok(Timing {
                wall: started.elapsed(),
                cpu: process::cpu_time().saturating_sub(cpu_before),
            })
        })
    }

    fn work(&self, share: &Share, start_line: &Barrier, failed: &AtomicBool) -> CliResult<()> {
        start_line.wait();
        let mut from = share.names.start;
        while from < share.names.end && !failed.load(Relaxed) {
            let to = (from + PROGRESS_CHUNK).min(share.names.end);
            for i in from..to {
                let name = self.names.get(i);
                if let Err(e) = (self.op)(share.dir, name) {
                    failed.store(true, Relaxed);
                    return Err(Failure::new(
                        format!("{} {}", self.what, String::from_utf8_lossy(name)),
                        e,
                    ));
                }
            }
            self.bar.inc((to - from) as u64);
            from = to;
        }
        Ok(())
    }
}

//! One timed phase: every thread applies an operation to each name of its share, in its
//! directory. Threads are spawned first and released together by a barrier; the clock runs
//! from the first thread's release until the last thread is done and `finish` (e.g. sync)
//! returned. The
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
        let failed = AtomicBool::new(false);
        timed(
            self.what,
            shares.len(),
            |t| self.work(&shares[t], &failed),
            || finish().map_err(|e| Failure::new(format!("{}: sync", self.what), e)),
        )
    }

    fn work(&self, share: &Share, failed: &AtomicBool) -> CliResult<()> {
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

/// Run `work(t)` on `threads` threads, released together by a barrier; the clock runs from
/// the first thread's release until every thread returned and `finish` returned. `what` names the work in
/// a failure. Every benchmark's timed section goes through here.
pub fn timed<W, F>(what: &str, threads: usize, work: W, finish: F) -> CliResult<Timing>
where
    W: Fn(usize) -> CliResult<()> + Sync,
    F: FnOnce() -> CliResult<()>,
{
    let start_line = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let (start_line, work) = (&start_line, &work);
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    start_line.wait();
                    (Instant::now(), work(t))
                })
            })
            .collect();
        let cpu_before = process::cpu_time();
        start_line.wait();
        // The clock starts when the first worker passes the barrier: this thread may be
        // descheduled right after it (threads outnumber cores), and workers must not run
        // unclocked meanwhile.
        let mut started: Option<Instant> = None;
        for w in workers {
            let (t0, done) = w
                .join()
                .map_err(|_| Failure::new(what, "a benchmark thread panicked"))?;
            done?;
            started = Some(started.map_or(t0, |s| s.min(t0)));
        }
        finish()?;
        Ok(Timing {
            wall: started.map_or(Duration::ZERO, |s| s.elapsed()),
            cpu: process::cpu_time().saturating_sub(cpu_before),
        })
    })
}

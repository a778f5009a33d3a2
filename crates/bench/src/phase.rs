//! One timed phase: every thread applies an operation to each name of its share, in its
//! directory. Threads are spawned first and released together by a start gate; the clock runs
//! from the first thread's release until the last thread is done and `finish` (e.g. sync)
//! returned. The process's CPU time over the same span is taken too (it includes the
//! journal's threads).
//!
//! A read-only phase can instead run for a minimum time (`Phase::run_for`): each thread
//! repeats passes over its share until the deadline, and every operation done is counted.
//! One pass of a fast phase lasts a few milliseconds, so thread release and scheduling would
//! otherwise be a large part of what is measured.

use super::names::NameTable;
use super::process;
use super::shell::{self, check_interrupt};
use crate::failure::{CliResult, Failure};
use indicatif::ProgressBar;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Names a worker handles between progress updates.
const PROGRESS_CHUNK: usize = 4096;
/// Names a worker handles between checks for a failed peer and for the deadline: the
/// threads of a timed phase stop within this many operations of it.
pub const STOP_CHECK: usize = 64;

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
    pub fn run(&self, shares: &[Share], finish: impl FnOnce() -> ferrofs::Result<()>) -> CliResult<Timing> {
        let failed = AtomicBool::new(false);
        timed(
            self.what,
            shares.len(),
            |t| self.pass(&shares[t], &failed, None).map(drop),
            || finish().map_err(|e| Failure::new(format!("{}: sync", self.what), e)),
        )
    }

    /// Run the phase over `shares` (one thread each) for at least `min`: see `repeat`.
    /// Returns the time it took and the operations done.
    pub fn run_for(&self, shares: &[Share], min: Duration) -> CliResult<(Timing, u64)> {
        let failed = AtomicBool::new(false);
        let deadline = Deadline::new(min);
        let ops = AtomicU64::new(0);
        let timing = timed(
            self.what,
            shares.len(),
            |t| {
                let done = repeat(&deadline, |until| self.pass(&shares[t], &failed, until))?;
                ops.fetch_add(done, Relaxed);
                Ok(())
            },
            || Ok(()),
        )?;
        Ok((timing, ops.into_inner()))
    }

    /// One pass over `share`, cut short at `until` if given; returns the operations done.
    fn pass(&self, share: &Share, failed: &AtomicBool, until: Option<Instant>) -> CliResult<u64> {
        let mut done = 0;
        for i in share.names.clone() {
            if done % STOP_CHECK == 0
                && (failed.load(Relaxed) || shell::interrupted() || until.is_some_and(|u| Instant::now() >= u))
            {
                break;
            }
            let name = self.names.get(i);
            if let Err(e) = (self.op)(share.dir, name) {
                failed.store(true, Relaxed);
                return Err(Failure::new(format!("{} {}", self.what, String::from_utf8_lossy(name)), e));
            }
            done += 1;
            if done % PROGRESS_CHUNK == 0 {
                self.bar.inc(PROGRESS_CHUNK as u64);
            }
        }
        self.bar.inc((done % PROGRESS_CHUNK) as u64);
        Ok(done as u64)
    }
}

/// When the workers of a phase run for a minimum time stop: `min` after the first of them
/// started (the clock of `timed` starts then too; a thread that starts late under
/// oversubscription must not extend the phase).
pub struct Deadline {
    start: OnceLock<Instant>,
    min: Duration,
}

impl Deadline {
    pub fn new(min: Duration) -> Deadline {
        Deadline { start: OnceLock::new(), min }
    }

    fn arm(&self) -> Instant {
        *self.start.get_or_init(Instant::now) + self.min
    }
}

/// A worker's passes until `deadline`: the first runs in full, so every name is visited at
/// least once whatever the deadline; later ones are given the deadline to stop at, and none
/// starts after it. `pass` returns the operations it did; the sum is returned.
pub fn repeat(deadline: &Deadline, mut pass: impl FnMut(Option<Instant>) -> CliResult<u64>) -> CliResult<u64> {
    let until = deadline.arm();
    let mut ops = pass(None)?;
    while Instant::now() < until {
        ops += pass(Some(until))?;
    }
    Ok(ops)
}

/// Holds a phase's threads until all are waiting, then lets them through at once.
///
/// Not `std::sync::Barrier`: it wakes its waiters together, but each must then retake the
/// barrier's mutex, one after another, and a woken thread waits for a CPU before it takes and
/// hands on the mutex. With 48 threads on 2 CPUs the last left the barrier 66-124 ms after
/// the first in phases of 85-130 ms, so for most of a phase fewer threads ran than it was
/// said to measure. Readers of a lock held for writing are all let in by one wake (the
/// scheduler then still runs them a slice at a time: the last starts 45-72 ms in).
struct StartGate {
    closed: RwLock<()>,
    waiting: AtomicUsize,
}

impl StartGate {
    fn new() -> StartGate {
        StartGate { closed: RwLock::new(()), waiting: AtomicUsize::new(0) }
    }

    /// A worker's wait; returns when the gate opens.
    fn pass(&self) {
        self.waiting.fetch_add(1, Relaxed);
        // A poisoned gate still opens: nothing is kept under it.
        drop(self.closed.read());
    }
}

/// Run `work(t)` on `threads` threads, released together by a start gate; the clock runs from
/// the first thread's release until every thread returned and `finish` returned. `what`
/// names the work in a failure. Every benchmark's timed section goes through here.
pub fn timed<W, F>(what: &str, threads: usize, work: W, finish: F) -> CliResult<Timing>
where
    W: Fn(usize) -> CliResult<()> + Sync,
    F: FnOnce() -> CliResult<()>,
{
    check_interrupt()?;
    let gate = StartGate::new();
    let closed = gate.closed.write().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|s| {
        let (gate, work) = (&gate, &work);
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    gate.pass();
                    (Instant::now(), work(t))
                })
            })
            .collect();
        // Untimed: wait until every worker is at the gate (one may count itself a moment
        // before it blocks; it then passes at once).
        while gate.waiting.load(Relaxed) < threads {
            std::thread::yield_now();
        }
        let cpu_before = process::cpu_time();
        drop(closed);
        // The clock starts when the first worker passes the gate: this thread may be
        // descheduled right after it opens (threads outnumber cores), and workers must not
        // run unclocked meanwhile.
        let mut started: Option<Instant> = None;
        for w in workers {
            let (t0, done) = w.join().map_err(|_| Failure::new(what, "a benchmark thread panicked"))?;
            done?;
            started = Some(started.map_or(t0, |s| s.min(t0)));
        }
        finish()?;
        // A phase cut short by a signal measured nothing.
        check_interrupt()?;
        Ok(Timing {
            wall: started.map_or(Duration::ZERO, |s| s.elapsed()),
            cpu: process::cpu_time().saturating_sub(cpu_before),
        })
    })
}

//! One worker per CPU, each kept on its own CPU.
//!
//! With the default one worker per CPU, each worker kept to a CPU of its own served a single
//! client much faster. Why is not established: unpinned, the two workers rarely moved (0.9-1.3
//! thousand migrations in 40,000 creates). Measured on 2 CPUs before this module, pinning the running
//! daemon's workers with `taskset`: one fs_mark client creating 40,000 files through the mount
//! did 13,060-13,537 creates/s unpinned, 18,175-18,362 with each worker on a CPU of its own;
//! 8 `rm -rf` at once, 73,785-76,733 removals/s pinned against 69,509-73,225. With more
//! workers than CPUs pinning did not help (8 workers pinned: 9,710-10,800 creates/s), so a
//! mount that asks for more workers than it may use CPUs is left to the scheduler. DESIGN
//! ("Mounting through FUSE") has `ferrofs bench fsmark` with this module.
//!
//! A worker pins itself when it first calls the engine, to the next CPU the process may use
//! (its affinity mask at mount time: cgroup and `taskset` limits are kept): fuser has no hook
//! at a worker's start. Only fuser's workers (threads named `fuser-N`) pin themselves: an
//! adapter called from another thread (a test's) leaves it alone. The mount tests check that
//! a mount's workers do end up pinned, so a change of fuser's thread names cannot pass
//! unnoticed.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Pinning {
    /// CPUs the process may run on, in order.
    cpus: Vec<usize>,
    /// Workers pinned so far (the next one takes `cpus[next % len]`).
    next: AtomicUsize,
}

thread_local! {
    static PINNED: Cell<bool> = const { Cell::new(false) };
}

impl Pinning {
    /// `None` when `workers` outnumber the CPUs this process may use, or the mask cannot be
    /// read.
    pub fn for_workers(workers: usize) -> Option<Pinning> {
        let cpus = allowed_cpus()?;
        (workers <= cpus.len()).then(|| Pinning { cpus, next: AtomicUsize::new(0) })
    }

    /// Pin the calling worker, once: later calls only read a thread-local flag.
    #[inline]
    pub fn pin_me(&self) {
        if !PINNED.get() {
            PINNED.set(true);
            if !std::thread::current().name().is_some_and(|n| n.starts_with("fuser-")) {
                return;
            }
            let cpu = self.cpus[self.next.fetch_add(1, Relaxed) % self.cpus.len()];
            // A failure (the CPU went offline meanwhile) leaves the worker to the scheduler.
            let _ = set_cpu(cpu);
        }
    }
}

fn empty_set() -> libc::cpu_set_t {
    // SAFETY: `cpu_set_t` is a plain bit set; all zeroes is a valid (empty) value.
    unsafe { std::mem::zeroed() }
}

fn allowed_cpus() -> Option<Vec<usize>> {
    let mut set = empty_set();
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    // SAFETY: `set` was filled in by the kernel above.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// Keep the calling thread on `cpu`.
fn set_cpu(cpu: usize) -> std::io::Result<()> {
    let mut set = empty_set();
    // SAFETY: `cpu` < CPU_SETSIZE: it came from `allowed_cpus`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_beyond_the_cpus_are_not_pinned() {
        let n = allowed_cpus().expect("affinity mask").len();
        assert!(Pinning::for_workers(n).is_some());
        assert!(Pinning::for_workers(n + 1).is_none());
    }

    #[test]
    fn a_pinned_worker_runs_on_its_cpu_only() {
        let p = Pinning::for_workers(1).expect("one CPU at least");
        let want = p.cpus[0];
        std::thread::Builder::new().name("fuser-test".into()).spawn(move || {
            p.pin_me();
            assert_eq!(allowed_cpus(), Some(vec![want]));
            // Once only: a second call takes no further CPU.
            p.pin_me();
            assert_eq!(p.next.load(Relaxed), 1);
        })
        .unwrap()
        .join()
        .unwrap();
    }

    #[test]
    fn other_threads_are_left_alone() {
        let p = Pinning::for_workers(1).expect("one CPU at least");
        let before = allowed_cpus();
        std::thread::spawn(move || {
            p.pin_me();
            assert_eq!(allowed_cpus(), before);
            assert_eq!(p.next.load(Relaxed), 0);
        })
        .join()
        .unwrap();
    }
}

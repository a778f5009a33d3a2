//! How many workers read `/dev/fuse`, and where they run.
//!
//! The kernel queues a connection's requests once and hands each to the reader that has waited
//! longest, so every idle reader is one more cold thread to wake per request: with few clients,
//! one worker per CPU serves best (on 2 CPUs, 8 fixed workers made 1 and 2 fs_mark clients
//! 27-42% slower than 2 workers). With many clients the daemon is the bottleneck, and more
//! workers serve them faster (8 workers on 2 CPUs: 8 clients removing 400,000 files at
//! 0.94-0.98x the minimal FUSE server, against 0.76-0.78x with 2). So the number of workers
//! reading follows the number of clients, as libfuse's loop grows its threads with the load:
//!
//! * The first workers, one per CPU (the *core*, at least 2), always read, each kept on a CPU
//!   of its own.
//! * The others (*extras*, up to [`crate::MountConfig::threads`] in all) read only while more
//!   than [`CLIENTS_PER_CORE`] threads per core worker have sent requests within the last
//!   [`CLIENT_WINDOW`]; then one worker reads per such thread. An extra that finishes a
//!   request while more read than that parks in user space; a recount (at most one per
//!   [`RECOUNT`], by whichever worker finds it due) that wants more wakes parked ones.
//!
//! Why threads and not queued requests: one client's releases, sent without waiting for their
//! answers, keep requests queued behind busy workers at 2 and 3 clients as at 8, and waking
//! extras for them cost 2 fs_mark clients 36-44% of their create rate. Why more than 3 per core
//! worker: on 2 CPUs, 3 to 6 clients were served as fast or faster by the 2 core workers alone
//! as by one worker each (40,000 files: 6 clients created 39,614 files/s with 6 workers
//! against 45,133 with 2). A request the kernel sends on its own, for no process (pid 0), is
//! no client's. The figures are in DESIGN, "Mounting through FUSE".
//!
//! A parked extra reads no request, so nothing tells it that the connection has ended: it polls
//! a duplicate of the session's descriptor every [`PARKED_CHECK`] (poll reports an error once
//! the connection is gone) and returns to fuser's loop, which then ends.
//!
//! Pinning: with the core workers kept each on a CPU of its own, one fs_mark client created
//! 40,000 files at 18,175-18,362 files/s against 13,060-13,537 unpinned (2 workers on 2 CPUs,
//! pinned with `taskset` before this module existed); why is not established, since unpinned
//! the two workers rarely moved (0.9-1.3 thousand migrations in 40,000 creates). Pinning more
//! workers than CPUs did not help (8 workers pinned: 9,710-10,800 creates/s), so extras are
//! left to the scheduler. fuser has no hook at a worker's start: a worker recognises itself by
//! its thread name (`fuser-N`, N its index) at its first request, and the mount tests check
//! that the core workers do end up pinned and that extras wake for many clients, so a change
//! of fuser's names cannot pass unnoticed.

use ferrofs_lockstat::{Condvar, LockClass, Mutex};
use std::cell::Cell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A requester counts as a client for this long after its last request.
const CLIENT_WINDOW: Duration = Duration::from_millis(20);
/// Requesters per core worker that the core workers serve alone: see the module docs.
const CLIENTS_PER_CORE: usize = 3;
/// How often the worker count is reconsidered (by whichever worker finds it due).
const RECOUNT: Duration = Duration::from_millis(1);
/// Requesters are remembered in this many slots, by thread id: two that share one count once,
/// so the count is a lower bound, exact while there are few.
const SLOTS: usize = 64;
/// How often a parked extra checks that the connection still exists (none of its requests
/// come to tell it: it is not reading).
const PARKED_CHECK: Duration = Duration::from_millis(50);

static WORKER_PARK: LockClass = LockClass::new("fuse-worker-park");

/// What the calling thread is to the pool, found at its first request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Unknown,
    /// Not one of fuser's workers (a test calling the adapter directly).
    Other,
    Core,
    Extra,
}

thread_local! {
    static ROLE: Cell<Role> = const { Cell::new(Role::Unknown) };
}

#[derive(Default)]
struct Parked {
    /// Extras parked and not yet woken.
    count: usize,
    /// Wakes handed out and not yet taken by a parked extra.
    wakes: usize,
    /// The connection is gone: parked extras return to fuser's loop, which then ends.
    closed: bool,
}

pub struct Workers {
    /// Workers in all; the first `core` always read.
    total: usize,
    core: usize,
    /// CPUs the process may run on, in order; core worker i keeps to `cpus[i % len]`.
    cpus: Option<Vec<usize>>,
    /// A duplicate of the session's descriptor, set once the session exists: a parked extra
    /// polls it to learn that the connection has ended.
    conn: OnceLock<OwnedFd>,
    /// When each slot's requesters last sent a request, in milliseconds since `epoch` (+1, so
    /// that 0 is never).
    seen: [AtomicU64; SLOTS],
    /// When the count was last reconsidered (milliseconds since `epoch`).
    counted: AtomicU64,
    /// Workers that should read: the recent requesters, at least `core`, at most `total`.
    wanted: AtomicUsize,
    /// `Parked::count`, readable without the lock.
    parked_now: AtomicUsize,
    parked: Mutex<Parked>,
    wake_up: Condvar,
    epoch: Instant,
    woken: AtomicU64,
    parks: AtomicU64,
    /// FUSE over io_uring: [`URING_OFF`], [`URING_ASKED`] (INIT is to ask for it) or
    /// [`URING_ON`] (INIT got it: the rings serve the requests, `uring.rs`).
    uring: AtomicU8,
    /// Requests served from ring entries.
    ring_requests: AtomicU64,
    /// Of those, requests handed to the sync pool (a change that would wait: `uring.rs`).
    ring_offloads: AtomicU64,
}

pub const URING_OFF: u8 = 0;
pub const URING_ASKED: u8 = 1;
pub const URING_ON: u8 = 2;

/// Held by a worker for the length of one request; dropping it (after the reply) may park an
/// extra.
pub struct Serving<'a> {
    workers: &'a Workers,
    role: Role,
}

/// What the pool has done, for the mount's statistics and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerStats {
    pub total: usize,
    pub core: usize,
    /// Extras parked right now.
    pub parked: usize,
    /// Wakes of a parked extra, for a client more.
    pub woken: u64,
    /// Times an extra parked, for a client fewer.
    pub parks: u64,
    /// Requests come through io_uring rings (1) or reads of `/dev/fuse` (0).
    pub uring: bool,
    /// Requests served from ring entries so far.
    pub ring_requests: u64,
    /// Of those, requests handed to the sync pool.
    pub ring_offloads: u64,
}

impl WorkerStats {
    /// How requests reach the daemon: `"io_uring"` (rings negotiated and started) or
    /// `"/dev/fuse"`; `ferrofs mounts` and `lockstat --journal` print it.
    pub fn transport(&self) -> &'static str {
        if self.uring {
            "io_uring"
        } else {
            "/dev/fuse"
        }
    }

    /// The counters by name, as the control socket's `journal` answer gives them.
    pub fn counters(&self) -> [(&'static str, u64); 8] {
        [
            ("workers_total", self.total as u64),
            ("workers_core", self.core as u64),
            ("workers_parked", self.parked as u64),
            ("workers_woken", self.woken),
            ("workers_parks", self.parks),
            ("transport_uring", self.uring as u64),
            ("transport_ring_requests", self.ring_requests),
            ("transport_ring_offloads", self.ring_offloads),
        ]
    }
}

impl Workers {
    /// `total` workers, of which one per CPU (at least 2, at most `total`) always read.
    pub fn new(total: usize) -> Workers {
        let cpus = allowed_cpus();
        let core = cpus.as_ref().map_or(2, Vec::len).max(2).min(total);
        Workers {
            total,
            core,
            cpus,
            conn: OnceLock::new(),
            seen: [const { AtomicU64::new(0) }; SLOTS],
            counted: AtomicU64::new(0),
            wanted: AtomicUsize::new(core),
            parked_now: AtomicUsize::new(0),
            parked: Mutex::new(&WORKER_PARK, Parked::default()),
            wake_up: Condvar::new(),
            epoch: Instant::now(),
            woken: AtomicU64::new(0),
            parks: AtomicU64::new(0),
            uring: AtomicU8::new(URING_OFF),
            ring_requests: AtomicU64::new(0),
            ring_offloads: AtomicU64::new(0),
        }
    }

    /// Give the pool the session's descriptor (a duplicate of it). Until then a parked extra
    /// cannot tell that the connection has ended: extras never park.
    pub fn attach(&self, conn: OwnedFd) {
        let _ = self.conn.set(conn);
    }

    pub fn stats(&self) -> WorkerStats {
        WorkerStats {
            total: self.total,
            core: self.core,
            parked: self.parked_now.load(Relaxed),
            woken: self.woken.load(Relaxed),
            parks: self.parks.load(Relaxed),
            uring: self.uring() == URING_ON,
            ring_requests: self.ring_requests.load(Relaxed),
            ring_offloads: self.ring_offloads.load(Relaxed),
        }
    }

    /// Where FUSE over io_uring stands: [`URING_OFF`], [`URING_ASKED`] or [`URING_ON`].
    pub fn uring(&self) -> u8 {
        self.uring.load(Relaxed)
    }

    pub fn set_uring(&self, state: u8) {
        debug_assert!(state <= URING_ON);
        self.uring.store(state, Relaxed);
    }

    /// A ring's thread serves a request.
    #[inline]
    pub fn served_on_ring(&self) {
        self.ring_requests.fetch_add(1, Relaxed);
    }

    /// A ring's request goes to the sync pool.
    pub fn offloaded_from_ring(&self) {
        self.ring_offloads.fetch_add(1, Relaxed);
    }

    /// A worker starts a request from thread `pid`.
    #[inline]
    pub fn serving(&self, pid: u32) -> Serving<'_> {
        let mut role = ROLE.get();
        if role == Role::Unknown {
            role = self.introduce();
            ROLE.set(role);
        }
        // pid 0: a request the kernel sends on its own, for no process: no client waits on it.
        if role != Role::Other && self.total > self.core && pid != 0 {
            let now = self.epoch.elapsed().as_millis() as u64 + 1;
            // Stored once per millisecond at most: the slot's line moves between CPUs no
            // more often than that.
            let slot = &self.seen[pid as usize % SLOTS];
            if slot.load(Relaxed) != now {
                slot.store(now, Relaxed);
            }
            let counted = self.counted.load(Relaxed);
            if now >= counted + RECOUNT.as_millis() as u64
                && self.counted.compare_exchange(counted, now, Relaxed, Relaxed).is_ok()
            {
                self.recount(now);
            }
        }
        Serving { workers: self, role }
    }

    /// Reconsider how many workers should read: one per CPU while the requesters seen within
    /// [`CLIENT_WINDOW`] are at most [`CLIENTS_PER_CORE`] per core worker, else one per
    /// requester. Wake extras up to it; extras above it park themselves as their requests end.
    #[cold]
    fn recount(&self, now: u64) {
        let window = CLIENT_WINDOW.as_millis() as u64;
        let clients =
            self.seen.iter().map(|s| s.load(Relaxed)).filter(|&seen| seen != 0 && now - seen.min(now) < window).count();
        let wanted = if clients > CLIENTS_PER_CORE * self.core { clients.min(self.total) } else { self.core };
        self.wanted.store(wanted, Relaxed);
        let reading = self.total - self.parked_now.load(Relaxed);
        if wanted > reading {
            self.wake(wanted - reading);
        }
    }

    /// The calling thread's role, from its name; a core worker pins itself.
    #[cold]
    fn introduce(&self) -> Role {
        let index =
            std::thread::current().name().and_then(|n| n.strip_prefix("fuser-")).and_then(|i| i.parse::<usize>().ok());
        match index {
            None => Role::Other,
            Some(i) if i < self.core => {
                if let Some(cpus) = &self.cpus {
                    // A failure (the CPU went offline meanwhile) leaves the worker to the
                    // scheduler.
                    let _ = set_cpu(cpus[i % cpus.len()]);
                }
                Role::Core
            }
            Some(_) => Role::Extra,
        }
    }

    /// Whether the connection has ended (or cannot be watched): poll reports an error on a
    /// `/dev/fuse` descriptor once its connection is gone.
    fn ended(&self) -> bool {
        let Some(fd) = self.conn.get() else { return true };
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: 0, revents: 0 };
        // SAFETY: `p` is one valid pollfd for the length of the call; the descriptor is owned
        // by `self.conn` and open until `self` is dropped.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n < 0 || p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
    }

    fn wake(&self, n: usize) {
        let mut p = self.parked.lock();
        let n = n.min(p.count);
        debug_assert!(p.count + p.wakes <= self.total - self.core, "only extras park");
        if n > 0 {
            p.count -= n;
            p.wakes += n;
            self.parked_now.store(p.count, Relaxed);
            self.woken.fetch_add(n as u64, Relaxed);
            drop(p);
            for _ in 0..n {
                self.wake_up.notify_one();
            }
        }
    }

    /// Park the calling extra, if more are reading than wanted, until a recount wakes it or
    /// the connection ends.
    fn park_if_unwanted(&self) {
        if self.conn.get().is_none() {
            return;
        }
        let mut p = self.parked.lock();
        if p.closed || self.total - p.count <= self.wanted.load(Relaxed) {
            return;
        }
        p.count += 1;
        debug_assert!(p.count + p.wakes <= self.total - self.core, "only extras park");
        self.parked_now.store(p.count, Relaxed);
        self.parks.fetch_add(1, Relaxed);
        loop {
            if p.wakes > 0 {
                p.wakes -= 1;
                return;
            }
            if p.closed {
                return;
            }
            if self.wake_up.wait_for(&mut p, PARKED_CHECK).timed_out() && self.ended() {
                // Nobody will wake the others either: let them all return to be told.
                p.closed = true;
                p.count = 0;
                self.parked_now.store(0, Relaxed);
                self.wake_up.notify_all();
                return;
            }
        }
    }
}

impl Drop for Serving<'_> {
    #[inline]
    fn drop(&mut self) {
        let w = self.workers;
        if self.role == Role::Extra && w.total - w.parked_now.load(Relaxed) > w.wanted.load(Relaxed) {
            w.park_if_unwanted();
        }
    }
}

fn empty_set() -> libc::cpu_set_t {
    // SAFETY: `cpu_set_t` is a plain bit set; all zeroes is a valid (empty) value.
    unsafe { std::mem::zeroed() }
}

pub(crate) fn allowed_cpus() -> Option<Vec<usize>> {
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
pub(crate) fn set_cpu(cpu: usize) -> std::io::Result<()> {
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
    use std::os::fd::FromRawFd;
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// A pipe; its read end stands in for the session's descriptor: poll reports POLLHUP on it
    /// once the write end is closed, as it reports POLLERR on `/dev/fuse` once the connection
    /// has ended.
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe returns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just opened, and nothing else owns them.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// Run `f` on a thread named as fuser names its worker `index`.
    fn as_worker<T: Send + 'static>(index: usize, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        std::thread::Builder::new().name(format!("fuser-{index}")).spawn(f).unwrap()
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(10), "still not so after 10 s: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Enough threads that a pool has its full count of core workers on any machine.
    const THREADS_FOR_CORE: usize = 64;

    /// A pool of the core workers and `extras` more, watching `conn`.
    fn pool(extras: usize, conn: OwnedFd) -> Arc<Workers> {
        let core = Workers::new(THREADS_FOR_CORE).core;
        let w = Arc::new(Workers::new(core + extras));
        w.attach(conn);
        w
    }

    /// A core worker serves one request from each of `clients` threads, `rounds` times, a
    /// recount apart.
    fn requests_from(w: &Arc<Workers>, clients: usize, rounds: usize) {
        let w = w.clone();
        as_worker(0, move || {
            for _ in 0..rounds {
                for pid in 1..=clients {
                    drop(w.serving(pid as u32));
                }
                std::thread::sleep(RECOUNT);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn core_workers_keep_to_a_cpu_each_and_the_others_are_left_alone() {
        let w = Arc::new(Workers::new(THREADS_FOR_CORE));
        let (Some(cpus), core) = (w.cpus.clone(), w.core) else { return };
        let before = allowed_cpus();
        for (index, want) in
            [(0, Some(vec![cpus[0]])), (core - 1, Some(vec![cpus[(core - 1) % cpus.len()]])), (core, before.clone())]
        {
            let w = w.clone();
            let got = as_worker(index, move || {
                drop(w.serving(1));
                allowed_cpus()
            });
            assert_eq!(got.join().unwrap(), want, "worker {index} of {core} core workers");
        }
        let w2 = w.clone();
        let other = std::thread::spawn(move || {
            drop(w2.serving(1));
            allowed_cpus()
        });
        assert_eq!(other.join().unwrap(), before, "a thread that is no worker is not pinned");
    }

    /// Each of the `extras` workers after the core serves one request of client 1, on a
    /// thread of its own (it parks after it while too few clients are active).
    fn serve_one_on_each_extra(w: &Arc<Workers>, extras: usize) -> Vec<JoinHandle<()>> {
        (0..extras)
            .map(|i| {
                as_worker(w.core + i, {
                    let w = w.clone();
                    move || drop(w.serving(1))
                })
            })
            .collect()
    }

    #[test]
    fn extras_read_only_while_many_clients_are_active() {
        let (conn, end) = pipe();
        let extras = 3;
        let w = pool(extras, conn);
        let core = w.core;
        // One client: the extras each serve a request, then park.
        let parked = serve_one_on_each_extra(&w, extras);
        wait_until("the extras park", || w.stats().parked == extras);
        // A client per core worker and more: still too few to wake anyone.
        requests_from(&w, CLIENTS_PER_CORE * core, 5);
        assert_eq!(w.stats().parked, extras, "{} clients woke extras", CLIENTS_PER_CORE * core);
        // One client more: as many readers as clients, so all three wake and return.
        requests_from(&w, CLIENTS_PER_CORE * core + 1, 5);
        wait_until("the extras wake", || w.stats().parked == 0);
        for t in parked {
            t.join().unwrap();
        }
        assert_eq!(w.stats().woken, extras as u64);
        // The clients leave: past the window, one request makes the count one per CPU again,
        // and each extra parks as its next request ends.
        std::thread::sleep(CLIENT_WINDOW + RECOUNT);
        requests_from(&w, 1, 2);
        let parked = serve_one_on_each_extra(&w, extras);
        wait_until("the extras park again", || w.stats().parked == extras);
        assert_eq!(w.stats().parks, 2 * extras as u64);
        // The connection ends: parked extras notice, without a request, and return.
        drop(end);
        let start = Instant::now();
        for t in parked {
            t.join().unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "parked extras took {:?} to see the connection end",
            start.elapsed()
        );
        assert_eq!(w.stats().parked, 0);
        // Once it has ended nobody parks any more.
        as_worker(core, {
            let w = w.clone();
            move || drop(w.serving(1))
        })
        .join()
        .unwrap();
        assert_eq!(w.stats().parks, 2 * extras as u64);
    }

    #[test]
    fn without_the_session_descriptor_nobody_parks() {
        let w = Arc::new(Workers::new(Workers::new(THREADS_FOR_CORE).core + 1));
        let core = w.core;
        as_worker(core, {
            let w = w.clone();
            move || drop(w.serving(1))
        })
        .join()
        .unwrap();
        assert_eq!(w.stats().parked, 0);
        assert_eq!(w.stats().parks, 0);
    }
}

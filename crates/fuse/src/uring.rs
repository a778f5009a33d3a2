//! FUSE-over-io_uring: requests served from ring entries instead of reads of `/dev/fuse`.
//!
//! Once INIT has negotiated `FUSE_OVER_IO_URING`, the kernel keeps one queue per *possible*
//! CPU and hands each request to the queue of the CPU its caller runs on. [`start`] gives every
//! queue a thread of its own (kept on that CPU when the process may run there) with its own
//! io_uring, and registers [`QueueConfig::depth`] entries on it
//! (`FUSE_IO_URING_CMD_REGISTER`, an `IORING_OP_URING_CMD` SQE128 on the `/dev/fuse`
//! descriptor, with two iovecs: a [`Header`] and a payload buffer). The kernel switches the
//! connection to the rings only once *every* queue has an entry, and until then requests keep
//! coming through `/dev/fuse`; a queue without entries would leave its CPU's callers waiting
//! for ever, so a queue that cannot register makes the kernel give the rings up (see
//! [`give_up`]). Each completion is a request in an entry's buffers; its reply is written
//! back into the same buffers and committed together with the fetch of the entry's next
//! request (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`): one `io_uring_enter` per reply and one per
//! wait (which may return several requests) instead of a read and a write per request, and no
//! cross-CPU wake-up.
//!
//! fuser decodes a request from one contiguous buffer, as `/dev/fuse` returns it; the ring
//! splits it in three (the `fuse_in_header`, the opcode's fixed struct in `op_in`, the rest in
//! the payload), so the queue thread copies the three into one buffer before dispatching (the
//! fixed parts are at most 168 bytes; a write's data is copied once more). The reply comes
//! back through [`fuser::ReplySink`] from any thread (the sync pool answers fsync later): it
//! pushes its commit under the queue's submission lock and submits it at once, so that, as
//! with a write to `/dev/fuse`, the kernel has the reply when the send returns (a notification
//! sent after a reply relies on that: the kernel may hold, until the reply, a lock that the
//! notification takes).
//!
//! A request that changes the file system while the engine would make it wait (a full log or
//! cache: [`ferrofs::FileSystem::changes_would_wait`]) is handed to the sync pool, as fsync
//! always is: served on the queue thread it would hold every later request of that CPU's
//! callers behind the checkpoint it waits for, reads included.
//!
//! Interrupts, forgets and notifications stay on `/dev/fuse` (the kernel sends and takes them
//! only there), so the `/dev/fuse` workers keep running beside the rings.
//!
//! Ending: unmount or abort makes the kernel fail every entry it holds with `ENOTCONN`, and
//! every later commit too; a queue thread returns once all its entries have ended. If the
//! daemon dies, closing its rings cancels the entries (the kernel marks them cancelable), which
//! releases their references to `/dev/fuse`, and the connection is aborted as on
//! `/dev/fuse` alone.

use crate::sync_pool::SyncPool;
use crate::workers::Workers;
use ferrofs::FileSystem;
use ferrofs_lockstat::{LockClass, Mutex};
use fuser::{Filesystem, RingDispatcher};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::UnsafeCell;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `/sys/module/fuse/parameters/enable_uring`: the kernel offers the rings only while it is Y.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Entries per queue unless configured: see DESIGN, "FUSE over io_uring", for the measurement.
pub const DEPTH_DEFAULT: usize = 8;
/// Entries per queue, at most: each holds a payload buffer of `max_write` (1 MiB).
pub const DEPTH_MAX: usize = 64;
/// The environment variable that sets the entries per queue, for measuring other depths.
pub const DEPTH_VARIABLE: &str = "FERROFS_URING_DEPTH";

/// Entries per queue: [`DEPTH_VARIABLE`] if it is set to 1..=[`DEPTH_MAX`], else
/// [`DEPTH_DEFAULT`], with a line on stderr naming a value it refuses. Read once per process,
/// so that a mount can read it while its stderr is still the caller's (a daemon's is
/// /dev/null by the time its rings start).
pub fn depth() -> usize {
    static DEPTH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *DEPTH.get_or_init(|| {
        let Some(value) = std::env::var_os(DEPTH_VARIABLE) else { return DEPTH_DEFAULT };
        match value.to_str().and_then(|v| v.parse().ok()).filter(|d| (1..=DEPTH_MAX).contains(d)) {
            Some(depth) => depth,
            None => {
                eprintln!(
                    "ferrofs: {DEPTH_VARIABLE}={value:?} is not 1 to {DEPTH_MAX}; using {DEPTH_DEFAULT} entries per queue"
                );
                DEPTH_DEFAULT
            }
        }
    })
}

// include/uapi/linux/fuse.h
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
const IN_HEADER_LEN: usize = 40; // sizeof(struct fuse_in_header)
const OUT_HEADER_LEN: usize = 16; // sizeof(struct fuse_out_header)
const IN_OUT_LEN: usize = 128; // FUSE_URING_IN_OUT_HEADER_SZ
const OP_IN_LEN: usize = 128; // FUSE_URING_OP_IN_OUT_SZ
/// Offset of `struct fuse_uring_ent_in_out` in the header, and of its `payload_sz`.
const ENT_IN_OUT: usize = IN_OUT_LEN + OP_IN_LEN;
const PAYLOAD_SZ: usize = ENT_IN_OUT + 16;
/// Offset of `len` in an SQE (`struct io_uring_sqe`), which io-uring's `UringCmd80` leaves 0.
const SQE_LEN_OFFSET: usize = 24;
/// Offset of `opcode` in `struct fuse_in_header`.
const OPCODE_OFFSET: usize = 4;
/// The opcodes whose requests begin a transaction (include/uapi/linux/fuse.h): SETATTR,
/// SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, WRITE, SETXATTR, REMOVEXATTR, CREATE,
/// FALLOCATE, RENAME2, COPY_FILE_RANGE, TMPFILE. Reads may too (an atime), rarely: they stay.
const CHANGES: [u32; 16] = [4, 6, 8, 9, 10, 11, 12, 13, 16, 21, 24, 35, 43, 45, 47, 51];

static RING_SUBMIT: LockClass = LockClass::new("fuse-ring-submit");

/// `struct fuse_uring_req_header`: the fuse_in_header (on fetch) or fuse_out_header (on
/// commit), the opcode's fixed struct, then `struct fuse_uring_ent_in_out`.
#[repr(C, align(64))]
struct Header([u8; ENT_IN_OUT + 32]);

/// One ring entry's buffers. The kernel writes a request into them before the entry's
/// completion and reads the reply from them while it handles the commit; in between they
/// belong to whoever holds the request (the queue thread, then the thread that replies).
struct Entry {
    /// Boxed: the kernel keeps its address, and the entry itself moves while the queue is
    /// built.
    header: Box<UnsafeCell<Header>>,
    payload: UnsafeCell<Box<[u8]>>,
    /// The REGISTER's iovecs: the header, then the payload.
    iov: [libc::iovec; 2],
}

/// One queue: its ring, its entries, and the lock that serialises pushes to its submission
/// queue (the queue thread and the threads replying later).
struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    submit: Mutex<()>,
    fuse: OwnedFd,
    entries: Box<[Entry]>,
}

// SAFETY: the entries' buffers are only touched by the one thread that holds the entry's
// request at the time (module docs: the kernel hands an entry out once per completion, and
// takes it back only through the commit that thread submits), and the submission queue only
// under `submit`; the completion queue is only read by the queue's own thread.
unsafe impl Sync for Queue {}
// SAFETY: as above; nothing in `Queue` is tied to the thread that built it.
unsafe impl Send for Queue {}

/// Where a queue sends the requests that would wait (module docs); none for a server
/// without the engine (the null server).
#[derive(Clone)]
pub struct Offload {
    /// Asked whether a change would wait now.
    pub fs: Arc<FileSystem>,
    /// Serves such requests.
    pub pool: Arc<SyncPool>,
}

/// How many queues and entries.
#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    /// Entries per queue.
    pub depth: usize,
    /// Bytes of each entry's payload buffer: at least what the kernel may send or want back
    /// (the larger of `max_write` and `max_pages` pages).
    pub payload: usize,
}

/// Whether the kernel lets servers use rings now: the module parameter (absent: the kernel
/// was built without `CONFIG_FUSE_IO_URING`).
pub fn parameter() -> Option<bool> {
    std::fs::read_to_string(ENABLE_PARAMETER).ok().map(|v| v.trim() == "Y")
}

/// Switch the module parameter (system-wide: every FUSE server started afterwards may use
/// rings). Root only.
pub fn set_parameter(on: bool) -> io::Result<()> {
    std::fs::write(ENABLE_PARAMETER, if on { "Y" } else { "N" })
}

/// The kernel's queue count: one per possible CPU (`num_possible_cpus()`), read from
/// `/sys/devices/system/cpu/possible` ("0-3", "0,2-5").
pub fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("cannot parse possible CPUs {text:?}"));
    let mut count = 0;
    for part in text.trim().split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let first: usize = first.parse().map_err(|_| bad())?;
        let last: usize = last.parse().map_err(|_| bad())?;
        count += last.checked_sub(first).ok_or_else(bad)? + 1;
    }
    if count == 0 || count > u16::MAX as usize {
        return Err(bad());
    }
    Ok(count)
}

/// Register the rings of the connection `fuse` (a duplicate of the session's descriptor) and
/// start one thread per queue, serving requests through `dispatcher`. Must run after INIT was
/// answered with `FUSE_OVER_IO_URING`. An error leaves the connection on `/dev/fuse` (the
/// kernel was told to give the rings up); the threads end when the connection does.
pub fn start<FS: Filesystem>(
    fuse: &OwnedFd,
    dispatcher: RingDispatcher<FS>,
    config: QueueConfig,
    workers: &Arc<Workers>,
    offload: Option<&Offload>,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    debug_assert!(config.depth > 0 && config.depth <= DEPTH_MAX);
    let started = possible_cpus().and_then(|n| {
        (0..n)
            .map(|qid| {
                let queue = Arc::new(Queue::new(qid as u16, fuse.try_clone()?, config)?);
                let dispatcher = dispatcher.clone();
                let (workers, offload) = (workers.clone(), offload.cloned());
                std::thread::Builder::new()
                    .name(format!("ferrofs-ring-{qid}"))
                    .spawn(move || queue.serve(&dispatcher, &workers, offload.as_ref()))
            })
            .collect::<io::Result<Vec<_>>>()
    });
    started.inspect_err(|_| {
        give_up(fuse);
        workers.set_uring(crate::workers::URING_OFF);
    })
}

/// Make the kernel give the rings up, so that requests go on through `/dev/fuse` (a queue
/// without entries would hold its CPU's requests for ever): a REGISTER it must refuse (no
/// buffers) turns the connection's io_uring off and wakes the requests waiting for the
/// rings.
fn give_up(fuse: &OwnedFd) {
    let refused = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2).and_then(|mut ring| {
        let sqe = with_len(
            opcode::UringCmd80::new(types::Fd(fuse.as_raw_fd()), FUSE_IO_URING_CMD_REGISTER).cmd(command(0, 0)).build(),
            0,
        );
        // SAFETY: the SQE points at no memory (no iovecs: the kernel refuses it before
        // looking further).
        unsafe { ring.submission().push(&sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
        ring.submit_and_wait(1)?;
        Ok(ring.completion().next().map(|c| c.result()))
    });
    match refused {
        Ok(Some(res)) if res < 0 => log::warn!("FUSE over io_uring given up; serving through /dev/fuse"),
        other => log::error!("could not make the kernel give FUSE over io_uring up ({other:?}): requests may hang"),
    }
}

/// `struct fuse_uring_cmd_req` in the SQE's 80-byte command area.
fn command(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// `sqe` with its `len` field set, which io-uring's builder has no setter for.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]`, a `struct io_uring_sqe` (64 bytes) followed by 64
    // bytes of command; every bit pattern of either is valid, and `len` is the u32 at offset
    // 24 of `struct io_uring_sqe` (include/uapi/linux/io_uring.h).
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

impl Queue {
    fn new(qid: u16, fuse: OwnedFd, config: QueueConfig) -> io::Result<Queue> {
        // Room for one SQE per entry (its commit) plus the registrations at the start; each
        // entry has at most one completion outstanding.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize((2 * config.depth) as u32)
            .build((config.depth as u32).next_power_of_two())?;
        let entries = (0..config.depth)
            .map(|_| {
                let header = Box::new(UnsafeCell::new(Header([0; ENT_IN_OUT + 32])));
                let payload = UnsafeCell::new(vec![0u8; config.payload].into_boxed_slice());
                let iov = [
                    libc::iovec { iov_base: header.get().cast(), iov_len: std::mem::size_of::<Header>() },
                    // SAFETY: nobody else holds the entry yet; the box's heap buffer does not
                    // move when the entry does.
                    libc::iovec { iov_base: unsafe { (*payload.get()).as_mut_ptr() }.cast(), iov_len: config.payload },
                ];
                Entry { header, payload, iov }
            })
            .collect::<Box<[Entry]>>();
        Ok(Queue { qid, ring, submit: Mutex::new(&RING_SUBMIT, ()), fuse, entries })
    }

    /// Hand every entry to the kernel. The header's iovec points into `self.entries`, which
    /// is boxed and lives (in the `Arc`) as long as the kernel may use it: until the queue's
    /// ring is dropped, which cancels whatever the kernel still holds.
    fn register(&self) -> io::Result<()> {
        let _lock = self.submit.lock();
        for (index, entry) in self.entries.iter().enumerate() {
            let sqe = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), FUSE_IO_URING_CMD_REGISTER)
                .cmd(command(self.qid, 0))
                .addr(Some(entry.iov.as_ptr() as u64))
                .build()
                .user_data(index as u64);
            // SAFETY: the iovecs and the buffers they name live as long as the queue (above);
            // the SQE is pushed under `submit`, the only producer lock.
            unsafe { self.ring.submission_shared().push(&with_len(sqe, 2)) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
        self.ring.submit()?;
        Ok(())
    }

    /// The queue thread: dispatch each request completed on the ring until every entry has
    /// ended (the connection is gone).
    fn serve<FS: Filesystem>(
        self: Arc<Queue>,
        dispatcher: &RingDispatcher<FS>,
        workers: &Workers,
        offload: Option<&Offload>,
    ) -> io::Result<()> {
        if let Some(cpus) = crate::workers::allowed_cpus() {
            if cpus.contains(&(self.qid as usize)) {
                // The queue's requests come from callers on this CPU; a failure (the CPU went
                // offline) leaves the thread to the scheduler.
                let _ = crate::workers::set_cpu(self.qid as usize);
            }
        }
        // Registered from this thread: the kernel copies each request into an entry's buffers
        // in the context of the task that last submitted the entry's command.
        if let Err(e) = self.register() {
            log::error!("queue {}: registering its ring entries failed: {e}", self.qid);
            give_up(&self.fuse);
            workers.set_uring(crate::workers::URING_OFF);
            std::mem::forget(self);
            return Err(e);
        }
        let sinks: Vec<Arc<dyn fuser::ReplySink>> = (0..self.entries.len())
            .map(|index| Arc::new(EntrySink { queue: self.clone(), index }) as Arc<dyn fuser::ReplySink>)
            .collect();
        // One clone per request handed to the pool, dropped after its dispatcher's clone: the
        // session destroys the file system once every dispatcher is gone, and refuses to
        // while one is left.
        let offloaded = Arc::new(());
        let served = self.serve_entries(dispatcher, &sinks, workers, offload, &offloaded);
        while Arc::strong_count(&offloaded) > 1 {
            // Only at the end of the connection, and only for a reply already sent: the
            // entries ended, so no job is left but the end of one.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if served.is_err() {
            // Entries may still be the kernel's, and it writes into their buffers: they must
            // never be freed.
            std::mem::forget(self);
        }
        served
    }

    /// [`Queue::serve`]'s loop: `Ok` once every entry has ended.
    fn serve_entries<FS: Filesystem>(
        &self,
        dispatcher: &RingDispatcher<FS>,
        sinks: &[Arc<dyn fuser::ReplySink>],
        workers: &Workers,
        offload: Option<&Offload>,
        offloaded: &Arc<()>,
    ) -> io::Result<()> {
        let mut live = self.entries.len();
        let mut request = Vec::with_capacity(IN_HEADER_LEN + OP_IN_LEN + 4096);
        let mut done = Vec::with_capacity(self.entries.len());
        while live > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            // SAFETY: only this thread reads the completion queue.
            done.extend(unsafe { self.ring.completion_shared() }.map(|c| (c.user_data() as usize, c.result())));
            for (index, res) in done.drain(..) {
                debug_assert!(index < self.entries.len());
                if res < 0 {
                    // ENOTCONN / ECONNABORTED: unmount or abort; ECANCELED: the ring is going.
                    if ![libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED].contains(&-res) {
                        log::error!(
                            "ring entry {index} of queue {} failed: {}",
                            self.qid,
                            io::Error::from_raw_os_error(-res)
                        );
                    }
                    live -= 1;
                    continue;
                }
                if let Err(e) = self.copy_request(index, &mut request) {
                    log::error!("queue {}: {e}", self.qid);
                    sinks[index].send(&[IoSlice::new(&error_reply(&request, libc::EIO))])?;
                    continue;
                }
                workers.served_on_ring();
                if let Some(offload) = offload.filter(|o| changes(&request) && o.fs.changes_would_wait()) {
                    workers.offloaded_from_ring();
                    // The request's buffer goes with the job; the loop takes a new one.
                    let capacity = request.capacity();
                    let job = std::mem::replace(&mut request, Vec::with_capacity(capacity));
                    let (dispatcher, sink, qid) = (dispatcher.clone(), sinks[index].clone(), self.qid);
                    let token = offloaded.clone();
                    // Waits while the pool's queue is full: a device that far behind holds
                    // requests back in the kernel.
                    offload.pool.submit(move || {
                        if let Err(e) = dispatcher.dispatch(&job, sink) {
                            log::error!("queue {qid}: {e}");
                        }
                        drop(dispatcher);
                        drop(token);
                    });
                    continue;
                }
                match dispatcher.dispatch(&request, sinks[index].clone()) {
                    Ok(false) => {}
                    // DESTROY: the connection ends with entries still the kernel's.
                    Ok(true) => return Err(io::Error::from(io::ErrorKind::ConnectionAborted)),
                    Err(e) => log::error!("queue {}: {e}", self.qid),
                }
            }
        }
        Ok(())
    }

    /// Gather the request in entry `index` into `out`, as `/dev/fuse` would return it.
    fn copy_request(&self, index: usize, out: &mut Vec<u8>) -> io::Result<()> {
        let entry = &self.entries[index];
        // SAFETY: the entry's completion hands its buffers to this thread until it replies
        // (module docs); they are not touched elsewhere meanwhile.
        let (header, payload) = unsafe { (&(*entry.header.get()).0, &**entry.payload.get()) };
        let len = u32::from_ne_bytes(header[0..4].try_into().unwrap()) as usize;
        let payload_len = u32::from_ne_bytes(header[PAYLOAD_SZ..PAYLOAD_SZ + 4].try_into().unwrap()) as usize;
        out.clear();
        out.extend_from_slice(&header[..IN_HEADER_LEN]);
        let op_in_len = len.checked_sub(IN_HEADER_LEN + payload_len).filter(|&n| n <= OP_IN_LEN);
        let (Some(op_in_len), true) = (op_in_len, payload_len <= payload.len()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("request of {len} bytes with a payload of {payload_len} does not fit its entry"),
            ));
        };
        out.extend_from_slice(&header[IN_OUT_LEN..IN_OUT_LEN + op_in_len]);
        out.extend_from_slice(&payload[..payload_len]);
        Ok(())
    }
}

/// Whether `request` (a `fuse_in_header` and the rest) may begin a transaction.
fn changes(request: &[u8]) -> bool {
    let opcode = u32::from_ne_bytes(request[OPCODE_OFFSET..OPCODE_OFFSET + 4].try_into().unwrap());
    CHANGES.contains(&opcode)
}

/// A bare error reply to the request whose `fuse_in_header` starts `request`.
fn error_reply(request: &[u8], errno: i32) -> [u8; OUT_HEADER_LEN] {
    let mut out = [0u8; OUT_HEADER_LEN];
    out[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..16].copy_from_slice(&request[8..16]); // unique
    out
}

/// Where the reply to entry `index`'s request goes.
struct EntrySink {
    queue: Arc<Queue>,
    index: usize,
}

impl fuser::ReplySink for EntrySink {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let queue = &self.queue;
        let entry = &queue.entries[self.index];
        let total: usize = data.iter().map(|d| d.len()).sum();
        // SAFETY: the thread replying holds the entry's request, and with it the buffers,
        // until the commit below hands them back to the kernel (module docs).
        let (header, payload) = unsafe { (&mut (*entry.header.get()).0, &mut **entry.payload.get()) };
        let Some(payload_len) = total.checked_sub(OUT_HEADER_LEN).filter(|&n| n <= payload.len()) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a reply of {total} bytes does not fit")));
        };
        let mut at = 0;
        for part in data.iter() {
            // The first OUT_HEADER_LEN bytes go to the header, the rest to the payload.
            let (to_header, to_payload) = part.split_at(OUT_HEADER_LEN.saturating_sub(at).min(part.len()));
            header[at..at + to_header.len()].copy_from_slice(to_header);
            let from = (at + to_header.len()).saturating_sub(OUT_HEADER_LEN);
            payload[from..from + to_payload.len()].copy_from_slice(to_payload);
            at += part.len();
        }
        header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(payload_len as u32).to_ne_bytes());
        let unique = u64::from_ne_bytes(header[8..16].try_into().unwrap());
        let sqe = opcode::UringCmd80::new(types::Fd(queue.fuse.as_raw_fd()), FUSE_IO_URING_CMD_COMMIT_AND_FETCH)
            .cmd(command(queue.qid, unique))
            .build()
            .user_data(self.index as u64);
        let _lock = queue.submit.lock();
        // SAFETY: pushed under `submit`, the only producer lock. At most one SQE per entry is
        // outstanding and the queue holds one per entry, so it is never full.
        unsafe { queue.ring.submission_shared().push(&sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
        // Submitted now, not with the queue thread's next wait: as a write to /dev/fuse, the
        // reply has reached the kernel when this returns, which a notification sent after it
        // relies on (the kernel may hold a lock it takes until the reply).
        queue.ring.submit()?;
        Ok(())
    }
}

//! `FUSE_NOTIFY_INC_EPOCH` (Linux 6.16, protocol 7.44), which fuser 0.18 does not send: it
//! makes the kernel treat every name it has cached as stale, so each is looked up again (a
//! LOOKUP, which the adapter checks) before a walk passes through it. Unlike
//! `FUSE_NOTIFY_INVAL_ENTRY` it takes no directory lock, so it may be sent while the kernel
//! waits for the reply to a chmod of that directory: the chmod then returns with no cached
//! name left to walk through (see "Permissions" in the crate docs).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;

/// `fuse_notify_code`'s FUSE_NOTIFY_INC_EPOCH; it goes in the error field of the header.
const FUSE_NOTIFY_INC_EPOCH: i32 = 8;

#[derive(Default)]
pub struct NameEpoch {
    /// The session's connection, set once the session exists.
    conn: OnceLock<OwnedFd>,
    /// The kernel refused the notification (older than 6.16): do not try again.
    unsupported: AtomicBool,
}

impl NameEpoch {
    pub fn attach(&self, conn: OwnedFd) {
        let _ = self.conn.set(conn);
    }

    /// Make every name the kernel has cached stale. Returns false if the kernel cannot (the
    /// caller then invalidates names one by one).
    pub fn expire_all_names(&self) -> bool {
        let Some(conn) = self.conn.get().filter(|_| !self.unsupported.load(Relaxed)) else { return false };
        // struct fuse_out_header: len u32, error i32 (the notification code), unique u64 (0).
        let mut header = [0u8; 16];
        header[..4].copy_from_slice(&16u32.to_ne_bytes());
        header[4..8].copy_from_slice(&FUSE_NOTIFY_INC_EPOCH.to_ne_bytes());
        // SAFETY: writes 16 bytes from a live buffer to a descriptor this value owns.
        let written = unsafe { libc::write(conn.as_raw_fd(), header.as_ptr().cast(), header.len()) };
        if written == header.len() as isize {
            return true;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            self.unsupported.store(true, Relaxed);
        } else {
            eprintln!("ferrofs: cannot expire the kernel's cached names: {e}");
        }
        false
    }
}

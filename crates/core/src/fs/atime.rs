//! Access times (DESIGN, "Access times"): a read or a directory listing sets atime when the
//! mount's mode says so, as a delayed-logged inode change (a small transaction into the CIL,
//! never a wait for the disk). The rule is checked first under the inode's shared lock, so
//! an access that changes nothing costs a few comparisons.

use super::types::{Attr, FileType};
use super::{now, FileSystem};
use crate::format::inode::Timespec;
use crate::format::DiskInode;
use crate::inode::InodeRef;
use crate::mount::AtimeMode;
use crate::trans::Tx;

/// relatime updates an atime at least this old even when nothing changed since.
const RELATIME_MAX_AGE_SECS: i64 = 24 * 60 * 60;

fn order(time: Timespec) -> (i64, u32) {
    (time.sec, time.nsec)
}

impl FileSystem {
    /// Whether an access now to an inode with attributes `a` would set its atime on this
    /// mount. The FUSE adapter asks when a file is opened: reads served from the kernel's
    /// page cache never reach the engine, so a file whose atime is due is opened with that
    /// cache dropped, and its next read comes here.
    pub fn atime_update_due(&self, a: &Attr) -> bool {
        self.atime_due(a.kind == FileType::Directory, a.atime, a.mtime, a.ctime, now())
    }

    /// Whether an access to a directory (`dir`) or to a file may ever set its atime on this
    /// mount: not with `noatime`, on a read-only mount, nor for a directory with `nodiratime`.
    /// When it cannot, the FUSE adapter lets the kernel open such files without asking.
    pub fn accesses_set_atime(&self, dir: bool) -> bool {
        let mount = self.mount();
        !(mount.atime == AtimeMode::Never || mount.is_read_only() || (dir && mount.nodiratime))
    }

    /// The kernel's rule (`atime_needs_update`, `relatime_need_update`) for an access at `t`.
    fn atime_due(&self, dir: bool, atime: Timespec, mtime: Timespec, ctime: Timespec, time: Timespec) -> bool {
        let mount = self.mount();
        if mount.is_read_only() || (dir && mount.nodiratime) || order(atime) == order(time) {
            return false;
        }
        match mount.atime {
            AtimeMode::Never => false,
            AtimeMode::Strict => true,
            AtimeMode::Relative => {
                order(atime) <= order(mtime)
                    || order(atime) <= order(ctime)
                    || time.sec.saturating_sub(atime.sec) >= RELATIME_MAX_AGE_SECS
            }
        }
    }

    /// Record an access to `i` (a read, a listing). Best effort, as the kernel's
    /// `touch_atime`: the access itself succeeded, so a failure to log the time (the file
    /// system shut down meanwhile) is not the caller's error. An unlinked inode is left
    /// alone: no name shows its atime, and its last release may be freeing it.
    pub(super) fn touch_atime(&self, i: &InodeRef) {
        if self.mount().atime == AtimeMode::Never || self.mount().is_read_only() {
            return;
        }
        let time = now();
        let due = |g: &DiskInode| g.nlink > 0 && self.atime_due(g.is_dir(), g.atime, g.mtime, g.ctime, time);
        if !due(&i.core.read()) {
            return;
        }
        // Skipped while frozen (as the kernel's `touch_atime`): a reader never waits for a thaw.
        let Some(_changing) = self.m.try_start_change() else { return };
        let mut g = i.core.write();
        // Checked again: a concurrent reader may have set it meanwhile.
        if !due(&g) {
            return;
        }
        let mut updated = g.clone();
        updated.atime = time;
        let Ok(mut tx) = Tx::new(self.mount()) else { return };
        tx.log_inode(i, &updated, false);
        if tx.commit().is_ok() {
            *g = updated;
        }
    }
}

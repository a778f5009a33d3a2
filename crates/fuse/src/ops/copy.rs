//! copy_file_range (FUSE_COPY_FILE_RANGE), served by the engine: the kernel sends no data.

use super::{FerroFuse, Res};
use ferrofs::PrivDrop;
use fuser::{Errno, ReplyWrite};

/// Most bytes one reply can count (its field is 32 bits), page aligned as the kernel's own
/// cap per request; the caller's copy_file_range loops for more.
const COPY_MAX: u64 = u32::MAX as u64 & !0xfff;

impl FerroFuse {
    /// The kernel has checked the descriptors (readable, writable, not append-only), the
    /// file types, and that two ranges of one file do not overlap. `drop`: what the copy
    /// takes from the file it writes.
    pub(super) fn copy_range(
        &self,
        (ino_in, off_in): (u64, u64),
        (ino_out, off_out): (u64, u64),
        len: u64,
        drop: Option<PrivDrop>,
        reply: ReplyWrite,
    ) {
        let res: Res<u64> = self.call_dropping("copy_file_range", ino_out, drop, |fs| {
            fs.copy_file_range(ino_in, off_in, ino_out, off_out, len.min(COPY_MAX))
        });
        match res.and_then(|n| u32::try_from(n).map_err(|_| Errno::EOVERFLOW)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }
}

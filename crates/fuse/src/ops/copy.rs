//! copy_file_range (FUSE_COPY_FILE_RANGE), served by the engine: the kernel sends no data.

use super::{FerroFuse, Res};
use fuser::{Errno, ReplyWrite};

/// Most bytes one reply can count (its field is 32 bits), page aligned as the kernel's own
/// cap per request; the caller's copy_file_range loops for more.
const COPY_MAX: u64 = u32::MAX as u64 & !0xfff;

impl FerroFuse {
    /// The kernel has checked the descriptors (readable, writable, not append-only), the
    /// file types, and that two ranges of one file do not overlap.
    pub(super) fn copy_range(
        &self,
        (ino_in, off_in): (u64, u64),
        (ino_out, off_out): (u64, u64),
        len: u64,
        reply: ReplyWrite,
    ) {
        let res: Res<u64> =
            self.call("copy_file_range", |fs| fs.copy_file_range(ino_in, off_in, ino_out, off_out, len.min(COPY_MAX)));
        match res.and_then(|n| u32::try_from(n).map_err(|_| Errno::EOVERFLOW)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }
}

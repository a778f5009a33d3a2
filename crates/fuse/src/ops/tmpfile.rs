//! O_TMPFILE (FUSE_TMPFILE): a file opened without a name.

use super::{creator, mode_bits, reply_created, FerroFuse};
use crate::access::{MAY_EXEC, MAY_WRITE};
use fuser::{ReplyCreate, Request};

impl FerroFuse {
    /// As for a create, write and search on the directory; the engine holds the new file
    /// once, the kernel's reference from this reply (dropped by its FORGET). O_EXCL makes it a file `link` will not name
    /// (the kernel refuses that link itself too; the engine keeps it true for every client).
    pub(super) fn open_tmpfile(&self, req: &Request, dir: u64, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let ttl = match self.enter_dir(req, "tmpfile", dir, MAY_WRITE | MAY_EXEC) {
            Ok(ttl) => ttl,
            Err(e) => return reply.error(e),
        };
        let linkable = flags & libc::O_EXCL == 0;
        reply_created(
            reply,
            &ttl,
            self.call("tmpfile", |fs| fs.tmpfile(dir, mode_bits(mode), creator(req, umask), linkable)),
        )
    }
}

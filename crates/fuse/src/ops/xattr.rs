//! Extended attributes: the namespaces stored, the checks, and the replies' size protocol.

use super::{caller, FerroFuse, Res};
use fuser::{Errno, ReplyXattr, Request};

impl FerroFuse {
    /// Check an xattr request on `ino` (when the adapter checks).
    pub(super) fn may_xattr(&self, req: &Request, op: &'static str, ino: u64, name: &[u8], mask: u32) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        caller(req).may_xattr(&self.getattr(op, ino)?, name, mask)
    }
}

/// The xattr namespaces ferrofs stores. The kernel hands a FUSE server every name, whatever
/// its prefix (it checks trusted.* privileges and user.* file types itself); a name outside
/// these is EOPNOTSUPP and a bare prefix EINVAL, as on Linux's local file systems. Without
/// this check any string became a stored name ("system.foo", "bogus.x").
pub(super) fn check_xattr_name(name: &[u8]) -> Res<()> {
    for prefix in [&b"user."[..], b"trusted.", b"security."] {
        if name.starts_with(prefix) {
            return if name.len() > prefix.len() { Ok(()) } else { Err(Errno::EINVAL) };
        }
    }
    Err(Errno::EOPNOTSUPP)
}

/// Reply to a getxattr/listxattr: size 0 asks for the length, a short buffer is ERANGE.
pub(super) fn reply_xattr(reply: ReplyXattr, size: u32, data: Res<Vec<u8>>) {
    match data {
        Err(e) => reply.error(e),
        Ok(d) if size == 0 => match u32::try_from(d.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        },
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
    }
}

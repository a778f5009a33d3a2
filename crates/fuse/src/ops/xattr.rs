//! Extended attributes: the namespaces stored, the checks, and the replies' size protocol.

use super::{FerroFuse, Res};
use crate::access::MAY_WRITE;
use ferrofs::FileSystem;
use fuser::{Errno, ReplyXattr, Request};

impl FerroFuse {
    /// getxattr, setxattr or removexattr of `name` on `ino`: the name's namespace and the
    /// caller's `mask` on the inode are checked before the engine is called.
    pub(super) fn call_xattr<T>(
        &self,
        req: &Request,
        op: &'static str,
        ino: u64,
        name: &[u8],
        mask: u32,
        f: impl FnOnce(&FileSystem) -> ferrofs::Result<T>,
    ) -> Res<T> {
        check_xattr_name(name)?;
        self.may_xattr(req, op, ino, name, mask)?;
        self.call(op, f)
    }

    /// setxattr: an ACL as `set_acl`, whose setgid rule needs the caller's groups (checked
    /// here in both permission modes: the kernel says whether to drop setgid only with
    /// FUSE_SETXATTR_EXT, which fuser does not decode).
    pub(super) fn set_xattr(&self, req: &Request, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Res<()> {
        let Some(kind) = ferrofs::AclKind::of(name) else {
            return self
                .call_xattr(req, "setxattr", ino, name, MAY_WRITE, |fs| fs.setxattr(ino, name, value, flags as u32));
        };
        let keeps_setgid = self.caller(req).keeps_setgid(&self.getattr("setxattr", ino)?);
        self.call_xattr(req, "setxattr", ino, name, MAY_WRITE, |fs| fs.set_acl(ino, kind, value, keeps_setgid))?;
        // The mode may have changed. The kernel refetches attributes after an ACL change only
        // with FUSE_POSIX_ACL; otherwise its setxattr marks ctime stale alone, which the
        // writeback cache does not even refetch. A negative offset drops attributes only.
        if let Some(notifier) = self.notifier.get() {
            let _ = notifier.inval_inode(fuser::INodeNo(ino), -1, 0);
        }
        Ok(())
    }

    /// listxattr: the names, each NUL-terminated.
    pub(super) fn list_xattr(&self, req: &Request, ino: u64) -> Res<Vec<u8>> {
        // trusted.* names are listed to the privileged only, as local file systems list them
        // to CAP_SYS_ADMIN (uid 0 stands for it; the kernel's FUSE client filters nothing).
        let privileged = req.uid() == 0;
        self.call("listxattr", |fs| fs.listxattr(ino)).map(|names| {
            names
                .into_iter()
                .filter(|n| privileged || !n.starts_with(b"trusted."))
                .flat_map(|mut n| {
                    n.push(0);
                    n
                })
                .collect::<Vec<u8>>()
        })
    }

    /// Check an xattr request on `ino` (when the adapter checks).
    fn may_xattr(&self, req: &Request, op: &'static str, ino: u64, name: &[u8], mask: u32) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        self.caller(req).may_xattr(&self.getattr(op, ino)?, name, mask)
    }
}

/// The xattr namespaces ferrofs stores, and the two POSIX ACLs of system.*. The kernel hands a FUSE server every name, whatever
/// its prefix (it checks trusted.* privileges and user.* file types itself); a name outside
/// these is EOPNOTSUPP and a bare prefix EINVAL, as on Linux's local file systems. Without
/// this check any string became a stored name ("system.foo", "bogus.x").
fn check_xattr_name(name: &[u8]) -> Res<()> {
    if ferrofs::AclKind::of(name).is_some() {
        return Ok(());
    }
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

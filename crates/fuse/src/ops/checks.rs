//! The adapter's own permission checks, made before the engine changes anything when the
//! kernel does not check (no `default_permissions`).

use super::{FerroFuse, Res};
use crate::access::{searchable_by_all, MAY_EXEC, MAY_WRITE};
use ferrofs::{Attr, FileSystem};
use fuser::{Errno, ReplyEntry, Request};
use std::time::Duration;

impl FerroFuse {
    /// How long the kernel may cache names in a directory of this mode. Path walks through
    /// cached names reach no server, so where some class may not search the directory every
    /// walk must come back here (a LOOKUP as the walking process) to be checked.
    pub(super) fn entry_ttl_in(&self, dir: &Attr) -> Duration {
        if self.checks && !searchable_by_all(dir.perm) {
            Duration::ZERO
        } else {
            self.entry_ttl
        }
    }

    /// Check `mask` on directory `dir` for the caller (when the adapter checks); the entry
    /// timeout for names in it.
    pub(super) fn enter_dir(&self, req: &Request, op: &'static str, dir: u64, mask: u32) -> Res<Duration> {
        if !self.checks {
            return Ok(self.entry_ttl);
        }
        let d = self.getattr(op, dir)?;
        self.caller(req).check(&d, mask)?;
        Ok(self.entry_ttl_in(&d))
    }

    /// A new name in `dir` (mknod, mkdir, symlink, link): write and search on it first.
    pub(super) fn make_entry(
        &self,
        req: &Request,
        op: &'static str,
        dir: u64,
        reply: ReplyEntry,
        make: impl FnOnce(&FileSystem) -> ferrofs::Result<Attr>,
    ) {
        match self.enter_dir(req, op, dir, MAY_WRITE | MAY_EXEC) {
            Ok(ttl) => {
                let res = self.call(op, make);
                self.reply_entry(reply, ttl, res);
            }
            Err(e) => reply.error(e),
        }
    }

    /// `may_delete` for unlink and rmdir: write and search on the directory, and the sticky
    /// rule.
    pub(super) fn may_remove(&self, req: &Request, op: &'static str, dir: u64, name: &[u8]) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        let c = self.caller(req);
        let d = self.getattr(op, dir)?;
        c.may_create(&d)?;
        if d.perm & libc::S_ISVTX as u16 != 0 {
            let victim = self.call(op, |fs| fs.lookup(dir, name))?;
            c.may_delete_from_sticky(&d, &victim)?;
        }
        Ok(())
    }

    /// `vfs_rename`'s checks: write and search on both directories, the sticky rule for the
    /// source and a replaced or exchanged target, and write on a directory that moves to
    /// another parent (its ".." changes).
    pub(super) fn may_rename(&self, req: &Request, from: (u64, &[u8]), to: (u64, &[u8]), flags: u32) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        let c = self.caller(req);
        let sticky = |d: &Attr| d.perm & libc::S_ISVTX as u16 != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let moves = from.0 != to.0;
        let from_dir = self.getattr("rename", from.0)?;
        c.may_create(&from_dir)?;
        let to_dir = if moves { self.getattr("rename", to.0)? } else { from_dir.clone() };
        if moves {
            c.may_create(&to_dir)?;
        }
        if sticky(&from_dir) || moves {
            let source = self.call("rename", |fs| fs.lookup(from.0, from.1))?;
            if sticky(&from_dir) {
                c.may_delete_from_sticky(&from_dir, &source)?;
            }
            if moves && source.kind == ferrofs::FileType::Directory {
                c.check(&source, MAY_WRITE)?;
            }
        }
        if sticky(&to_dir) || (moves && exchange) {
            let target = match self.call("rename", |fs| fs.lookup(to.0, to.1)) {
                Ok(t) => t,
                Err(Errno::ENOENT) => return Ok(()),
                Err(e) => return Err(e),
            };
            if sticky(&to_dir) {
                c.may_delete_from_sticky(&to_dir, &target)?;
            }
            if moves && exchange && target.kind == ferrofs::FileType::Directory {
                c.check(&target, MAY_WRITE)?;
            }
        }
        Ok(())
    }
}

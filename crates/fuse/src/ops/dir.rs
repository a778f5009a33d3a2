//! Directory listings: entries read from the engine a batch at a time, and the cached names
//! the kernel is told to forget.

use super::attr::{file_attr, file_type};
use super::{FerroFuse, Res};
use ferrofs::DirEntry;
use fuser::{Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;

/// Directory entries fetched from the engine per call while filling one readdir reply.
const READDIR_BATCH: usize = 256;

/// Directory entries read under the directory's lock, each name a range of the second part.
type DirBatch = (Vec<DirEntry<Range<usize>>>, Vec<u8>);

impl FerroFuse {
    /// readdir: as many entries after `cookie` as the reply holds.
    pub(super) fn list_dir(&self, ino: u64, cookie: u64, mut reply: ReplyDirectory) {
        let res = self.fill_dir(ino, cookie, |e| {
            reply.add(INodeNo(e.ino), e.cookie, file_type(e.kind), OsStr::from_bytes(e.name))
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// readdirplus: as `list_dir`, each entry with its attributes.
    pub(super) fn list_dir_plus(&self, ino: u64, cookie: u64, mut reply: ReplyDirectoryPlus) {
        // Opening the directory was the check; the mode decides how long names may be cached.
        let ttl = match self.checks.then(|| self.getattr("readdirplus", ino)).transpose() {
            Ok(dir) => dir.map_or(self.entry_ttl, |d| self.entry_ttl_in(&d)),
            Err(e) => return reply.error(e),
        };
        let res = self.fill_dir(ino, cookie, |e| {
            // Attributes are read after the batch, without the directory's lock. An entry
            // removed meanwhile is left out, as if the listing had been taken a moment later.
            match self.call("readdirplus", |fs| fs.getattr(e.ino)) {
                Ok(a) => {
                    let full = reply.add(
                        INodeNo(e.ino),
                        e.cookie,
                        OsStr::from_bytes(e.name),
                        &ttl,
                        &file_attr(&a),
                        Generation(a.generation as u64),
                    );
                    // Each entry in the reply but `.` and `..` is a reference the kernel
                    // takes (fuse_direntplus_link), or forgets at once if it cannot.
                    if !full && e.name != b"." && e.name != b".." {
                        self.fs.hold(e.ino);
                    }
                    full
                }
                Err(_) => false,
            }
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// The names the kernel may have cached in `dir` (with the long timeout of a directory
    /// everyone could search), listed before the reply so that the invalidations after it
    /// (`forget_names`) follow it as closely as they can.
    pub(super) fn names_in(&self, dir: u64) -> Vec<Vec<u8>> {
        let mut names = Vec::new();
        let res = self.fill_dir(dir, 0, |e| {
            if e.name != b"." && e.name != b".." {
                names.push(e.name.to_vec());
            }
            false
        });
        if let Err(e) = res {
            log::error!(image = &*self.image; "cannot list directory {dir} to drop its cached names: {e:?}");
        }
        names
    }

    /// Make the kernel forget `names` in `dir`, so the next walk through each is checked.
    /// Call only after replying: the kernel holds the directory's lock until the reply, and
    /// the invalidation waits for that lock.
    pub(super) fn forget_names(&self, dir: u64, names: Vec<Vec<u8>>) {
        let Some(notifier) = self.notifier.get() else { return };
        for name in names {
            // ENOENT: the kernel had not cached that name.
            let _ = notifier.inval_entry(INodeNo(dir), OsStr::from_bytes(&name));
        }
    }

    /// Up to `READDIR_BATCH` entries after `cookie`, their names in one buffer (each entry's
    /// `name` is its range there): one allocation per batch, where a name each was 2% of the
    /// daemon's CPU in a 400,000-file parallel `rm -rf`.
    fn readdir_batch(&self, ino: u64, cookie: u64) -> Res<DirBatch> {
        self.call("readdir", |fs| {
            let (mut v, mut names) = (Vec::with_capacity(READDIR_BATCH), Vec::new());
            fs.readdir(ino, cookie, &mut |e| {
                v.push(e.with_name(names.len()..names.len() + e.name.len()));
                names.extend_from_slice(e.name);
                v.len() < READDIR_BATCH
            })?;
            Ok((v, names))
        })
    }

    /// Feed directory entries after `cookie` to `add` (which returns true once the reply is
    /// full) a batch at a time. The engine's lock on the directory is held only while a batch
    /// is read, never while `add` runs. Returns whether anything was added, or the error if
    /// the first batch failed.
    fn fill_dir(&self, ino: u64, mut cookie: u64, mut add: impl FnMut(DirEntry<&[u8]>) -> bool) -> Res<()> {
        let mut added = false;
        loop {
            let (batch, names) = match self.readdir_batch(ino, cookie) {
                Ok(b) => b,
                Err(e) if !added => return Err(e),
                // Part of the listing is already in the reply: hand that out; the next
                // readdir from the last cookie reports the error.
                Err(_) => return Ok(()),
            };
            let n = batch.len();
            for e in batch {
                let c = e.cookie;
                if add(e.with_name(&names[e.name.clone()])) {
                    return Ok(());
                }
                added = true;
                cookie = c;
            }
            if n < READDIR_BATCH {
                return Ok(());
            }
        }
    }
}

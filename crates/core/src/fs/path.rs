//! A small path-based layer over the inode API, for embedded users: resolve a path, create
//! a file with contents, read a whole file, make directories, walk a tree.

use super::{Attr, Cred, FileSystem, FileType};
use crate::error::{Error, Result};
use crate::format::ROOT_INO;

/// Symlinks followed while resolving one path (Linux's MAXSYMLINKS).
const SYMLINK_HOPS_MAX: usize = 40;

fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&byte| byte == b'/').filter(|component| !component.is_empty() && *component != b".")
}

impl FileSystem {
    /// The inode a path names (absolute, from the root), following symlinks.
    pub fn resolve(&self, path: &str) -> Result<Attr> {
        let mut hops = 0;
        self.resolve_from(ROOT_INO, path.as_bytes(), &mut hops)
    }

    fn resolve_from(&self, start: u64, path: &[u8], hops: &mut usize) -> Result<Attr> {
        let mut cur = self.getattr(if path.first() == Some(&b'/') { ROOT_INO } else { start })?;
        for component in components(path) {
            if cur.kind != FileType::Directory {
                return Err(Error::NotDir);
            }
            let next = self.lookup(cur.ino, component)?;
            cur = if next.kind == FileType::Symlink {
                *hops += 1;
                if *hops > SYMLINK_HOPS_MAX {
                    return Err(Error::Loop);
                }
                let target = self.readlink(next.ino)?;
                self.resolve_from(cur.ino, &target, hops)?
            } else {
                next
            };
        }
        Ok(cur)
    }

    fn parent_and_name<'p>(&self, path: &'p str) -> Result<(Attr, &'p [u8])> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
        if name.is_empty() {
            return Err(Error::Invalid("path has no final component"));
        }
        Ok((self.resolve(if dir.is_empty() { "/" } else { dir })?, name.as_bytes()))
    }

    /// Create (or truncate) a regular file at `path` holding `data`.
    pub fn write_file(&self, path: &str, data: &[u8], cred: Cred) -> Result<Attr> {
        let (dir, name) = self.parent_and_name(path)?;
        let attr = match self.lookup(dir.ino, name) {
            Ok(attr) if attr.kind == FileType::Directory => return Err(Error::IsDir),
            Ok(attr) => self.setattr(attr.ino, &super::SetAttr { size: Some(0), ..Default::default() })?,
            Err(Error::NotFound) => self.create(dir.ino, name, 0o644, cred)?,
            Err(error) => return Err(error),
        };
        self.write(attr.ino, 0, data)?;
        self.getattr(attr.ino)
    }

    /// The whole contents of the file at `path`.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let attr = self.resolve(path)?;
        if attr.kind == FileType::Directory {
            return Err(Error::IsDir);
        }
        self.read(attr.ino, 0, usize::try_from(attr.size).map_err(|_| Error::FileTooBig)?)
    }

    /// mkdir -p.
    pub fn create_dir_all(&self, path: &str, mode: u16, cred: Cred) -> Result<Attr> {
        let mut cur = self.getattr(ROOT_INO)?;
        for component in components(path.as_bytes()) {
            cur = match self.lookup(cur.ino, component) {
                Ok(attr) if attr.kind == FileType::Directory => attr,
                Ok(_) => return Err(Error::NotDir),
                Err(Error::NotFound) => self.mkdir(cur.ino, component, mode, cred)?,
                Err(error) => return Err(error),
            };
        }
        Ok(cur)
    }

    /// Visit every entry below `path` (depth first, not following symlinks): `f(path, attr)`.
    pub fn walk(&self, path: &str, f: &mut dyn FnMut(&str, &Attr)) -> Result<()> {
        let top = self.resolve(path)?;
        let mut stack = vec![(path.trim_end_matches('/').to_string(), top.ino)];
        while let Some((dir_path, ino)) = stack.pop() {
            let mut entries = Vec::new();
            self.readdir(ino, 0, &mut |entry| {
                if entry.name != b"." && entry.name != b".." {
                    entries.push(entry.owned());
                }
                true
            })?;
            for entry in entries {
                let entry_path = format!("{}/{}", dir_path, String::from_utf8_lossy(&entry.name));
                let attr = self.getattr(entry.ino)?;
                f(&entry_path, &attr);
                if attr.kind == FileType::Directory {
                    stack.push((entry_path, entry.ino));
                }
            }
        }
        Ok(())
    }
}

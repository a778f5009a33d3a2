//! Values that cross the API: attributes, credentials, directory entries, statfs.

use crate::format::inode::{Timespec, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFSOCK};
use crate::format::{DiskInode, Fork, BLOCK_SIZE};

pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a character device 0/0, overlayfs's mark of a deleted name) at the
/// source name, in the same transaction as the rename.
pub const RENAME_WHITEOUT: u32 = 4;
/// fallocate(2) mode bits, Linux's values (`FileSystem::fallocate` says which combinations
/// are supported).
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
pub const FALLOC_FL_COLLAPSE_RANGE: u32 = 0x08;
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
pub const FALLOC_FL_INSERT_RANGE: u32 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    RegularFile,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    NamedPipe,
    Socket,
}

impl FileType {
    pub fn from_mode(mode: u16) -> FileType {
        match mode & S_IFMT {
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            S_IFCHR => FileType::CharDevice,
            S_IFBLK => FileType::BlockDevice,
            S_IFIFO => FileType::NamedPipe,
            S_IFSOCK => FileType::Socket,
            _ => FileType::RegularFile,
        }
    }
    /// From the 4-bit type stored in directory entries (mode >> 12).
    pub fn from_ftype(t: u8) -> FileType {
        FileType::from_mode((t as u16) << 12)
    }
}

/// Who is creating a file: the new inode's owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte units, as stat(2) reports.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub btime: Timespec,
    pub kind: FileType,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub generation: u32,
    pub blksize: u32,
}

impl Attr {
    pub fn from_inode(ino: u64, di: &DiskInode) -> Attr {
        Attr {
            ino,
            size: di.size,
            blocks: di.blocks * (BLOCK_SIZE as u64 / 512),
            atime: di.atime,
            mtime: di.mtime,
            ctime: di.ctime,
            btime: di.btime,
            kind: FileType::from_mode(di.mode),
            perm: di.mode & 0o7777,
            nlink: di.nlink,
            uid: di.uid,
            gid: di.gid,
            rdev: if let Fork::Device(r) = di.fork { r } else { 0 },
            generation: di.generation,
            blksize: BLOCK_SIZE as u32,
        }
    }

    pub fn mode(&self) -> u16 {
        let t = match self.kind {
            FileType::Directory => S_IFDIR,
            FileType::Symlink => S_IFLNK,
            FileType::CharDevice => S_IFCHR,
            FileType::BlockDevice => S_IFBLK,
            FileType::NamedPipe => S_IFIFO,
            FileType::Socket => S_IFSOCK,
            FileType::RegularFile => crate::format::inode::S_IFREG,
        };
        t | self.perm
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeOrNow {
    Time(Timespec),
    Now,
}

impl TimeOrNow {
    pub fn resolve(self, now: Timespec) -> Timespec {
        match self {
            TimeOrNow::Time(t) => t,
            TimeOrNow::Now => now,
        }
    }
}

/// setattr(2)-family changes; `None` leaves a field alone. ctime is set to now unless given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<Timespec>,
}

/// A directory entry; `readdir` hands out each one's name borrowed from the directory
/// (`DirEntry<&[u8]>`), so listing a directory allocates nothing per entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry<N = Vec<u8>> {
    pub ino: u64,
    /// Pass this back to readdir to continue after this entry.
    pub cookie: u64,
    pub kind: FileType,
    pub name: N,
}

impl<N> DirEntry<N> {
    /// The same entry with its name stored as `name`.
    pub fn with_name<M>(&self, name: M) -> DirEntry<M> {
        DirEntry { ino: self.ino, cookie: self.cookie, kind: self.kind, name }
    }
}

impl DirEntry<&[u8]> {
    /// The entry with its name copied out of the directory.
    pub fn owned(&self) -> DirEntry {
        self.with_name(self.name.to_vec())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

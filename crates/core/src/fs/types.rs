//! Values that cross the API: attributes, credentials, directory entries, statfs.

use crate::format::inode::{Timespec, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFSOCK};
use crate::format::{DiskInode, Fork, BLOCK_SIZE};

/// rename flag: fail with [`Error::Exists`](crate::Error::Exists) if the target name exists.
pub const RENAME_NOREPLACE: u32 = 1;
/// rename flag: swap the two names, both of which must exist.
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a character device 0/0, overlayfs's mark of a deleted name) at the
/// source name, in the same transaction as the rename.
pub const RENAME_WHITEOUT: u32 = 4;
/// fallocate(2) mode bits, Linux's values (`FileSystem::fallocate` says which combinations
/// are supported).
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// Unmap the range (with `FALLOC_FL_KEEP_SIZE`): it reads as zeros and takes no space.
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// Remove the range, shifting what follows down (block-aligned).
pub const FALLOC_FL_COLLAPSE_RANGE: u32 = 0x08;
/// Make the range read as zeros, its blocks allocated.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
/// Insert a hole at the offset, shifting what follows up (block-aligned).
pub const FALLOC_FL_INSERT_RANGE: u32 = 0x20;

/// What kind of file an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    RegularFile,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
    /// A FIFO.
    NamedPipe,
    /// A Unix socket.
    Socket,
}

impl FileType {
    /// From the type bits of a mode (`S_IFMT`).
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

/// Who is creating a file: the new inode's owner, and the umask it is created under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Permission bits (of 0o777) a new inode is created without, unless its directory has a
    /// default ACL, which then limits the mode instead (POSIX.1e). The engine decides which
    /// under the directory's lock, where it reads that ACL.
    pub umask: u16,
}

/// An inode's attributes, as stat(2) reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte units, as stat(2) reports.
    pub blocks: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last change of the data.
    pub mtime: Timespec,
    /// Last change of the inode.
    pub ctime: Timespec,
    /// Creation.
    pub btime: Timespec,
    /// File type.
    pub kind: FileType,
    /// Permission bits (with setuid, setgid, sticky).
    pub perm: u16,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device node.
    pub rdev: u64,
    /// Generation: a reused inode number gets a new one (NFS-style file handles).
    pub generation: u32,
    /// Preferred I/O size: the block size.
    pub blksize: u32,
}

impl Attr {
    pub(crate) fn from_inode(ino: u64, di: &DiskInode) -> Attr {
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

    /// The full mode: type bits and permission bits.
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
/// A time to set: a given one or the current time.
pub enum TimeOrNow {
    /// This time.
    Time(Timespec),
    /// The time of the call.
    Now,
}

impl TimeOrNow {
    /// The time this stands for, `now` being the current time.
    pub fn resolve(self, now: Timespec) -> Timespec {
        match self {
            TimeOrNow::Time(t) => t,
            TimeOrNow::Now => now,
        }
    }
}

/// The privileges a change takes from a file that is not a directory, as Linux's VFS takes
/// them when a file is written, truncated or given away (`file_remove_privs`,
/// `should_remove_suid`, `setattr_should_drop_sgid`, `cap_inode_killpriv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrivDrop {
    /// The file capabilities (`security.capability`) only: a changer who may keep the set-id
    /// bits (CAP_FSETID) writes or truncates.
    Capabilities,
    /// The file capabilities, setuid, and setgid where group execute is set (without it,
    /// setgid marks mandatory locking, not a privilege).
    CapabilitiesAndSetId,
}

/// setattr(2)-family changes; `None` leaves a field alone. ctime is set to now unless given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (chmod).
    pub mode: Option<u16>,
    /// Owner (chown).
    pub uid: Option<u32>,
    /// Group (chown).
    pub gid: Option<u32>,
    /// Size (truncate).
    pub size: Option<u64>,
    /// Access time (utimensat).
    pub atime: Option<TimeOrNow>,
    /// Modification time (utimensat).
    pub mtime: Option<TimeOrNow>,
    /// Change time.
    pub ctime: Option<Timespec>,
}

/// A directory entry; `readdir` hands out each one's name borrowed from the directory
/// (`DirEntry<&[u8]>`), so listing a directory allocates nothing per entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry<N = Vec<u8>> {
    /// The inode the name refers to.
    pub ino: u64,
    /// Pass this back to readdir to continue after this entry.
    pub cookie: u64,
    /// Its file type.
    pub kind: FileType,
    /// The name.
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

/// The file system's size and free space, as statfs(2) reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Blocks in all.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks available to users (the same: there is no reserve).
    pub bavail: u64,
    /// Inodes in all.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

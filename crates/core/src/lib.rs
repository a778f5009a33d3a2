//! ferrofs: a crash-safe, journaling POSIX file system engine that runs in user space.
//!
//! The engine keeps a file system on any [`BlockDevice`](dev::BlockDevice) (an image file or
//! block device, [`dev::FileDevice`]; memory, [`dev::MemDevice`]) and serves it through
//! [`FileSystem`]: an inode-number based, thread-safe API (`Send + Sync`, every call takes
//! `&self`) shaped like the kernel's VFS and FUSE's low-level protocol, with path helpers on
//! top. Every change is a transaction in a write-ahead log: after a crash, the next mount
//! replays the log and the image is as it was after the last durable operation
//! ([`FileSystem::fsync`], [`FileSystem::sync`]).
//!
//! The main calls:
//! - [`mkfs::mkfs`] (or [`FileSystem::mkfs`]) writes a new file system; [`fsck::check`] checks
//!   and repairs one that is not mounted.
//! - [`grow::grow`] grows one that is not mounted onto a larger device.
//! - [`FileSystem::mount_device`] mounts one with [`MountOptions`] (read-only, journal
//!   tunables, a cache budget shared by several file systems, atime policy);
//!   [`FileSystem::unmount`] checkpoints and leaves a clean log.
//! - `lookup`, `create`, `mkdir`, `write`, `read`, `rename`, `unlink`, `readdir`, xattrs,
//!   `fallocate`, `seek`, `fsync`... on inode numbers ([`ROOT_INO`] is `/`); errors are
//!   [`Error`], each mapping to an errno.
//! - [`FileSystem::stats`] is a snapshot of the counters (journal, caches, allocation
//!   groups, memory); [`FileSystem::info`] describes the image.
//!
//! ```
//! use ferrofs::{dev::MemDevice, Cred, FileSystem, MkfsOptions, MountOptions, ROOT_INO};
//! use std::sync::Arc;
//!
//! # fn main() -> ferrofs::Result<()> {
//! let dev = Arc::new(MemDevice::new(64 << 20));
//! FileSystem::mkfs(&*dev, &MkfsOptions::default())?;
//! let fs = FileSystem::mount_device(dev, &MountOptions::default())?;
//! let me = Cred { uid: 1000, gid: 1000, umask: 0 };
//! let draft = fs.create(ROOT_INO, b"draft", 0o644, me)?;
//! fs.write(draft.ino, 0, b"hello")?;
//! fs.rename(ROOT_INO, b"draft", ROOT_INO, b"final", 0)?;
//! fs.fsync(draft.ino, false)?; // durable from here on
//! let file = fs.lookup(ROOT_INO, b"final")?;
//! assert_eq!(fs.read(file.ino, 0, 5)?, b"hello");
//! assert!(fs.stats().journal.commits >= 3);
//! fs.unmount()?; // checkpoint, clean log
//! # Ok(())
//! # }
//! ```
//!
//! Layering: a module imports only from the rows below its own (tests/layering.rs checks
//! that no import cycle forms and that the format imports nothing above it):
//!
//! ```text
//! stats                 the counters' snapshot
//! fs, fsck, grow        the API (namespace, data, rename, orphans); the checker and repair;
//!                       growing an unmounted file system
//! xattr                 extended attributes
//! dir, file             directories and block maps, on B+trees
//! store                 B+tree nodes as a transaction sees them
//! trans                 a transaction: reservation, changes, commit
//! mount                 one mounted image: superblock, AGs, caches, journal
//! discard               giving free space back: trim, `-o discard`
//! ag, inode, journal    allocation groups; the inode cache; the log (CIL, checkpoints, AIL)
//! cache, btree, mkfs    the memory budget; the B+tree; geometry planning
//! buf                   block buffers
//! format, reclaim       every on-disk structure; what a cache reclaims through
//! dev, error            block devices and the image lock; errors
//! ```
//!
//! Only what an embedding application needs is public (docs/DESIGN.md, "Public API"). The
//! `testing` cargo feature opens the internals the engine's integration tests reach into;
//! nothing else may use it.
#![cfg_attr(not(feature = "testing"), deny(missing_docs))]

pub(crate) mod acl;
#[cfg(feature = "testing")]
pub mod ag;
#[cfg(not(feature = "testing"))]
pub(crate) mod ag;
pub(crate) mod btree;
pub(crate) mod buf;
#[cfg(feature = "testing")]
pub mod cache;
#[cfg(not(feature = "testing"))]
pub(crate) mod cache;
pub mod dev;
pub(crate) mod dir;
pub(crate) mod discard;
pub(crate) mod error;
pub(crate) mod file;
#[cfg(feature = "testing")]
pub mod format;
#[cfg(not(feature = "testing"))]
pub(crate) mod format;
pub(crate) mod fs;
pub mod fsck;
pub mod grow;
pub(crate) mod holds;
pub(crate) mod inode;
#[cfg(feature = "testing")]
pub mod journal;
#[cfg(not(feature = "testing"))]
pub(crate) mod journal;
pub mod mkfs;
pub(crate) mod mount;
#[cfg(feature = "testing")]
pub mod reclaim;
#[cfg(not(feature = "testing"))]
pub(crate) mod reclaim;
pub(crate) mod stats;
pub(crate) mod store;
pub(crate) mod trans;
pub mod tune;
#[cfg(feature = "testing")]
pub mod xattr;
#[cfg(not(feature = "testing"))]
pub(crate) mod xattr;

// The general lock and memory instrumentation, under the names the engine's modules use.
use ferrofs_lockstat as lockstat;
use ferrofs_lockstat::{memory, sync};

pub use acl::{Acl, AclKind, ACCESS_XATTR, DEFAULT_XATTR};
pub use cache::{CacheBudget, DEFAULT_CACHE_BYTES};
pub use discard::TrimReport;
pub use error::{Error, Result};
pub use format::inode::Timespec;
pub use format::inode::{LINK_MAX, MAX_FILE_BLOCKS, SYMLINK_MAX};
pub use format::is_index_block;
pub use format::sb::{check_label, LABEL_MAX};
pub use format::{Geometry, Superblock, BLOCK_SIZE, INODE_SIZE, NAME_MAX, ROOT_INO, XATTR_VALUE_MAX};
pub use fs::*;
pub use journal::JournalConfig;
pub use mkfs::MkfsOptions;
pub use mount::{has_superblock_magic, read_superblock, replayed_in_memory, AtimeMode, Frozen, MountOptions};
pub use stats::{
    AgCounters, AgInfo, CacheCounters, CacheUsage, Info, JournalCounters, MemoryUsage, Stats, BLOCK_CACHE_BYTES,
    DISK_INODE_STRUCT_BYTES, INODE_CACHE_BYTES, INODE_STRUCT_BYTES,
};
pub use xattr::{XATTR_CREATE, XATTR_REPLACE};

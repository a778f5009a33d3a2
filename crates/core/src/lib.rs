//! ferrofs: a crash-safe, journaling POSIX file system engine.
//!
//! Layering (dependencies point down only):
//!   fs (API) -> dir, file, xattr, orphan -> inode, ag -> journal -> buf/cache -> format -> dev

pub mod buf;
pub mod ag;
pub mod btree;
pub mod cache;
pub mod dev;
pub mod error;
pub mod dir;
pub mod file;
pub mod format;
pub mod fs;
pub mod fsck;
pub mod inode;
pub mod journal;
pub mod lockstat;
pub mod memory;
pub mod mkfs;
pub mod mount;
pub mod stats;
pub mod store;
pub mod sync;
pub mod trans;
pub mod xattr;

pub use cache::{CacheBudget, DEFAULT_CACHE_BYTES};
pub use error::{Error, Result};
pub use format::inode::Timespec;
pub use format::{Geometry, Superblock, BLOCK_SIZE, INODE_SIZE, NAME_MAX, ROOT_INO};
pub use fs::*;
pub use journal::JournalConfig;
pub use mkfs::MkfsOptions;
pub use mount::{has_superblock_magic, read_superblock, AtimeMode, MountOptions};
pub use stats::{BLOCK_CACHE_BYTES, DISK_INODE_STRUCT_BYTES, INODE_CACHE_BYTES, INODE_STRUCT_BYTES, AgCounters, AgInfo, CacheCounters, CacheUsage, Info, JournalCounters, MemoryUsage, Stats};
pub use xattr::{XATTR_CREATE, XATTR_REPLACE, XATTR_VALUE_MAX};

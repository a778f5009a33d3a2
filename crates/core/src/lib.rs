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
pub mod mkfs;
pub mod mount;
pub mod reclaim;
pub mod store;
pub mod trans;
pub mod xattr;

// The general lock and memory instrumentation, under the names the engine's modules use.
use ferrofs_lockstat as lockstat;
use ferrofs_lockstat::{memory, sync};

pub use error::{Error, Result};
pub use fs::*;
pub use mkfs::MkfsOptions;
pub use mount::{AtimeMode, MountOptions};

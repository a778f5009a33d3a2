//! ferrofs: a crash-safe, journaling POSIX file system engine.
//!
//! Layering (dependencies point down only):
//!   fs (API) -> dir, file, xattr, orphan -> inode, ag -> journal -> buf/cache -> format -> dev

pub mod buf;
pub mod btree;
pub mod dev;
pub mod error;
pub mod format;
pub mod lockstat;

pub use error::{Error, Result};

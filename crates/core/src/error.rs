//! The one error type of the engine. Every variant maps to an errno, so the FUSE adapter and
//! the embedded API report the same thing for the same failure.

use std::io;

/// Why an operation failed; [`Error::errno`] is the errno a system call reports for it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// ENOENT: no such name (or inode).
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST: the name is taken.
    #[error("file exists")]
    Exists,
    /// ENOTEMPTY: rmdir or rename over a directory that has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// ENOTDIR: a directory operation on something else.
    #[error("not a directory")]
    NotDir,
    /// EISDIR: a file operation on a directory.
    #[error("is a directory")]
    IsDir,
    /// ENAMETOOLONG: a name over [`NAME_MAX`](crate::NAME_MAX) bytes.
    #[error("file name longer than 255 bytes")]
    NameTooLong,
    /// EINVAL: an argument out of range; the message says which.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// mkfs options that do not fit the device (the message says which limit).
    #[error("invalid geometry: {0}")]
    Geometry(String),
    /// ENOSPC: no free blocks or inodes.
    #[error("no space left on device")]
    NoSpace,
    /// EMLINK: an inode at [`LINK_MAX`](crate::LINK_MAX) links.
    #[error("too many links")]
    TooManyLinks,
    /// EROFS: mounted or remounted read-only.
    #[error("read-only file system")]
    ReadOnly,
    /// ENODATA: no extended attribute of that name.
    #[error("no such attribute")]
    NoAttr,
    /// E2BIG: an extended attribute name or value over its limit.
    #[error("attribute value or name too large")]
    TooBig,
    /// ERANGE: the answer is larger than the buffer the caller offered.
    #[error("result does not fit the buffer")]
    Range,
    /// EFBIG: past the largest file size.
    #[error("file too large")]
    FileTooBig,
    /// EOPNOTSUPP: a mode or flag the engine does not implement.
    #[error("operation not supported")]
    NotSupported,
    /// EPERM: not allowed for this inode (a directory's hard link, for one).
    #[error("operation not permitted")]
    NotPermitted,
    /// EACCES: refused by the inode's kind (a default ACL on a file that is no directory).
    #[error("permission denied")]
    Denied,
    /// ENXIO: SEEK_DATA or SEEK_HOLE at or past the end of the file.
    #[error("no data past this offset")]
    NoData,
    /// ELOOP: a path crosses too many symbolic links.
    #[error("too many levels of symbolic links")]
    Loop,
    /// ESTALE: the inode number no longer names a live inode.
    #[error("stale file handle")]
    Stale,
    /// EBUSY: the operation would disturb something in use; the message says what.
    #[error("file system is busy: {0}")]
    Busy(String),
    /// The device failed (or the file system has shut down after an earlier failure: EIO).
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// A structure read from the device failed verification. `block` is the device block
    /// number (or the inode number for `what == "inode"`).
    #[error("corrupt {what} at block {block}: {detail}")]
    Corrupt {
        /// The kind of structure ("inode", "btree node", ...).
        what: &'static str,
        /// Where it is.
        block: u64,
        /// What failed verification.
        detail: String,
    },
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Corrupt`] about the `what` at `block`.
    pub fn corrupt(what: &'static str, block: u64, detail: impl Into<String>) -> Error {
        Error::Corrupt { what, block, detail: detail.into() }
    }

    /// The errno a system call reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Invalid(_) | Error::Geometry(_) => libc::EINVAL,
            Error::NoSpace => libc::ENOSPC,
            Error::TooManyLinks => libc::EMLINK,
            Error::ReadOnly => libc::EROFS,
            Error::NoAttr => libc::ENODATA,
            Error::TooBig => libc::E2BIG,
            Error::Range => libc::ERANGE,
            Error::FileTooBig => libc::EFBIG,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::NotPermitted => libc::EPERM,
            Error::Denied => libc::EACCES,
            Error::NoData => libc::ENXIO,
            Error::Loop => libc::ELOOP,
            Error::Stale => libc::ESTALE,
            Error::Busy(_) => libc::EBUSY,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EUCLEAN,
        }
    }
}

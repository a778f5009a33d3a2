//! The one error type of the engine. Every variant maps to an errno, so the FUSE adapter and
//! the embedded API report the same thing for the same failure.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("file name longer than 255 bytes")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// mkfs options that do not fit the device (the message says which limit).
    #[error("invalid geometry: {0}")]
    Geometry(String),
    #[error("no space left on device")]
    NoSpace,
    #[error("too many links")]
    TooManyLinks,
    #[error("read-only file system")]
    ReadOnly,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value or name too large")]
    TooBig,
    #[error("result does not fit the buffer")]
    Range,
    #[error("file too large")]
    FileTooBig,
    #[error("operation not supported")]
    NotSupported,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("no data past this offset")]
    NoData,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("stale file handle")]
    Stale,
    #[error("file system is busy: {0}")]
    Busy(String),
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// A structure read from the device failed verification. `block` is the device block
    /// number (or the inode number for `what == "inode"`).
    #[error("corrupt {what} at block {block}: {detail}")]
    Corrupt { what: &'static str, block: u64, detail: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
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
            Error::NoData => libc::ENXIO,
            Error::Loop => libc::ELOOP,
            Error::Stale => libc::ESTALE,
            Error::Busy(_) => libc::EBUSY,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EUCLEAN,
        }
    }
}

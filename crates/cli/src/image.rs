//! Opening image files (or block devices) for the subcommands, and reading what they hold.

use crate::failure::{CliResult, Context, Failure};
use ferrofs::dev::{BlockDevice, FileDevice};
use ferrofs::format::Superblock;
use ferrofs::{FileSystem, MountOptions};
use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

/// Open an existing image; writable opens take the exclusive lock, read-only ones a shared one.
pub fn open(path: &Path, read_only: bool) -> CliResult<Arc<FileDevice>> {
    match FileDevice::open(path, read_only) {
        Ok(dev) => Ok(Arc::new(dev)),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Err(Failure::new(
            path.display().to_string(),
            "in use by another process (is it mounted?)",
        )),
        Err(e) => Err(Failure::new(format!("open {}", path.display()), e)),
    }
}

/// The superblock, if the device holds a ferrofs file system.
pub fn superblock(dev: &dyn BlockDevice) -> Option<Superblock> {
    ferrofs::mount::read_superblock(dev).ok()
}

/// Mount read-only: the log is replayed into memory, the image is not written.
pub fn mount_read_only(path: &Path) -> CliResult<FileSystem> {
    let dev: Arc<dyn BlockDevice> = open(path, true)?;
    let opts = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    FileSystem::mount_device(dev, &opts).context(|| format!("mount {} read-only", path.display()))
}

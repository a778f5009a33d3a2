//! Opening image files (or block devices) for the subcommands, and reading what they hold.

use crate::failure::{CliResult, Context, Failure};
use crate::mount_config;
use crate::signature::{self, Contents};
use ferrofs::dev::{BlockDevice, FileDevice};
use ferrofs::{FileSystem, MountOptions};
use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

/// Open an existing image; writable opens take the exclusive lock, read-only ones a shared one.
///
/// An image that is mounted fails at once, naming where. One that is locked but not mounted
/// is most likely held by a daemon still finishing its unmount (`umount` returns before the
/// daemon has checkpointed and closed the image): wait for it, bounded, and say so.
pub fn open(path: &Path, read_only: bool) -> CliResult<Arc<FileDevice>> {
    match FileDevice::open(path, read_only) {
        Ok(dev) => return Ok(Arc::new(dev)),
        Err(e) if e.kind() != ErrorKind::WouldBlock => return Err(Failure::new(format!("open {}", path.display()), e)),
        Err(_) => {}
    }
    if let Some(dir) = path.canonicalize().ok().and_then(|p| mount_config::mounted_on(&p)) {
        return Err(Failure::new(path.display().to_string(), format!("in use: mounted on {dir}")));
    }
    eprintln!(
        "ferrofs: {} is locked by another process; waiting up to {} s for it to let go",
        path.display(),
        mount_config::LOCK_WAIT.as_secs()
    );
    match FileDevice::open_wait(path, read_only, mount_config::LOCK_WAIT) {
        Ok(dev) => Ok(Arc::new(dev)),
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            Err(Failure::new(path.display().to_string(), "in use by another process"))
        }
        Err(e) => Err(Failure::new(format!("open {}", path.display()), e)),
    }
}

/// [`open`] writable for an offline command; a mounted image is refused with `hint` (what to
/// do instead) after where it is mounted.
pub fn open_unmounted(path: &Path, hint: &str) -> CliResult<Arc<FileDevice>> {
    open(path, false).map_err(|f| {
        if f.why.starts_with("in use: mounted on") {
            Failure::new(f.what, format!("{}: {hint}", f.why))
        } else {
            f
        }
    })
}

/// Fail with what the image is instead, unless it holds a ferrofs file system (a damaged one
/// included: the engine then says what is wrong with it).
pub fn require_ferrofs(path: &Path) -> CliResult<()> {
    match signature::contents(path) {
        Ok(found @ (Contents::Foreign(_) | Contents::Zeros | Contents::Unknown)) => {
            Err(Failure::new(path.display().to_string(), format!("not a ferrofs image (found: {found})")))
        }
        // Unreadable: opening it again says why, in the words of the command that needs it.
        Ok(Contents::Ferrofs(_) | Contents::DamagedFerrofs) | Err(_) => Ok(()),
    }
}

/// Mount read-only: the log is replayed into memory, the image is not written.
pub fn mount_read_only(path: &Path) -> CliResult<FileSystem> {
    let dev: Arc<dyn BlockDevice> = open(path, true)?;
    require_ferrofs(path)?;
    mount_in_memory(path, dev)
}

fn mount_in_memory(path: &Path, dev: Arc<dyn BlockDevice>) -> CliResult<FileSystem> {
    let opts = MountOptions { read_only: true, ..MountOptions::default() };
    FileSystem::mount_device(dev, &opts).context(|| format!("mount {} read-only", path.display()))
}

/// [`mount_read_only`], or, when the image is mounted, the same without its lock (like
/// dumpe2fs on a mounted ext4): what the mount has written so far, the log replayed in memory.
/// Returns where it is mounted too. A checkpoint writing home while we read may show us blocks
/// of two moments that do not fit together: then read again, a bounded number of times.
pub fn mount_read_only_even_if_mounted(path: &Path) -> CliResult<(FileSystem, Option<String>)> {
    const READS_MAX: u32 = 3;
    let Some(dir) = path.canonicalize().ok().and_then(|p| mount_config::mounted_on(&p)) else {
        return mount_read_only(path).map(|fs| (fs, None));
    };
    require_ferrofs(path)?;
    let mut reads = 0;
    loop {
        reads += 1;
        let dev = FileDevice::open_unlocked(path).context(|| format!("open {}", path.display()))?;
        match mount_in_memory(path, Arc::new(dev)) {
            Ok(fs) => return Ok((fs, Some(dir))),
            Err(f) if reads == READS_MAX => return Err(f),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// The label and UUID of the image at `path`, read without a lock: it may be mounted (they
/// change only while it is not). `None` when it cannot be read.
pub fn identity(path: &Path) -> Option<(String, String)> {
    let dev = FileDevice::open_unlocked(path).ok()?;
    let sb = ferrofs::read_superblock(&dev).ok()?;
    Some((sb.label, crate::geometry::uuid_string(&sb.uuid)))
}

/// The block device that `LABEL=x` or `UUID=x` (fstab's forms) names: the one ferrofs file
/// system with that label or UUID among the block devices the kernel lists (partitions, loop
/// devices), read without a lock. blkid does not know ferrofs, so this looks itself; image
/// files are not searched (their path names them). `None`: `source` is a path, not a tag.
pub fn resolve_tag(source: &Path) -> CliResult<Option<std::path::PathBuf>> {
    let Some(tag) = source.to_str().filter(|_| !source.exists()) else {
        return Ok(None);
    };
    let wanted: Box<dyn Fn(&ferrofs::Superblock) -> bool> = if let Some(label) = tag.strip_prefix("LABEL=") {
        Box::new(move |sb| sb.label == label)
    } else if let Some(uuid) = tag.strip_prefix("UUID=") {
        let uuid = crate::tune::parse_uuid(uuid).map_err(|why| Failure::new(tag, why))?.into_bytes();
        Box::new(move |sb| sb.uuid == uuid)
    } else {
        return Ok(None);
    };
    let devices = std::fs::read_dir("/sys/class/block").context(|| format!("{tag}: list block devices"))?;
    let found: Vec<_> = devices
        .flatten()
        .map(|d| Path::new("/dev").join(d.file_name()))
        .filter(|dev| ferrofs_superblock(dev).is_some_and(|sb| wanted(&sb)))
        .collect();
    match &found[..] {
        [dev] => Ok(Some(dev.clone())),
        [] => Err(Failure::new(
            tag,
            "no block device holds a ferrofs file system with it (image files are not searched: give their path)",
        )),
        _ => Err(Failure::new(tag, format!("held by several block devices: {found:?}"))),
    }
}

/// The superblock of a device that starts with ferrofs's magic, if it is readable.
fn ferrofs_superblock(dev: &Path) -> Option<ferrofs::Superblock> {
    let dev = FileDevice::open_unlocked(dev).ok()?;
    let mut first = vec![0u8; ferrofs::BLOCK_SIZE];
    dev.read_at(&mut first, 0).ok()?;
    ferrofs::has_superblock_magic(&first).then(|| ferrofs::read_superblock(&dev).ok()).flatten()
}

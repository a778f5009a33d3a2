//! The README's embedded example as a program: make a file system in an image file, write a
//! file through the path helpers, make it durable, read it back, unmount, then mount the image
//! again and find the file there. `cargo run -p ferrofs --example embedded [IMAGE]` (default:
//! an image in the temporary directory, removed at the end); any failure exits non-zero.

use ferrofs::{dev::FileDevice, Cred, FileSystem, MkfsOptions, MountOptions};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let image = std::env::args()
        .nth(1)
        .map_or_else(|| std::env::temp_dir().join(format!("ferrofs-embedded-{}.img", std::process::id())), Into::into);

    let dev = Arc::new(FileDevice::create(&image, 1 << 30)?);
    FileSystem::mkfs(&*dev, &MkfsOptions::default())?;
    let fs = FileSystem::mount_device(dev, &MountOptions::default())?;
    let me = Cred { uid: 1000, gid: 1000, umask: 0 };
    fs.create_dir_all("/a/b", 0o755, me)?;
    fs.write_file("/a/b/hello", b"hi", me)?;
    let f = fs.resolve("/a/b/hello")?;
    fs.fsync(f.ino, false)?; // durable
    assert_eq!(fs.read_file("/a/b/hello")?, b"hi");
    println!("{} commits, {} bytes logged", fs.stats().journal.commits, fs.stats().journal.log_bytes);
    fs.unmount()?; // checkpoint, clean log
    drop(fs);

    // Mounted again, the image holds the file, and the unmount left nothing to replay.
    let fs = FileSystem::mount_device(
        Arc::new(FileDevice::open(&image, true)?),
        &MountOptions { read_only: true, ..MountOptions::default() },
    )?;
    assert_eq!(fs.read_file("/a/b/hello")?, b"hi");
    assert_eq!(fs.info().log_records_replayed, 0);
    drop(fs);
    std::fs::remove_file(&image)?;
    println!("ok: {}", image.display());
    Ok(())
}

//! What the API-level tests share: a fresh file system on an in-memory device, and remount.

#![allow(dead_code)]

use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::*;
use std::sync::Arc;

pub const ROOT: u64 = 1;
pub const C: Cred = Cred { uid: 1000, gid: 1000, umask: 0 };

pub fn fresh(size: u64) -> (Arc<MemDevice>, FileSystem) {
    let dev = Arc::new(MemDevice::new(size));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    (dev, fs)
}

pub fn remount(dev: &Arc<MemDevice>, fs: FileSystem) -> FileSystem {
    fs.unmount().unwrap();
    drop(fs);
    FileSystem::mount_device(dev.clone() as Arc<dyn BlockDevice>, &MountOptions::default()).unwrap()
}

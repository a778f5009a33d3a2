//! Appending writes: where their blocks go, the device storage given ahead of them, and the
//! bytes of fresh blocks; fsck clean after each.

use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::format::inode::Fork;
use ferrofs::format::{DiskInode, INODE_SIZE};
use ferrofs::*;
use std::io;
use std::sync::{Arc, Mutex};

mod common;

use common::{fresh, C, ROOT};

const BS: u64 = BLOCK_SIZE as u64;

fn fsck_clean(dev: &dyn BlockDevice) {
    let report = ferrofs::fsck::check(dev, &ferrofs::fsck::FsckOptions::default(), &|_, _, _| {}).unwrap();
    assert!(report.is_clean(), "fsck found errors:\n{}", report.messages.join("\n"));
}

/// Inode `ino` as the image holds it (after an unmount wrote everything home).
fn inode_on_disk(dev: &MemDevice, ino: u64) -> DiskInode {
    let geo = read_superblock(dev).unwrap().geo;
    let mut image = [0u8; INODE_SIZE];
    dev.read_at(&mut image, geo.inode_offset(ino).unwrap()).unwrap();
    DiskInode::decode(&image, ino, &geo).unwrap()
}

#[test]
fn an_append_lands_right_after_the_files_last_block() {
    let (dev, fs) = fresh(64 << 20);
    // `early` takes the first free block, `f` the one after it; removing `early` (durably,
    // so the block is free again) leaves a free block before `f`'s.
    let early = fs.create(ROOT, b"early", 0o644, C).unwrap().ino;
    fs.write(early, 0, &[1; 4096]).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.write(f, 0, &[2; 4096]).unwrap();
    fs.unlink(ROOT, b"early").unwrap();
    fs.sync().unwrap();
    // Appended one block at a time, `f` stays one extent: each block goes after the last,
    // not into the first free block of the allocation group.
    for i in 1..8u64 {
        fs.write(f, i * BS, &[2; 4096]).unwrap();
    }
    assert_eq!(fs.read(f, 0, 8 * 4096).unwrap(), vec![2; 8 * 4096]);
    fs.unmount().unwrap();
    drop(fs);
    let Fork::Extents { n, ext } = inode_on_disk(&dev, f).fork else { panic!("f's map left the inode") };
    assert_eq!(n, 1, "an appended file should be one extent: {:?}", &ext[..n as usize]);
    assert_eq!(ext[0].len, 8);
    fsck_clean(&*dev);
}

/// A memory device that records the ranges it is asked to preallocate.
struct Recording {
    inner: MemDevice,
    preallocated: Mutex<Vec<(u64, u64)>>,
}

impl BlockDevice for Recording {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn preallocate(&self, off: u64, len: u64) -> io::Result<()> {
        self.preallocated.lock().unwrap().push((off, len));
        Ok(())
    }
}

#[test]
fn appends_give_the_device_storage_a_mebibyte_ahead() {
    let dev = Arc::new(Recording { inner: MemDevice::new(64 << 20), preallocated: Mutex::new(Vec::new()) });
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    dev.preallocated.lock().unwrap().clear();
    // 600 blocks in order cross at least two 1 MiB boundaries of the device.
    let blocks = 600u64;
    for i in 0..blocks {
        fs.write(f, i * BS, &[3; 4096]).unwrap();
    }
    let calls = dev.preallocated.lock().unwrap().clone();
    assert!((2..=3).contains(&calls.len()), "one preallocation per 1 MiB entered, got {calls:?}");
    for &(off, len) in &calls {
        assert!(off % (1 << 20) == 0 && len == 1 << 20, "not one aligned mebibyte: {off} +{len}");
    }
    // Nothing written in place (overwrites) asks for any.
    for i in 0..blocks {
        fs.write(f, i * BS, &[4; 4096]).unwrap();
    }
    assert_eq!(dev.preallocated.lock().unwrap().len(), calls.len());
    assert_eq!(fs.read(f, 0, (blocks * BS) as usize).unwrap(), vec![4; (blocks * BS) as usize]);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&*dev);
}

#[test]
fn fresh_blocks_hold_the_data_and_zeros_around_it() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    // Whole blocks, then a write that starts and ends inside blocks, past a hole.
    fs.write(f, 0, &[5; 8192]).unwrap();
    fs.write(f, 5 * BS + 100, &[6; 5000]).unwrap();
    let mut want = vec![0u8; (5 * BS + 5100) as usize];
    want[..8192].fill(5);
    want[(5 * BS + 100) as usize..].fill(6);
    assert_eq!(fs.read(f, 0, want.len() + 10).unwrap(), want);
    // The rest of the last block is zeros too, seen once the file grows over it.
    fs.setattr(f, &SetAttr { size: Some(7 * BS), ..Default::default() }).unwrap();
    want.resize((7 * BS) as usize, 0);
    assert_eq!(fs.read(f, 0, want.len()).unwrap(), want);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&*dev);
}

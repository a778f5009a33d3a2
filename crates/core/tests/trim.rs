//! Giving free space back: `FileSystem::trim` (fstrim) and `-o discard`, on an in-memory
//! device whose punched pages hold no memory (`MemDevice::allocated_pages`).

mod common;

use common::{C, ROOT};
use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::fsck::{check, FsckOptions};
use ferrofs::*;
use std::sync::Arc;

const FILE_BYTES: usize = 256 << 10;
const FILES: u8 = 16;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

fn mounted(discard: bool) -> (Arc<MemDevice>, FileSystem) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions { discard, ..MountOptions::default() }).unwrap();
    (dev, fs)
}

/// Files f0..f15 of 256 KiB each, durable.
fn write_files(fs: &FileSystem) {
    for i in 0..FILES {
        fs.write_file(&format!("/f{i}"), &pattern(FILE_BYTES, i), C).unwrap();
    }
    fs.sync().unwrap();
}

/// Unlink the even files: half the data.
fn remove_half(fs: &FileSystem) {
    for i in (0..FILES).step_by(2) {
        fs.unlink(ROOT, format!("f{i}").as_bytes()).unwrap();
    }
}

/// A mount whose files were written, then half of them unlinked and synced; and the pages
/// the device held before the unlinks.
fn half_removed(discard: bool) -> (Arc<MemDevice>, FileSystem, usize) {
    let (dev, fs) = mounted(discard);
    write_files(&fs);
    let full = dev.allocated_pages();
    remove_half(&fs);
    fs.sync().unwrap();
    (dev, fs, full)
}

fn assert_odd_files_intact(fs: &FileSystem) {
    for i in (1..FILES).step_by(2) {
        let ino = fs.resolve(&format!("/f{i}")).unwrap().ino;
        assert!(fs.read(ino, 0, FILE_BYTES).unwrap() == pattern(FILE_BYTES, i), "f{i} changed");
    }
}

fn assert_fsck_clean(dev: &dyn BlockDevice) {
    let report = check(dev, &FsckOptions { repair: false }, &|_, _, _| {}).unwrap();
    assert_eq!(report.errors_found, 0, "{:?}", report.messages);
}

/// Pages the unlinked files' data held, less a few: the unlinks' own log records and
/// metadata take pages of the image (one here, 511 of 512 came back).
const HALF_PAGES: usize = FILES as usize / 2 * FILE_BYTES / 4096 - 16;

/// After unlinking half the data, a trim gives its pages back (and every other free block),
/// keeps the other files' data and leaves a clean image.
#[test]
fn trim_gives_back_what_was_freed() {
    let (dev, fs, full) = half_removed(false);
    assert!(dev.allocated_pages() + 8 > full, "without discard nothing is punched by an unlink");
    let report = fs.trim(0).unwrap();
    assert!(!report.unsupported);
    let free_bytes = fs.statfs().bfree * BLOCK_SIZE as u64;
    assert!(report.bytes >= free_bytes, "trimmed {} bytes of {free_bytes} free", report.bytes);
    assert!(full - dev.allocated_pages() >= HALF_PAGES, "{full} pages before, {} after", dev.allocated_pages());
    assert_odd_files_intact(&fs);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&*dev);
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    assert_odd_files_intact(&fs);
}

/// The frees of operations that completed but are not durable yet are made durable by the
/// trim itself, so `rm` then trim gives the space back without a sync in between.
#[test]
fn trim_right_after_unlinks_forces_their_frees() {
    let (dev, fs) = mounted(false);
    write_files(&fs);
    let full = dev.allocated_pages();
    remove_half(&fs);
    fs.trim(0).unwrap();
    assert!(full - dev.allocated_pages() >= HALF_PAGES, "{full} pages before, {} after", dev.allocated_pages());
    assert_odd_files_intact(&fs);
}

/// Runs shorter than the minimum stay: with every other file freed, each free run is one
/// file long (256 KiB), so a 1 MiB minimum leaves them but takes the big free run at the end.
#[test]
fn trim_skips_runs_shorter_than_the_minimum() {
    let (_dev, fs) = mounted(false);
    write_files(&fs);
    remove_half(&fs);
    let long = fs.trim(1 << 20).unwrap();
    let all = fs.trim(0).unwrap();
    assert!(long.extents >= 1 && all.extents >= long.extents + FILES as u64 / 2 - 1, "{long:?} then {all:?}");
    assert!(long.bytes < all.bytes);
    assert_eq!(fs.trim(u64::MAX).unwrap().extents, 0, "no run is 16 EiB long");
}

/// `-o discard`: the unlinked files' pages go back once their frees are durable, with no
/// trim; the rest of the data stays, and the image is clean.
#[test]
fn discard_punches_what_each_checkpoint_freed() {
    let (dev, fs, full) = half_removed(true);
    assert!(full - dev.allocated_pages() >= HALF_PAGES, "{full} pages before, {} after", dev.allocated_pages());
    assert_odd_files_intact(&fs);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&*dev);
}

/// Blocks freed and allocated again at once, round after round under `-o discard`: no
/// discard ever lands on a block that holds a live file's data.
#[test]
fn discard_never_punches_reallocated_blocks() {
    let (_dev, fs) = mounted(true);
    for round in 0..200u32 {
        let name = format!("/r{}", round % 3);
        let _ = fs.unlink(ROOT, &name.as_bytes()[1..]);
        fs.write_file(&name, &pattern(64 << 10, round as u8), C).unwrap();
        if round % 7 == 0 {
            fs.sync().unwrap();
        }
        for back in 0..3.min(round + 1) {
            let r = round - back;
            let ino = fs.resolve(&format!("/r{}", r % 3)).unwrap().ino;
            assert!(
                fs.read(ino, 0, 64 << 10).unwrap() == pattern(64 << 10, r as u8),
                "round {round}: r{} lost data",
                r % 3
            );
        }
    }
}

/// A read-only mount changes nothing, a trim included.
#[test]
fn trim_of_a_read_only_mount_is_refused() {
    let (dev, fs) = mounted(false);
    fs.unmount().unwrap();
    drop(fs);
    let fs = FileSystem::mount_device(dev, &MountOptions { read_only: true, ..MountOptions::default() }).unwrap();
    assert!(matches!(fs.trim(0), Err(Error::ReadOnly)));
}

/// A free run longer than one punch (4 MiB, the bound of an AG lock hold) is punched in
/// pieces but counts as one run, also for the minimum: on a fresh file system each AG's free
/// space is one long run, all of which an 8 MiB minimum takes.
#[test]
fn a_long_run_punched_in_pieces_counts_once() {
    let (_dev, fs) = mounted(false);
    let all = fs.trim(0).unwrap();
    assert!(all.bytes > all.extents * (4 << 20), "{all:?}: runs counted per piece");
    assert_eq!(fs.trim(8 << 20).unwrap(), all, "long runs cut short by the minimum");
}

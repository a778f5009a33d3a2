//! `FileSystem::freeze` (FIFREEZE) against writers that keep writing: while frozen, changes
//! wait (none fails), reads go on, and the image on disk is a clean checkpoint that does not
//! change; after the thaw the writers carry on.

mod common;

use common::{fresh, C, ROOT};
use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::fsck::{check, FsckOptions};
use ferrofs::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

const WRITERS: u64 = 3;

/// The contents of a writer's file after its `n`th replacement: its length varies too.
fn contents(writer: u64, n: u64) -> Vec<u8> {
    let len = 1000 + (n * 997 % 20_000) as usize;
    (0..len).map(|i| (i as u64 ^ n ^ (writer << 5)) as u8).collect()
}

/// Writer `writer` replaces `/w{writer}` by a new file, renamed over it, until `stop`;
/// `done` counts the replacements.
fn writer(fs: &FileSystem, writer: u64, done: &AtomicU64, stop: &AtomicBool) -> Result<()> {
    while !stop.load(Relaxed) {
        let n = done.load(Relaxed) + 1;
        let name = format!("t{writer}-{n}");
        let attr = fs.create(ROOT, name.as_bytes(), 0o644, C)?;
        fs.write(attr.ino, 0, &contents(writer, n))?;
        fs.rename(ROOT, name.as_bytes(), ROOT, format!("w{writer}").as_bytes(), 0)?;
        done.store(n, Relaxed);
    }
    Ok(())
}

fn counts(done: &[AtomicU64]) -> Vec<u64> {
    done.iter().map(|d| d.load(Relaxed)).collect()
}

/// Wait until every writer has replaced its file at least `past` times more than `from`.
fn wait_for_progress(done: &[AtomicU64], from: &[u64], past: u64) {
    for _ in 0..2000 {
        if counts(done).iter().zip(from).all(|(now, then)| *now >= then + past) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the writers made no progress: {:?} from {from:?}", counts(done));
}

#[test]
fn freeze_holds_a_clean_checkpoint_while_writers_wait() {
    let (dev, fs) = fresh(64 << 20);
    let done: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                s.spawn({
                    let (fs, done, stop) = (&fs, &done, &stop);
                    move || writer(fs, w, &done[w as usize], stop)
                })
            })
            .collect();
        wait_for_progress(&done, &[0; WRITERS as usize], 3);

        let frozen = fs.freeze().unwrap();
        // A replacement that returned just before the freeze may still be counting.
        std::thread::sleep(Duration::from_millis(50));
        let at_freeze = counts(&done);
        let image = dev.to_bytes();
        // Reads go on while frozen; changes wait.
        for (w, &n) in at_freeze.iter().enumerate() {
            assert_eq!(fs.read_file(&format!("/w{w}")).unwrap(), contents(w as u64, n), "writer {w} read while frozen");
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(counts(&done), at_freeze, "no change completes while frozen");
        assert!(dev.to_bytes() == image, "nothing writes the image while frozen");

        // The frozen image is a clean checkpoint of a state the writers went through.
        let copy: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(&image));
        let report = check(&*copy, &FsckOptions { repair: false }, &|_, _, _| {}).unwrap();
        assert!(report.is_clean(), "{report:?}");
        let view =
            FileSystem::mount_device(copy, &MountOptions { read_only: true, ..MountOptions::default() }).unwrap();
        assert_eq!(view.info().log_records_replayed, 0, "the log is empty");
        for (w, &n) in at_freeze.iter().enumerate() {
            assert_eq!(view.read_file(&format!("/w{w}")).unwrap(), contents(w as u64, n), "writer {w}'s last file");
        }

        drop(frozen);
        wait_for_progress(&done, &at_freeze, 3);
        stop.store(true, Relaxed);
        for (w, handle) in writers.into_iter().enumerate() {
            assert!(handle.join().unwrap().is_ok(), "writer {w} never failed");
        }
    });
    fs.unmount().unwrap();
}

#[test]
fn freezing_a_read_only_mount_writes_nothing() {
    let (dev, fs) = fresh(64 << 20);
    fs.write_file("/f", b"kept", C).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let image = dev.to_bytes();
    let fs =
        FileSystem::mount_device(dev.clone(), &MountOptions { read_only: true, ..MountOptions::default() }).unwrap();
    let frozen = fs.freeze().unwrap();
    assert_eq!(fs.read_file("/f").unwrap(), b"kept");
    drop(frozen);
    let frozen_again = fs.freeze().unwrap();
    drop(frozen_again);
    assert!(matches!(fs.create(ROOT, b"g", 0o644, C), Err(Error::ReadOnly)), "still refused, not waiting");
    assert!(dev.to_bytes() == image, "nothing was written");
}

//! Every device against the same contract, and each one's own behaviour.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// A unique path under the temp dir, removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("ferrofs-dev-{}-{n}-{tag}.img", std::process::id());
        Self(std::env::temp_dir().join(name))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    dev.read_at(&mut buf, off).unwrap();
    buf
}

/// Unaligned writes across page boundaries and at the very end read back; the rest is zero.
fn round_trip(dev: &dyn BlockDevice) {
    let size = dev.size();
    let data = pattern(5000, 7);
    dev.write_at(&data, 4000).unwrap();
    dev.write_at(b"tail", size - 4).unwrap();
    dev.flush().unwrap();
    assert_eq!(read(dev, 4000, data.len()), data);
    assert_eq!(read(dev, size - 4, 4), b"tail");
    assert_eq!(read(dev, 0, 4000), vec![0; 4000]);
    assert_eq!(read(dev, 9000, 10), vec![0; 10]);
}

/// I/O past the end is an InvalidInput error, never a panic; empty I/O at the end is fine.
fn out_of_range(dev: &dyn BlockDevice) {
    let size = dev.size();
    let invalid = |r: io::Result<()>| assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    invalid(dev.read_at(&mut [0; 1], size));
    invalid(dev.read_at(&mut [0; 2], size - 1));
    invalid(dev.write_at(&[1; 2], size - 1));
    invalid(dev.write_at(&[1], u64::MAX));
    invalid(dev.read_at(&mut [0; 8], u64::MAX - 3));
    dev.read_at(&mut [], size).unwrap();
    dev.write_at(&[], size).unwrap();
}

fn is_eio(r: io::Result<()>) -> bool {
    r.is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
}

#[test]
fn mem_round_trip_and_range() {
    let dev = MemDevice::new(64 * 1024 + 100);
    round_trip(&dev);
    out_of_range(&dev);
}

#[test]
fn mem_is_sparse() {
    let dev = MemDevice::new(1 << 30);
    assert_eq!(dev.allocated_pages(), 0);
    dev.write_at(&[0; 3 * PAGE_SIZE], 12345).unwrap();
    assert_eq!(dev.allocated_pages(), 0);
    dev.write_at(&[9], 1 << 29).unwrap();
    assert_eq!(dev.allocated_pages(), 1);
    assert_eq!(read(&dev, (1 << 29) - 1, 3), [0, 9, 0]);
}

#[test]
fn mem_snapshot_is_deep_and_bytes_round_trip() {
    let bytes = pattern(5000, 3);
    let dev = MemDevice::from_bytes(&bytes);
    assert_eq!(dev.size(), 5000);
    let snap = dev.snapshot();
    dev.write_at(&[0; 100], 4090).unwrap();
    assert_eq!(snap.to_bytes(), bytes);
    assert_ne!(dev.to_bytes(), bytes);
}

#[test]
fn file_round_trip_range_and_reopen() {
    let path = TempPath::new("rt");
    let dev = FileDevice::create(&path.0, 64 * 1024 + 100).unwrap();
    assert_eq!(dev.path(), path.0);
    round_trip(&dev);
    out_of_range(&dev);
    drop(dev);
    let dev = FileDevice::open(&path.0, true).unwrap();
    assert_eq!(dev.size(), 64 * 1024 + 100);
    assert_eq!(read(&dev, dev.size() - 4, 4), b"tail");
    let err = dev.write_at(b"x", 0).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
}

#[test]
fn file_create_is_sparse_and_truncates() {
    use std::os::unix::fs::MetadataExt;
    let path = TempPath::new("sparse");
    let dev = FileDevice::create(&path.0, 1 << 30).unwrap();
    dev.write_at(b"old", 0).unwrap();
    drop(dev);
    assert!(std::fs::metadata(&path.0).unwrap().blocks() < 1024);
    let dev = FileDevice::create(&path.0, 4096).unwrap();
    assert_eq!(dev.size(), 4096);
    assert_eq!(read(&dev, 0, 3), [0; 3]);
}

#[test]
fn file_preallocate_allocates_the_range_only() {
    use std::os::unix::fs::MetadataExt;
    let path = TempPath::new("prealloc");
    let dev = FileDevice::create(&path.0, 1 << 30).unwrap();
    dev.preallocate(1 << 20, 1 << 20).unwrap();
    // 512-byte units; a host file system without fallocate allocates nothing (a hint).
    let blocks = std::fs::metadata(&path.0).unwrap().blocks();
    assert!(blocks == 0 || (2048..4096).contains(&blocks), "{blocks} sectors allocated");
    assert_eq!(read(&dev, 1 << 20, 4096), [0; 4096]);
    assert!(dev.preallocate((1 << 30) - 4096, 8192).is_err(), "past the end");
}

#[test]
fn file_lock_excludes_other_opens() {
    let path = TempPath::new("lock");
    let writer = FileDevice::create(&path.0, 8192).unwrap();
    for read_only in [false, true] {
        let err = FileDevice::open(&path.0, read_only).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(err.to_string().contains("is in use by another process"), "{err}");
    }
    assert_eq!(FileDevice::create(&path.0, 1).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    assert_eq!(writer.size(), 8192, "a refused create must not truncate");
    drop(writer);
    let r1 = FileDevice::open(&path.0, true).unwrap();
    let _r2 = FileDevice::open(&path.0, true).unwrap();
    assert_eq!(FileDevice::open(&path.0, false).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    drop(r1);
}

#[test]
fn file_open_wait_retries_until_released_or_timeout() {
    let path = TempPath::new("wait");
    let holder = FileDevice::create(&path.0, 8192).unwrap();
    let start = Instant::now();
    let err = FileDevice::open_wait(&path.0, false, Duration::from_millis(60)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    assert!(start.elapsed() >= Duration::from_millis(60));
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(holder);
    });
    let dev = FileDevice::open_wait(&path.0, false, Duration::from_secs(10)).unwrap();
    release.join().unwrap();
    assert_eq!(dev.size(), 8192);
}

#[test]
fn fault_round_trip_and_range() {
    let dev = FaultDevice::new(MemDevice::new(64 * 1024 + 100));
    round_trip(&dev);
    out_of_range(&dev);
}

#[test]
fn fault_fails_exactly_the_chosen_write() {
    let dev = FaultDevice::new(MemDevice::new(1 << 20));
    dev.write_at(b"a", 0).unwrap();
    dev.fail_write_after(3, false);
    for i in 0..3 {
        dev.write_at(b"b", i).unwrap();
    }
    assert!(is_eio(dev.write_at(b"c", 100)));
    assert_eq!(read(dev.inner(), 100, 1), [0], "a failed write must not reach the device");
    dev.write_at(b"d", 200).unwrap();
    assert_eq!(dev.writes(), 6);
}

#[test]
fn fault_sticky_write_failure_lasts_until_clear() {
    let dev = FaultDevice::new(MemDevice::new(1 << 20));
    dev.fail_write_after(0, true);
    assert!(is_eio(dev.write_at(b"x", 0)));
    assert!(is_eio(dev.write_at(b"x", 0)));
    dev.clear();
    dev.write_at(b"x", 0).unwrap();
    assert_eq!(dev.writes(), 3);
}

#[test]
fn fault_flushes_and_read_blocks() {
    let dev = FaultDevice::new(MemDevice::new(1 << 20));
    dev.fail_flushes(true);
    assert!(is_eio(dev.flush()));
    dev.fail_flushes(false);
    dev.flush().unwrap();
    assert_eq!(dev.flushes(), 2);
    dev.fail_read_block(2);
    assert!(is_eio(dev.read_at(&mut [0; 1], 2 * 4096 + 17)));
    assert!(is_eio(dev.read_at(&mut [0; 2], 2 * 4096 - 1)));
    dev.read_at(&mut [0; 4096], 4096).unwrap();
    dev.read_at(&mut [0; 4096], 3 * 4096).unwrap();
    dev.clear();
    dev.read_at(&mut [0; 1], 2 * 4096).unwrap();
}

#[test]
fn crash_round_trip_and_range() {
    let dev = CrashDevice::new(MemDevice::new(64 * 1024 + 100));
    round_trip(&dev);
    let logged = dev.op_count();
    out_of_range(&dev);
    assert_eq!(dev.op_count(), logged + 1, "only the empty in-range write is logged");
}

/// w0 w1 F w3 w4 F w6 w7, with overlapping writes in each epoch. Returns the device and the
/// image right after the second flush.
fn workload() -> (CrashDevice, MemDevice) {
    let dev = CrashDevice::new(MemDevice::from_bytes(&pattern(64 * 1024, 1)));
    dev.write_at(&pattern(5000, 2), 100).unwrap();
    dev.write_at(&pattern(300, 3), 4000).unwrap();
    dev.flush().unwrap();
    dev.write_at(&pattern(8192, 4), 8192).unwrap();
    dev.write_at(&pattern(10, 5), 8200).unwrap();
    dev.flush().unwrap();
    let durable = dev.current();
    dev.write_at(&pattern(4096, 6), 0).unwrap();
    dev.write_at(&pattern(600, 7), 4000).unwrap();
    (dev, durable)
}

#[test]
fn crash_image_keep_all_is_final_and_keep_none_is_last_flush() {
    let (dev, durable) = workload();
    let (base, ops) = (dev.base(), dev.ops());
    assert_eq!(ops.len(), 8);
    let all = crash_image(&base, &ops, ops.len(), &|_| true);
    assert_eq!(all.to_bytes(), dev.current().to_bytes());
    let none = crash_image(&base, &ops, ops.len(), &|_| false);
    assert_eq!(none.to_bytes(), durable.to_bytes());
    let at_flush = crash_image(&base, &ops, 5, &|_| true);
    assert_eq!(at_flush.to_bytes(), durable.to_bytes());
    assert_eq!(crash_image(&base, &ops, 0, &|_| true).to_bytes(), base.to_bytes());
}

#[test]
fn crash_image_keeps_exactly_the_chosen_writes() {
    let (dev, durable) = workload();
    let (base, ops) = (dev.base(), dev.ops());
    let only7 = crash_image(&base, &ops, ops.len(), &|i| i == 7);
    let expected = durable.snapshot();
    expected.write_at(&pattern(600, 7), 4000).unwrap();
    assert_eq!(only7.to_bytes(), expected.to_bytes());
}

#[test]
fn torn_write_keeps_exactly_the_chosen_sectors() {
    let (dev, durable) = workload();
    let (base, ops) = (dev.base(), dev.ops());
    let Op::Write { off, data } = &ops[7] else { panic!("op 7 is a write") };
    let mask = 0b101;
    let image = crash_image_torn(&base, &ops, ops.len(), &|_| false, Some(Tear { op: 7, sectors: mask }));
    let got = image.to_bytes();
    let old = durable.to_bytes();
    for (i, &byte) in data.iter().enumerate() {
        let pos = *off as usize + i;
        let sector = (pos as u64 / SECTOR_SIZE - off / SECTOR_SIZE) % 64;
        let want = if mask >> sector & 1 == 1 { byte } else { old[pos] };
        assert_eq!(got[pos], want, "byte {pos}");
    }
    let outside = |v: &[u8]| [v[..*off as usize].to_vec(), v[*off as usize + data.len()..].to_vec()];
    assert_eq!(outside(&got), outside(&old));
}

#[test]
#[should_panic(expected = "is not a write of epoch")]
fn tear_outside_the_epoch_is_rejected() {
    let (dev, _) = workload();
    let ops = dev.ops();
    crash_image_torn(&dev.base(), &ops, ops.len(), &|_| true, Some(Tear { op: 3, sectors: 1 }));
}

#[test]
fn crash_points_and_keep_sets() {
    let (dev, _) = workload();
    let ops = dev.ops();
    assert_eq!(crash_points(&ops), [2, 5, 8]);
    assert_eq!(unflushed_epoch(&ops, 8), 6..8);
    assert_eq!(unflushed_epoch(&ops, 6), 6..6);
    let sets = keep_sets(&ops, 5, 42, 20);
    assert_eq!(sets, keep_sets(&ops, 5, 42, 20), "deterministic per seed");
    for want in [BTreeSet::from([3, 4]), BTreeSet::new(), BTreeSet::from([3]), BTreeSet::from([4])] {
        assert!(sets.contains(&want), "{want:?} missing");
    }
    assert_eq!(sets.len(), 4, "only four subsets of two writes exist");
    assert!(sets.iter().flatten().all(|i| (3..5).contains(i)));
    let empty = keep_sets(&ops, 6, 1, 5);
    assert_eq!(empty, [BTreeSet::new()]);
}

#[test]
fn keep_sets_vary_density() {
    let ops = vec![Op::Write { off: 0, data: vec![1] }; 64];
    let sets = keep_sets(&ops, 64, 7, 200);
    let sizes: BTreeSet<usize> = sets[2 + 64..].iter().map(BTreeSet::len).collect();
    assert!(sizes.len() > 20, "random subsets should span many sizes: {sizes:?}");
}

#[test]
fn cut_after_kills_the_device() {
    let dev = CrashDevice::new(MemDevice::new(1 << 20));
    dev.write_at(b"a", 0).unwrap();
    dev.cut_after(3);
    dev.flush().unwrap();
    dev.write_at(b"b", 1).unwrap();
    assert!(is_eio(dev.write_at(b"c", 2)));
    assert!(is_eio(dev.flush()));
    assert!(is_eio(dev.read_at(&mut [0; 1], 0)));
    assert_eq!(dev.op_count(), 3);
    assert_eq!(dev.current().to_bytes()[..3], *b"ab\0");
}

#[test]
fn concurrent_writes_log_in_apply_order() {
    let dev = Arc::new(CrashDevice::new(MemDevice::new(64 * 1024)));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    dev.write_at(&pattern(700, t), (i * 97 + u64::from(t) * 13) % 60_000).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let ops = dev.ops();
    let replay = crash_image(&dev.base(), &ops, ops.len(), &|_| true);
    assert_eq!(replay.to_bytes(), dev.current().to_bytes());
}

#[test]
fn file_punch_frees_the_range_only() {
    use std::os::unix::fs::MetadataExt;
    let path = TempPath::new("punch");
    let dev = FileDevice::create(&path.0, 8 << 20).unwrap();
    dev.write_at(&pattern(4 << 20, 8), 0).unwrap();
    let sectors = || std::fs::metadata(&path.0).unwrap().blocks();
    let before = sectors();
    assert!(before >= 8192, "{before} sectors after writing 4 MiB");
    assert!(dev.punch(1 << 20, 2 << 20).unwrap(), "tmp file systems punch holes");
    // 512-byte units: 2 MiB is 4096 of them.
    assert!(before - sectors() >= 4096, "{before} sectors before, {} after", sectors());
    assert_eq!(read(&dev, 1 << 20, 4096), [0; 4096]);
    assert_eq!(read(&dev, 0, 4096), pattern(4 << 20, 8)[..4096], "data before the hole kept");
    assert_eq!(read(&dev, 3 << 20, 4096), pattern(4 << 20, 8)[3 << 20..(3 << 20) + 4096], "and after it");
    assert_eq!(dev.size(), 8 << 20, "the image keeps its size");
    assert!(dev.punch((8 << 20) - 4096, 8192).is_err(), "past the end");
    drop(dev);
    let read_only = FileDevice::open(&path.0, true).unwrap();
    assert_eq!(read_only.punch(0, 4096).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
}

#[test]
fn mem_punch_zeroes_and_frees_whole_pages() {
    let dev = MemDevice::new(64 * 1024);
    dev.write_at(&pattern(16384, 9), 0).unwrap();
    assert_eq!(dev.allocated_pages(), 4);
    assert!(dev.punch(100, 8192).unwrap());
    assert_eq!(dev.allocated_pages(), 3, "page 1 lies whole in the hole, pages 0 and 2 in part");
    assert_eq!(read(&dev, 100, 8192), vec![0; 8192]);
    assert_eq!(read(&dev, 0, 100), pattern(16384, 9)[..100]);
    assert_eq!(read(&dev, 8292, 100), pattern(16384, 9)[8292..8392]);
}

#[test]
fn crash_image_applies_a_punch_only_where_it_persisted() {
    let (dev, durable) = workload();
    dev.punch(8192, 4096).unwrap();
    let (base, ops) = (dev.base(), dev.ops());
    let punch = ops.len() - 1;
    assert_eq!(ops[punch], Op::Punch { off: 8192, len: 4096 });
    let kept = crash_image(&base, &ops, ops.len(), &|i| i == punch);
    let expected = durable.snapshot();
    expected.write_at(&[0; 4096], 8192).unwrap();
    assert_eq!(kept.to_bytes(), expected.to_bytes());
    let lost = crash_image(&base, &ops, ops.len(), &|_| false);
    assert_eq!(lost.to_bytes(), durable.to_bytes());
    assert_eq!(crash_image(&base, &ops, ops.len(), &|_| true).to_bytes(), dev.current().to_bytes());
}

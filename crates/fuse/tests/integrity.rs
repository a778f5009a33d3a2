//! Long random data-integrity run through a FUSE mount: several files get overlapping writes
//! at random offsets (often past EOF, leaving holes), truncates down and up, and reads that
//! are checked byte for byte against an in-memory model. Every so often the file system is
//! unmounted and mounted again and every file is compared in full — sometimes after fsync of
//! everything, sometimes with nothing synced (the unmount's checkpoint alone must carry the
//! data), sometimes after syncing only some files.
//!
//! The default run is bounded to well under a minute; FERROFS_INTEGRITY_OPS sets the number
//! of operations (and FERROFS_INTEGRITY_SEED the seed) for longer hunts.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::time::Instant;

const FILES: usize = 6;
const DEFAULT_OPS: usize = 20_000;
const REMOUNT_EVERY: usize = 1500;
/// Files stay below this, so the run fits the image however the writes fall.
const MAX_SIZE: u64 = 6 << 20;

fn open_all(fx: &Fixture) -> Vec<File> {
    (0..FILES)
        .map(|i| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(fx.path(&format!("f{i}")))
                .unwrap()
        })
        .collect()
}

/// Compare a whole file with its model, reporting the first differing byte.
fn verify(f: &File, model: &[u8], what: &str) {
    assert_eq!(f.metadata().unwrap().len(), model.len() as u64, "{what}: size");
    let mut buf = vec![0u8; model.len()];
    f.read_exact_at(&mut buf, 0).unwrap();
    if buf != model {
        let at = buf.iter().zip(model).position(|(a, b)| a != b).unwrap();
        panic!("{what}: byte {at} is {:#04x}, expected {:#04x} (size {})", buf[at], model[at], model.len());
    }
    // Reading at EOF returns nothing.
    assert_eq!(f.read_at(&mut [0u8; 16], model.len() as u64).unwrap(), 0, "{what}: read at EOF");
}

#[test]
fn random_writes_truncates_and_remounts() {
    const NAME: &str = "integrity";
    let ops: usize = std::env::var("FERROFS_INTEGRITY_OPS").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_OPS);
    let seed: u64 = std::env::var("FERROFS_INTEGRITY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x1e57_da7a);
    let Some(mut fx) = Fixture::new(NAME, |_| {}) else { return };
    eprintln!("{NAME}: seed {seed}, {ops} operations");
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut models: Vec<Vec<u8>> = vec![Vec::new(); FILES];
    let mut files = open_all(&fx);
    let (mut writes, mut truncs, mut reads, mut remounts) = (0, 0, 0, 0);
    for step in 1..=ops {
        let i = rng.gen_range(0..FILES);
        let (f, m) = (&files[i], &mut models[i]);
        let len = m.len() as u64;
        match rng.gen_range(0..10) {
            // Writes: overlapping the data, at its end, or beyond it (a hole in between).
            0..=4 => {
                let off = match rng.gen_range(0..4) {
                    0 => rng.gen_range(0..=len),
                    1 => len,
                    2 => len + rng.gen_range(1..(256 << 10)),
                    _ => rng.gen_range(0..MAX_SIZE / 2),
                };
                let n = if rng.gen_bool(0.1) { rng.gen_range(64 << 10..1 << 20) } else { rng.gen_range(1..9000) };
                if off + n as u64 > MAX_SIZE {
                    continue;
                }
                // Recognisable bytes: the step number mixed with the position.
                let tag = step as u32;
                let data: Vec<u8> = (0..n as u32)
                    .map(|k| (tag.wrapping_mul(31).wrapping_add(k.wrapping_mul(7)) % 251) as u8 + 1)
                    .collect();
                f.write_all_at(&data, off).unwrap();
                let end = off as usize + n;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
                writes += 1;
            }
            // Truncates, down (sometimes into the middle of a block) and up.
            5..=6 => {
                let new = match rng.gen_range(0..3) {
                    0 => rng.gen_range(0..=len),
                    1 => len.saturating_sub(rng.gen_range(0..5000)),
                    _ => (len + rng.gen_range(0..(512 << 10))).min(MAX_SIZE),
                };
                f.set_len(new).unwrap();
                m.resize(new as usize, 0);
                truncs += 1;
            }
            // Reads of random ranges, including across EOF.
            _ => {
                let off = rng.gen_range(0..=len + 5000);
                let n = rng.gen_range(1..(200 << 10));
                let mut buf = vec![0xeeu8; n];
                let got = f.read_at(&mut buf, off).unwrap();
                let want = &m[(off as usize).min(m.len())..(off as usize + n).min(m.len())];
                assert_eq!(got, want.len(), "step {step}: read of {n} at {off} of f{i} (size {len})");
                if &buf[..got] != want {
                    let at = buf.iter().zip(want).position(|(a, b)| a != b).unwrap();
                    panic!(
                        "step {step}: f{i} byte {} is {:#04x}, expected {:#04x}",
                        off as usize + at,
                        buf[at],
                        want[at]
                    );
                }
                reads += 1;
            }
        }
        if step % REMOUNT_EVERY == 0 {
            match (step / REMOUNT_EVERY) % 3 {
                // Everything fsync'ed before the unmount.
                0 => files.iter().for_each(|f| f.sync_all().unwrap()),
                // Nothing synced: the unmount's own checkpoint must carry every change.
                1 => {}
                // Only some files synced (data only), the rest not.
                _ => files.iter().step_by(2).for_each(|f| f.sync_data().unwrap()),
            }
            drop(files);
            fx.remount();
            remounts += 1;
            files = open_all(&fx);
            for (k, (f, m)) in files.iter().zip(&models).enumerate() {
                verify(f, m, &format!("after remount {remounts} (step {step}), f{k}"));
            }
        }
    }
    for (k, (f, m)) in files.iter().zip(&models).enumerate() {
        verify(f, m, &format!("at the end, f{k}"));
    }
    drop(files);
    fx.unmount();
    assert_eq!(replayed_records(&fx.image), 0, "unmount must leave a clean log");
    assert_fsck_clean(&fx.image);
    fx.mount().unwrap();
    let files = open_all(&fx);
    for (k, (f, m)) in files.iter().zip(&models).enumerate() {
        verify(f, m, &format!("after the final remount, f{k}"));
    }
    assert!(remounts >= 3 || ops < 3 * REMOUNT_EVERY, "the run must cross remounts");
    eprintln!(
        "{NAME}: {writes} writes, {truncs} truncates, {reads} verified reads, {remounts} remounts in {:?}",
        started.elapsed()
    );
}

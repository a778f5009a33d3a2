//! copy_file_range against a model: random sparse files, random ranges (across holes and
//! the source's end, past the destination's end, within one file), every result compared
//! byte for byte, and holes kept where the destination had no blocks.

use ferrofs::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{fresh, remount, C, ROOT};

/// The model's copy: what copy_file_range must do to `out` (taken from `src` as it was).
fn model_copy(src: &[u8], off_in: usize, out: &mut Vec<u8>, off_out: usize, len: usize) -> usize {
    let count = len.min(src.len().saturating_sub(off_in));
    if count > 0 {
        let piece = src[off_in..off_in + count].to_vec();
        if out.len() < off_out + count {
            out.resize(off_out + count, 0);
        }
        out[off_out..off_out + count].copy_from_slice(&piece);
    }
    count
}

fn contents(fs: &FileSystem, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as usize).unwrap()
}

/// A file of about `max` bytes made of written runs, holes and a punched hole.
fn sparse_file(fs: &FileSystem, rng: &mut StdRng, name: &[u8], max: usize) -> (u64, Vec<u8>) {
    let ino = fs.create(ROOT, name, 0o644, C).unwrap().ino;
    let mut model = Vec::new();
    for _ in 0..rng.gen_range(1..6) {
        let off = rng.gen_range(0..max);
        let data: Vec<u8> = (0..rng.gen_range(1..max / 4)).map(|_| rng.gen_range(1..=255)).collect();
        fs.write(ino, off as u64, &data).unwrap();
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(&data);
    }
    let (off, len) = (rng.gen_range(0..model.len()), rng.gen_range(1..max / 3));
    fs.fallocate(ino, off as u64, len as u64, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).unwrap();
    let end = (off + len).min(model.len());
    model[off..end].fill(0);
    (ino, model)
}

#[test]
fn copy_file_range_matches_the_model() {
    let (dev, fs) = fresh(256 << 20);
    let mut rng = StdRng::seed_from_u64(0xc0b1);
    const MAX: usize = 600_000;
    let mut files: Vec<(u64, Vec<u8>)> =
        (0..4).map(|i| sparse_file(&fs, &mut rng, format!("f{i}").as_bytes(), MAX)).collect();
    for round in 0..300 {
        let (a, b) = (rng.gen_range(0..files.len()), rng.gen_range(0..files.len()));
        let size_in = files[a].1.len();
        let off_in = rng.gen_range(0..size_in + 10_000);
        let off_out = rng.gen_range(0..files[b].1.len() + 200_000);
        let len = rng.gen_range(0..MAX / 2);
        let count = len.min(size_in.saturating_sub(off_in));
        let overlap = a == b && count > 0 && off_out < off_in + count && off_in < off_out + count;
        let got = fs.copy_file_range(files[a].0, off_in as u64, files[b].0, off_out as u64, len as u64);
        if overlap {
            assert!(matches!(got, Err(Error::Invalid(_))), "round {round}: overlapping ranges in one file: {got:?}");
            continue;
        }
        let src = files[a].1.clone();
        let want = model_copy(&src, off_in, &mut files[b].1, off_out, len);
        assert_eq!(got.unwrap(), want as u64, "round {round}: bytes copied");
        assert!(
            contents(&fs, files[b].0) == files[b].1,
            "round {round}: copy {a}@{off_in} -> {b}@{off_out} len {len} differs from the model"
        );
    }
    let fs = remount(&dev, fs);
    for (ino, model) in &files {
        assert!(contents(&fs, *ino) == *model, "inode {ino} differs from the model after a remount");
    }
}

/// A hole copied past the destination's end stays a hole (no blocks allocated); one copied
/// over the destination's data makes it read as zeros; the source's end ends the copy.
#[test]
fn copy_file_range_keeps_holes_and_stops_at_the_end() {
    let (_dev, fs) = fresh(64 << 20);
    let src = fs.create(ROOT, b"src", 0o644, C).unwrap().ino;
    fs.write(src, 0, &[1u8; 4096]).unwrap();
    fs.write(src, 40 << 20, &[2u8; 4096]).unwrap();
    let dst = fs.create(ROOT, b"dst", 0o644, C).unwrap().ino;
    assert_eq!(fs.copy_file_range(src, 0, dst, 0, 1 << 40).unwrap(), (40 << 20) + 4096);
    let a = fs.getattr(dst).unwrap();
    assert_eq!((a.size, a.blocks), ((40 << 20) + 4096, 2 * 8), "two data blocks, the 40 MiB hole stays a hole");
    let full = fs.create(ROOT, b"full", 0o644, C).unwrap().ino;
    fs.write(full, 0, &vec![9u8; 3 << 20]).unwrap();
    assert_eq!(fs.copy_file_range(src, 4096, full, 4096, 1 << 20).unwrap(), 1 << 20);
    let back = fs.read(full, 0, 3 << 20).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == 9)
            && back[4096..4096 + (1 << 20)].iter().all(|&b| b == 0)
            && back[4096 + (1 << 20)..].iter().all(|&b| b == 9)
    );
    assert_eq!(fs.copy_file_range(src, (40 << 20) + 4096, dst, 0, 100).unwrap(), 0, "at the source's end");
    assert!(matches!(fs.copy_file_range(src, 0, ROOT, 0, 10), Err(Error::IsDir)));
}

//! Block reads of a published image's device from a warm chunk cache, by 1 and 4 threads at
//! once: the hit path every read of a mounted image takes, and whether its locks
//! (`remote-resident`, `remote-inflight`) are contended. Each thread reads 4 KiB blocks at
//! its own pseudo-random offsets over the whole image (as readers of different files do);
//! after each case the lock classes' contentions are printed beside criterion's times.
//!
//!   cargo bench -p ferrofs-remote --bench warm_reads

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrofs::dev::BlockDevice;
use ferrofs_remote::cache::ChunkCache;
use ferrofs_remote::device::{ChunkDevice, ChunkSource, DeviceOptions};
use ferrofs_remote::store::chunk_hash;
use ferrofs_remote::{ChunkRef, Manifest};
use futures::future::{BoxFuture, FutureExt};
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHUNK: usize = 1 << 20;
/// 64 MiB: a quarter of the device's resident set, so every chunk stays at hand once read.
const CHUNKS: usize = 64;
const BLOCK: usize = 4096;
/// Reads per thread in one iteration.
const READS: usize = 2000;

/// The image's chunks in memory; a warm cache never asks for them.
struct MemorySource(HashMap<[u8; 32], Bytes>);

impl ChunkSource for MemorySource {
    fn fetch(&self, hash: [u8; 32]) -> BoxFuture<'static, io::Result<Bytes>> {
        let found = self.0.get(&hash).cloned();
        async move { found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such chunk")) }.boxed()
    }
}

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A device over an image of distinct chunks, every chunk already in `cache_dir` and read once.
fn warm_device(cache_dir: &std::path::Path) -> ChunkDevice {
    let mut next = xorshift(44);
    let mut source = HashMap::new();
    let refs = (0..CHUNKS)
        .map(|_| {
            let bytes: Vec<u8> = (0..CHUNK / 8).flat_map(|_| next().to_le_bytes()).collect();
            let hash = chunk_hash(&bytes);
            source.insert(hash, Bytes::from(bytes));
            ChunkRef::Stored(hash)
        })
        .collect();
    let manifest = Manifest {
        generation: 1,
        parent: 0,
        image_size: (CHUNKS * CHUNK) as u64,
        chunk_size: CHUNK as u32,
        block_size: BLOCK as u32,
        uuid: [0; 16],
        chunks: refs,
        metadata: Vec::new(),
    };
    let source = Arc::new(MemorySource(source));
    // Fill the cache directory, then open the device a reader would: its chunks come from there.
    let fill = ChunkCache::open(cache_dir, 1 << 30).unwrap();
    let dev = ChunkDevice::open(&manifest, source.clone(), Some(fill), DeviceOptions::default()).unwrap();
    read_all(&dev);
    drop(dev);
    let cache = ChunkCache::open(cache_dir, 1 << 30).unwrap();
    let dev = ChunkDevice::open(&manifest, source, Some(cache), DeviceOptions::default()).unwrap();
    read_all(&dev);
    assert_eq!(dev.stats().misses, 0, "the cache was warm");
    dev
}

fn read_all(dev: &ChunkDevice) {
    let mut buf = vec![0u8; CHUNK];
    for i in 0..CHUNKS {
        dev.read_at(&mut buf, (i * CHUNK) as u64).unwrap();
    }
}

/// `threads` threads each reading `READS` blocks; the wall time of the slowest.
fn read_blocks(dev: &ChunkDevice, threads: usize, seed: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut next = xorshift(seed * 64 + t as u64 + 1);
                let mut buf = [0u8; BLOCK];
                for _ in 0..READS {
                    let block = next() % (CHUNKS * CHUNK / BLOCK) as u64;
                    dev.read_at(&mut buf, block * BLOCK as u64).unwrap();
                }
            });
        }
    });
    start.elapsed()
}

fn print_locks(case: &str) {
    for c in ferrofs_lockstat::snapshot().iter().filter(|c| c.name.starts_with("remote-")) {
        let s = c.total.combined();
        println!(
            "{case}: {} acquisitions {} contentions {} ({:.3}%) wait {} us (max {} us)",
            c.name,
            s.acquisitions,
            s.contentions,
            100.0 * s.contentions as f64 / s.acquisitions.max(1) as f64,
            s.wait_total_ns / 1000,
            s.wait_max_ns / 1000
        );
    }
}

fn warm_reads(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let dev = warm_device(dir.path());
    let mut group = c.benchmark_group("warm_reads");
    for threads in [1, 4] {
        group.throughput(Throughput::Elements((threads * READS) as u64));
        ferrofs_lockstat::reset();
        let mut seed = 0;
        group.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        seed += 1;
                        read_blocks(&dev, threads, seed)
                    })
                    .sum()
            })
        });
        print_locks(&format!("{threads} threads"));
    }
    group.finish();
}

criterion_group!(benches, warm_reads);
criterion_main!(benches);

use super::*;
use crate::store::chunk_hash;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

const CHUNK: usize = 64 * 1024;

/// Chunks in memory, counting fetches; can be slowed, or made to never answer.
#[derive(Default)]
struct MemorySource {
    chunks: HashMap<[u8; 32], Bytes>,
    fetches: AtomicU64,
    delay: Duration,
    silent: AtomicBool,
}

impl ChunkSource for MemorySource {
    fn fetch(&self, hash: [u8; 32]) -> BoxFuture<'static, io::Result<Bytes>> {
        self.fetches.fetch_add(1, Relaxed);
        let found = self.chunks.get(&hash).cloned();
        let (delay, silent) = (self.delay, self.silent.load(Relaxed));
        async move {
            tokio::time::sleep(delay).await;
            if silent {
                futures::future::pending::<()>().await;
            }
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such chunk"))
        }
        .boxed()
    }
}

/// An image of `chunks` chunks, every third one all zeros, and its manifest and source.
fn image(chunks: usize, delay: Duration) -> (Vec<u8>, Manifest, MemorySource) {
    let mut bytes = vec![0u8; chunks * CHUNK - 1000];
    for (i, b) in bytes.iter_mut().enumerate() {
        if (i / CHUNK) % 3 != 1 {
            *b = (i * 7 + i / 4093) as u8;
        }
    }
    let mut source = MemorySource { delay, ..MemorySource::default() };
    let refs = bytes
        .chunks(CHUNK)
        .map(|c| {
            if c.iter().all(|&b| b == 0) {
                return ChunkRef::Zero;
            }
            let hash = chunk_hash(c);
            source.chunks.insert(hash, Bytes::copy_from_slice(c));
            ChunkRef::Stored(hash)
        })
        .collect();
    let manifest = Manifest {
        generation: 1,
        parent: 0,
        image_size: bytes.len() as u64,
        chunk_size: CHUNK as u32,
        block_size: 4096,
        uuid: [0; 16],
        chunks: refs,
        metadata: vec![0, 2],
    };
    (bytes, manifest, source)
}

fn quick() -> DeviceOptions {
    DeviceOptions {
        attempts: 2,
        attempt_timeout: Duration::from_millis(200),
        retry_delay: Duration::from_millis(10),
        ..DeviceOptions::default()
    }
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn reads_return_the_image_across_chunks_and_zero_chunks() {
    let (bytes, manifest, source) = image(7, Duration::ZERO);
    let dev = ChunkDevice::open(&manifest, Arc::new(source), None, quick()).unwrap();
    assert_eq!(dev.size(), bytes.len() as u64);
    for (off, len) in [(0, 4096), (CHUNK - 100, 300), (CHUNK / 2, 3 * CHUNK), (0, bytes.len()), (bytes.len() - 10, 10)]
    {
        let mut buf = vec![0xAA; len];
        dev.read_at(&mut buf, off as u64).unwrap();
        assert!(buf == bytes[off..off + len], "read of {len} at {off}");
    }
    let mut buf = [0u8; 2];
    assert!(dev.read_at(&mut buf, bytes.len() as u64 - 1).is_err(), "past the end");
    assert_eq!(dev.write_at(&[1], 0).unwrap_err().raw_os_error(), Some(libc::EROFS));
    let stats = dev.stats();
    assert_eq!(stats.misses, 5, "each stored chunk fetched once: {stats:?}");
    assert!(stats.hits > 0);
}

#[test]
fn threads_missing_on_one_chunk_share_one_fetch() {
    let (bytes, mut manifest, source) = image(4, Duration::from_millis(50));
    manifest.metadata.clear();
    let source = Arc::new(source);
    let dev = Arc::new(ChunkDevice::open(&manifest, source.clone(), None, quick()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 512];
                dev.read_at(&mut buf, 2 * CHUNK as u64 + t * 512).unwrap();
                buf
            })
        })
        .collect();
    for (t, th) in threads.into_iter().enumerate() {
        let at = 2 * CHUNK + t * 512;
        assert!(th.join().unwrap() == bytes[at..at + 512]);
    }
    assert_eq!(source.fetches.load(Relaxed), 1);
}

#[test]
fn a_read_spanning_chunks_fetches_them_concurrently() {
    let delay = Duration::from_millis(300);
    let (bytes, mut manifest, source) = image(6, delay);
    manifest.metadata.clear();
    let opts = DeviceOptions { attempt_timeout: Duration::from_secs(5), ..quick() };
    let dev = ChunkDevice::open(&manifest, Arc::new(source), None, opts).unwrap();
    let mut buf = vec![0u8; bytes.len()];
    let start = Instant::now();
    dev.read_at(&mut buf, 0).unwrap();
    // Four stored chunks one after another would take 1.2 s.
    assert!(start.elapsed() < delay * 3, "{:?}", start.elapsed());
    assert!(buf == bytes);
}

#[test]
fn metadata_chunks_are_prefetched_at_open() {
    let (_, manifest, source) = image(6, Duration::ZERO);
    let source = Arc::new(source);
    let dev = ChunkDevice::open(&manifest, source.clone(), None, quick()).unwrap();
    wait_for("the prefetch", || dev.stats().misses == 2);
    let mut buf = vec![0u8; 100];
    dev.read_at(&mut buf, 0).unwrap();
    dev.read_at(&mut buf, 2 * CHUNK as u64).unwrap();
    assert_eq!(source.fetches.load(Relaxed), 2, "the reads found the prefetched chunks");
}

#[test]
fn a_silent_store_fails_the_read_with_eio_in_bounded_time() {
    let (bytes, mut manifest, source) = image(3, Duration::ZERO);
    manifest.metadata.clear();
    source.silent.store(true, Relaxed);
    let source = Arc::new(source);
    let dev = ChunkDevice::open(&manifest, source.clone(), None, quick()).unwrap();
    let mut buf = vec![0u8; 100];
    let start = Instant::now();
    let err = dev.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert_eq!(source.fetches.load(Relaxed), 2, "each try asked the store");
    // The store answers again: the next read tries again and succeeds.
    source.silent.store(false, Relaxed);
    dev.read_at(&mut buf, 0).unwrap();
    assert!(buf == bytes[..100]);
}

#[test]
fn a_second_device_reads_from_the_shared_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, manifest, source) = image(5, Duration::ZERO);
    let source = Arc::new(source);
    let mut buf = vec![0u8; bytes.len()];
    {
        let cache = ChunkCache::open(dir.path(), 1 << 30).unwrap();
        let dev = ChunkDevice::open(&manifest, source.clone(), Some(cache), quick()).unwrap();
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(dev.cache_bytes(), Some(3 * CHUNK as u64), "chunks 1 and 4 are zeros, never stored");
    }
    let fetched = source.fetches.load(Relaxed);
    assert_eq!(fetched, 3);
    let cache = ChunkCache::open(dir.path(), 1 << 30).unwrap();
    let dev = ChunkDevice::open(&manifest, source.clone(), Some(cache), quick()).unwrap();
    buf.fill(0);
    dev.read_at(&mut buf, 0).unwrap();
    assert!(buf == bytes);
    assert_eq!(source.fetches.load(Relaxed), fetched, "nothing fetched again");
    assert_eq!(dev.stats().misses, 0);
}

#[test]
fn a_manifest_that_cannot_hold_its_image_is_refused() {
    let (_, mut manifest, source) = image(3, Duration::ZERO);
    manifest.chunks.pop();
    let err = ChunkDevice::open(&manifest, Arc::new(source), None, quick()).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
}

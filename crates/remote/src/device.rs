//! A read-only [`BlockDevice`] over one published generation: the image is the manifest's
//! chunk list, each chunk fetched from the store the first time it is read, then served from
//! the local chunk cache ([`ChunkCache`]) or, while it is in use, from an open file or buffer
//! kept in memory. DESIGN, "Mounting a published image", says why it is shaped so.
//!
//! - A read spanning several chunks fetches the missing ones concurrently, and many threads
//!   missing on one chunk share one fetch (`inflight`).
//! - The chunks at hand and the fetches under way are split into shards by chunk index, each
//!   under its own named lock, so readers of different chunks do not wait for each other.
//! - The chunks the manifest lists as metadata are fetched first, in the background, as soon
//!   as the device is opened, so the engine's first lookups find them local.
//! - A fetch is tried `attempts` times, each bounded by `attempt_timeout`: a store that does
//!   not answer fails that read with EIO, never hangs it, and a later read tries again.
//! - Writes fail with EROFS: nothing under a pinned generation ever changes.

use crate::cache::ChunkCache;
use crate::manifest::{ChunkRef, Manifest};
use crate::store::{check_chunk, hex, Remote};
use bytes::Bytes;
use ferrofs::dev::BlockDevice;
use ferrofs_lockstat::{LockClass, Mutex};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::StreamExt;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// A shard's fetches under way (`Shard::inflight`): taken on a miss, and before `RESIDENT`
/// when both are held. Ranked above every engine lock, since the engine reads the device
/// while it holds its own.
static INFLIGHT: LockClass = LockClass::ranked("remote-inflight", 100);
/// A shard's chunks at hand (`Shard::resident`): taken on every read of a stored chunk.
static RESIDENT: LockClass = LockClass::ranked("remote-resident", 101);

/// Shards of the chunks at hand and of the fetches under way. With one lock, 4 threads
/// reading a warm cache waited on 1% of their acquisitions (docs/MEASURED.md, "Published
/// images"); chunk `i` is in shard `i % SHARDS`, so neighbouring chunks are in different ones.
const SHARDS: usize = 16;

/// Where chunks come from: the object store, or a test's stand-in.
pub trait ChunkSource: Send + Sync + 'static {
    /// The bytes of the chunk whose SHA-256 is `hash`, verified against it.
    fn fetch(&self, hash: [u8; 32]) -> BoxFuture<'static, io::Result<Bytes>>;
}

/// Chunks from a published image's store.
pub struct StoreChunks(pub Remote);

impl ChunkSource for StoreChunks {
    fn fetch(&self, hash: [u8; 32]) -> BoxFuture<'static, io::Result<Bytes>> {
        use object_store::ObjectStoreExt;
        let store = self.0.object_store().clone();
        let key = self.0.chunk_key(&hash);
        async move {
            let bytes = store.get(&key).await.map_err(io::Error::other)?.bytes().await.map_err(io::Error::other)?;
            check_chunk(&hash, &bytes).map_err(io::Error::other)?;
            Ok(bytes)
        }
        .boxed()
    }
}

/// How hard the device tries, and how much it keeps at hand.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceOptions {
    /// Tries of one chunk fetch before its reads fail with EIO.
    pub attempts: u32,
    /// Bound on one try; a try that takes longer is abandoned.
    pub attempt_timeout: Duration,
    /// Wait before the second try, doubled before each further one.
    pub retry_delay: Duration,
    /// Chunk fetches in flight at most.
    pub fetches_max: usize,
    /// Metadata chunks prefetched at once.
    pub prefetch_max: usize,
    /// Chunks kept open (a cache file, or the fetched bytes when there is no cache to hold
    /// them) for the reads that follow.
    pub resident_max: usize,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            attempts: 4,
            attempt_timeout: Duration::from_secs(10),
            retry_delay: Duration::from_millis(200),
            fetches_max: 32,
            prefetch_max: 8,
            resident_max: 256,
        }
    }
}

/// Counters of a [`ChunkDevice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Chunk reads served locally (memory or the cache directory).
    pub hits: u64,
    /// Chunk fetches from the store (prefetches included).
    pub misses: u64,
    /// Bytes fetched from the store.
    pub bytes_fetched: u64,
    /// Bytes the engine read from the device.
    pub bytes_read: u64,
}

/// A chunk at hand: its cache file, or its bytes when the cache could not take it.
enum Resident {
    File(File),
    Memory(Bytes),
}

impl Resident {
    fn read(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match self {
            Resident::File(f) => f.read_exact_at(buf, off),
            Resident::Memory(b) => {
                let src = b.get(off as usize..off as usize + buf.len()).ok_or_else(short_chunk)?;
                buf.copy_from_slice(src);
                Ok(())
            }
        }
    }
}

fn short_chunk() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "chunk shorter than the manifest says")
}

type Fetch = Shared<BoxFuture<'static, Result<Arc<Resident>, Arc<String>>>>;

/// The chunks kept at hand, each with the tick of its last use; the oldest goes when full.
#[derive(Default)]
struct ResidentSet {
    chunks: HashMap<u32, (Arc<Resident>, u64)>,
    tick: u64,
}

impl ResidentSet {
    fn get(&mut self, index: u32) -> Option<Arc<Resident>> {
        self.tick += 1;
        let tick = self.tick;
        self.chunks.get_mut(&index).map(|(r, used)| {
            *used = tick;
            r.clone()
        })
    }

    fn insert(&mut self, index: u32, chunk: Arc<Resident>, max: usize) {
        if self.chunks.len() >= max {
            let oldest = self.chunks.iter().min_by_key(|(_, (_, used))| *used).map(|(i, _)| *i);
            oldest.map(|i| self.chunks.remove(&i));
        }
        self.tick += 1;
        self.chunks.insert(index, (chunk, self.tick));
        debug_assert!(self.chunks.len() <= max.max(1));
    }
}

/// The chunks of one shard, at hand or being fetched. Aligned to a cache line pair so that
/// two shards' locks never share one.
#[repr(align(128))]
struct Shard {
    resident: Mutex<ResidentSet>,
    /// Fetches under way, one per chunk; its task removes it (under this lock) once the chunk
    /// is resident or has failed.
    inflight: Mutex<HashMap<u32, Fetch>>,
}

struct Chunks {
    source: Arc<dyn ChunkSource>,
    cache: Option<ChunkCache>,
    refs: Vec<ChunkRef>,
    chunk_size: u64,
    opts: DeviceOptions,
    shards: Box<[Shard]>,
    /// Chunks kept at hand per shard: `resident_max` spread over the shards.
    resident_per_shard: usize,
    fetch_permits: tokio::sync::Semaphore,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_fetched: AtomicU64,
    bytes_read: AtomicU64,
}

impl Chunks {
    fn shard(&self, index: u32) -> &Shard {
        &self.shards[index as usize % SHARDS]
    }

    /// Chunk `index` if it is at hand, else the fetch that brings it (started if need be).
    fn get(self: &Arc<Self>, runtime: &tokio::runtime::Handle, index: u32) -> Result<Arc<Resident>, Fetch> {
        let shard = self.shard(index);
        if let Some(r) = shard.resident.lock().get(index) {
            self.hits.fetch_add(1, Relaxed);
            return Ok(r);
        }
        let mut inflight = shard.inflight.lock();
        // Again under the lock: a fetch that ended since made it resident before it left.
        if let Some(r) = shard.resident.lock().get(index) {
            self.hits.fetch_add(1, Relaxed);
            return Ok(r);
        }
        let fetch = inflight.entry(index).or_insert_with(|| {
            let chunks = self.clone();
            let task = runtime.spawn(async move { chunks.load(index).await });
            async move { task.await.unwrap_or_else(|e| Err(Arc::new(format!("fetch task failed: {e}")))) }
                .boxed()
                .shared()
        });
        Err(fetch.clone())
    }

    /// The task of one chunk's fetch: from the cache directory, else from the store (then
    /// into the cache); resident afterwards.
    async fn load(self: Arc<Self>, index: u32) -> Result<Arc<Resident>, Arc<String>> {
        let ChunkRef::Stored(hash) = self.refs[index as usize] else { unreachable!("zero chunks are never fetched") };
        let res = self.load_hash(hash).await.map(Arc::new);
        let shard = self.shard(index);
        let mut inflight = shard.inflight.lock();
        if let Ok(r) = &res {
            shard.resident.lock().insert(index, r.clone(), self.resident_per_shard);
        }
        inflight.remove(&index);
        res.map_err(Arc::new)
    }

    async fn load_hash(self: &Arc<Self>, hash: [u8; 32]) -> Result<Resident, String> {
        let _permit = self.fetch_permits.acquire().await.map_err(|e| e.to_string())?;
        if self.cache.is_some() {
            let chunks = self.clone();
            let cached = tokio::task::spawn_blocking(move || chunks.cache.as_ref().and_then(|c| c.open_chunk(&hash)));
            if let Ok(Some(file)) = cached.await {
                self.hits.fetch_add(1, Relaxed);
                return Ok(Resident::File(file));
            }
        }
        let bytes = self.fetch_with_retries(hash).await?;
        self.misses.fetch_add(1, Relaxed);
        self.bytes_fetched.fetch_add(bytes.len() as u64, Relaxed);
        if self.cache.is_none() {
            return Ok(Resident::Memory(bytes));
        }
        let chunks = self.clone();
        let stored = tokio::task::spawn_blocking(move || {
            let file = chunks.cache.as_ref().and_then(|c| c.insert(&hash, &bytes));
            file.map_or(Resident::Memory(bytes), Resident::File)
        });
        stored.await.map_err(|e| e.to_string())
    }

    async fn fetch_with_retries(&self, hash: [u8; 32]) -> Result<Bytes, String> {
        let mut last = String::new();
        let mut delay = self.opts.retry_delay;
        for attempt in 0..self.opts.attempts {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            match tokio::time::timeout(self.opts.attempt_timeout, self.source.fetch(hash)).await {
                Ok(Ok(bytes)) => return Ok(bytes),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = format!("no answer within {:?}", self.opts.attempt_timeout),
            }
        }
        let why = format!("chunk {} unreadable after {} tries: {last}", hex(&hash), self.opts.attempts);
        log::error!("{why}");
        Err(why)
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            bytes_fetched: self.bytes_fetched.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
        }
    }
}

/// The read-only device of one pinned generation.
pub struct ChunkDevice {
    chunks: Arc<Chunks>,
    size: u64,
    /// Runs the fetches; an `Option` only so that `drop` can shut it down without waiting.
    runtime: Option<tokio::runtime::Runtime>,
}

impl ChunkDevice {
    /// The device of `manifest`'s image, its chunks from `source` through `cache` (if any).
    /// Starts fetching the manifest's metadata chunks at once.
    pub fn open(
        manifest: &Manifest,
        source: Arc<dyn ChunkSource>,
        cache: Option<ChunkCache>,
        opts: DeviceOptions,
    ) -> io::Result<ChunkDevice> {
        let chunk_size = u64::from(manifest.chunk_size);
        let needed = manifest.image_size.div_ceil(chunk_size.max(1));
        if chunk_size == 0 || needed != manifest.chunks.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "manifest of generation {}: {} chunks of {chunk_size} bytes cannot hold an image of {} bytes",
                    manifest.generation,
                    manifest.chunks.len(),
                    manifest.image_size
                ),
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ferrofs-fetch")
            .enable_all()
            .build()?;
        let chunks = Arc::new(Chunks {
            source,
            cache,
            refs: manifest.chunks.clone(),
            chunk_size,
            fetch_permits: tokio::sync::Semaphore::new(opts.fetches_max.max(1)),
            resident_per_shard: opts.resident_max.div_ceil(SHARDS).max(1),
            opts,
            shards: (0..SHARDS as u64)
                .map(|i| Shard {
                    resident: Mutex::new_indexed(&RESIDENT, i, ResidentSet::default()),
                    inflight: Mutex::new_indexed(&INFLIGHT, i, HashMap::new()),
                })
                .collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        });
        let device = ChunkDevice { chunks, size: manifest.image_size, runtime: Some(runtime) };
        device.prefetch(&manifest.metadata);
        Ok(device)
    }

    /// Counters since the device was opened.
    pub fn stats(&self) -> DeviceStats {
        self.chunks.stats()
    }

    /// The cache directory's bytes in use, if there is one.
    pub fn cache_bytes(&self) -> Option<u64> {
        self.chunks.cache.as_ref().map(ChunkCache::used_bytes)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives until drop")
    }

    /// Fetch `indices` in the background, a few at a time; failures are left to the reads.
    fn prefetch(&self, indices: &[u32]) {
        let wanted: Vec<u32> = indices
            .iter()
            .copied()
            .filter(|&i| matches!(self.chunks.refs.get(i as usize), Some(ChunkRef::Stored(_))))
            .collect();
        let chunks = self.chunks.clone();
        let handle = self.runtime().handle().clone();
        let parallel = chunks.opts.prefetch_max.max(1);
        self.runtime().spawn(async move {
            futures::stream::iter(wanted)
                .map(|i| match chunks.get(&handle, i) {
                    Ok(_) => futures::future::ready(()).boxed(),
                    Err(fetch) => fetch.map(drop).boxed(),
                })
                .buffer_unordered(parallel)
                .for_each(|()| async {})
                .await
        });
    }
}

impl Drop for ChunkDevice {
    fn drop(&mut self) {
        // Fetches still running (prefetches, a read's abandoned try) are of no use now.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl BlockDevice for ChunkDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let end = off.checked_add(buf.len() as u64).filter(|&e| e <= self.size).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} bytes at {off} exceed the image", buf.len()))
        })?;
        self.chunks.bytes_read.fetch_add(buf.len() as u64, Relaxed);
        let cs = self.chunks.chunk_size;
        let handle = self.runtime().handle();
        // (chunk index, offset in it, buffer range) of each piece.
        let mut pieces = Vec::new();
        let mut pos = off;
        while pos < end {
            let len = (cs - pos % cs).min(end - pos);
            let at = (pos - off) as usize;
            pieces.push(((pos / cs) as u32, pos % cs, at..at + len as usize));
            pos += len;
        }
        let mut waiting = Vec::new();
        for (index, within, range) in pieces {
            match self.chunks.refs[index as usize] {
                ChunkRef::Zero => buf[range].fill(0),
                ChunkRef::Stored(_) => match self.chunks.get(handle, index) {
                    Ok(chunk) => chunk.read(&mut buf[range], within)?,
                    Err(fetch) => waiting.push((fetch, within, range)),
                },
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let fetched = handle.block_on(futures::future::join_all(waiting.iter().map(|(f, _, _)| f.clone())));
        for (res, (_, within, range)) in fetched.into_iter().zip(waiting) {
            let chunk = res.map_err(|_| io::Error::from_raw_os_error(libc::EIO))?;
            chunk.read(&mut buf[range], within)?;
        }
        Ok(())
    }

    fn write_at(&self, _buf: &[u8], _off: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests;

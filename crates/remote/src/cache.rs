//! The local chunk cache: a directory of chunk files named by the SHA-256 of their bytes,
//! bounded by size, evicting the least recently used. Content addressing makes it shareable:
//! every mount of every prefix and generation that uses a chunk finds the same file, and two
//! processes writing one chunk write the same bytes. A chunk is written under a temporary name
//! and renamed into place, so no reader sees half a chunk; each is verified against its name
//! when a process first opens it, so a damaged file is a miss (and is removed), never wrong
//! data. Recency is the file's mtime, set on insert and when a process first opens it, so
//! every process evicts in one shared order.

use crate::store::{chunk_hash, hex};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::SystemTime;

/// What an eviction leaves used, as a share of the bound: evicting below it, not just to it,
/// spares a directory scan on each of the inserts that follow.
const EVICT_TO_PERCENT: u64 = 90;

/// A chunk cache directory bounded to `limit_bytes` of chunk files.
pub struct ChunkCache {
    dir: PathBuf,
    limit_bytes: u64,
    /// Bytes of chunk files, as of the last scan plus this process's inserts since.
    used_bytes: AtomicU64,
    /// Writing a chunk failed (a full file system, a read-only directory): said once.
    write_failed: AtomicBool,
}

/// The name of a chunk's file: its hash in lowercase hex, as its object key ends.
fn file_name(hash: &[u8; 32]) -> String {
    hex(hash)
}

impl ChunkCache {
    /// Open (creating it if needed) the cache in `dir`, bounded to `limit_bytes`.
    pub fn open(dir: &Path, limit_bytes: u64) -> io::Result<ChunkCache> {
        fs::create_dir_all(dir.join("chunks"))?;
        fs::create_dir_all(dir.join("tmp"))?;
        let cache = ChunkCache {
            dir: dir.to_owned(),
            limit_bytes,
            used_bytes: AtomicU64::new(0),
            write_failed: AtomicBool::new(false),
        };
        cache.used_bytes.store(cache.scan()?.iter().map(|f| f.size).sum(), Relaxed);
        Ok(cache)
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes of chunk files in the cache, as this process last counted them.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Relaxed)
    }

    fn path(&self, hash: &[u8; 32]) -> PathBuf {
        self.dir.join("chunks").join(file_name(hash))
    }

    /// The cached chunk `hash`, opened and verified; `None` if it is not cached or its bytes
    /// do not match its hash (the bad file is then removed). Marks it recently used.
    pub fn open_chunk(&self, hash: &[u8; 32]) -> Option<File> {
        let path = self.path(hash);
        let mut file = File::open(&path).ok()?;
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() || chunk_hash(&bytes) != *hash {
            log::warn!("chunk cache: {} does not match its hash; fetching it again", path.display());
            self.remove(&path, bytes.len() as u64);
            return None;
        }
        // Recency for every process's eviction; failing to set it only makes eviction less fair.
        let _ = file.set_modified(SystemTime::now());
        Some(file)
    }

    /// Store `bytes` as chunk `hash` and return it opened; `None` when it cannot be written
    /// (said once in the log: reads go on from the network).
    pub fn insert(&self, hash: &[u8; 32], bytes: &[u8]) -> Option<File> {
        debug_assert_eq!(chunk_hash(bytes), *hash);
        if bytes.len() as u64 > self.limit_bytes {
            self.write_failed_once(&format!("a chunk of {} bytes is larger than cache_size", bytes.len()));
            return None;
        }
        match self.write(hash, bytes) {
            Ok(file) => {
                if self.used_bytes.fetch_add(bytes.len() as u64, Relaxed) + bytes.len() as u64 > self.limit_bytes {
                    self.evict();
                }
                Some(file)
            }
            Err(e) => {
                self.write_failed_once(&e.to_string());
                None
            }
        }
    }

    fn write(&self, hash: &[u8; 32], bytes: &[u8]) -> io::Result<File> {
        use std::io::Write;
        let tmp = tempfile::Builder::new().prefix(&file_name(hash)).tempfile_in(self.dir.join("tmp"))?;
        tmp.as_file().write_all(bytes)?;
        // Another process may have put the same chunk there first: same name, same bytes.
        let file = tmp.persist(self.path(hash)).map_err(|e| e.error)?;
        Ok(file)
    }

    fn write_failed_once(&self, why: &str) {
        if !self.write_failed.swap(true, Relaxed) {
            log::error!(
                "chunk cache {} cannot take more chunks ({why}): reading on from the network without caching",
                self.dir.display()
            );
        }
    }

    fn remove(&self, path: &Path, size: u64) {
        if fs::remove_file(path).is_ok() {
            let _ = self.used_bytes.fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(size)));
        }
    }

    /// Every chunk file with its size and mtime, oldest first.
    fn scan(&self) -> io::Result<Vec<CachedFile>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(self.dir.join("chunks"))? {
            let Ok(entry) = entry else { continue };
            // Another process may evict it under us: skip what has gone.
            let Ok(meta) = entry.metadata() else { continue };
            files.push(CachedFile {
                path: entry.path(),
                size: meta.len(),
                used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        files.sort_by_key(|f| f.used);
        Ok(files)
    }

    /// Remove the least recently used chunks (of every process) until the cache is under
    /// [`EVICT_TO_PERCENT`] of its bound. A chunk evicted while another process reads it stays
    /// readable through that process's open file.
    fn evict(&self) {
        let files = match self.scan() {
            Ok(files) => files,
            Err(e) => return log::warn!("chunk cache {}: cannot list it to evict: {e}", self.dir.display()),
        };
        let mut used: u64 = files.iter().map(|f| f.size).sum();
        let target = self.limit_bytes / 100 * EVICT_TO_PERCENT;
        for f in &files {
            if used <= target {
                break;
            }
            if fs::remove_file(&f.path).is_ok() {
                used -= f.size;
            }
        }
        self.used_bytes.store(used, Relaxed);
    }
}

struct CachedFile {
    path: PathBuf,
    size: u64,
    used: SystemTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(fill: u8, len: usize) -> (Vec<u8>, [u8; 32]) {
        let bytes = vec![fill; len];
        let hash = chunk_hash(&bytes);
        (bytes, hash)
    }

    #[test]
    fn a_chunk_inserted_is_found_by_another_opener() {
        let dir = tempfile::tempdir().unwrap();
        let (bytes, hash) = chunk(7, 4096);
        let a = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        assert!(a.open_chunk(&hash).is_none());
        a.insert(&hash, &bytes).unwrap();
        let b = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(b.used_bytes(), 4096, "a second opener counts what the first stored");
        let mut read = vec![0u8; bytes.len()];
        std::os::unix::fs::FileExt::read_exact_at(&b.open_chunk(&hash).unwrap(), &mut read, 0).unwrap();
        assert!(read == bytes);
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "no temporary file left");
    }

    #[test]
    fn a_damaged_chunk_is_a_miss_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (bytes, hash) = chunk(1, 4096);
        let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        cache.insert(&hash, &bytes).unwrap();
        let path = cache.path(&hash);
        let mut damaged = bytes.clone();
        damaged[100] ^= 1;
        fs::write(&path, &damaged).unwrap();
        assert!(cache.open_chunk(&hash).is_none());
        assert!(!path.exists());
        assert_eq!(cache.used_bytes(), 0);
    }

    #[test]
    fn eviction_removes_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ChunkCache::open(dir.path(), 3 * 4096).unwrap();
        let chunks: Vec<_> = (0..4).map(|i| chunk(i, 4096)).collect();
        let set_age = |hash: &[u8; 32], secs: u64| {
            let when = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + secs);
            File::options().write(true).open(cache.path(hash)).unwrap().set_modified(when).unwrap();
        };
        for (i, (bytes, hash)) in chunks[..3].iter().enumerate() {
            cache.insert(hash, bytes).unwrap();
            set_age(hash, i as u64);
        }
        // Chunk 0 is used again: chunk 1 is now the least recent.
        cache.open_chunk(&chunks[0].1).unwrap();
        cache.insert(&chunks[3].1, &chunks[3].0).unwrap();
        assert!(cache.used_bytes() <= 3 * 4096 / 100 * EVICT_TO_PERCENT, "{}", cache.used_bytes());
        assert!(cache.open_chunk(&chunks[0].1).is_some(), "recently used chunk kept");
        assert!(cache.open_chunk(&chunks[1].1).is_none(), "least recently used chunk evicted");
        assert!(cache.open_chunk(&chunks[3].1).is_some(), "the new chunk kept");
    }

    #[test]
    fn a_cache_that_cannot_take_a_chunk_declines_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ChunkCache::open(dir.path(), 1000).unwrap();
        let (bytes, hash) = chunk(3, 4096);
        assert!(cache.insert(&hash, &bytes).is_none(), "larger than the bound");
        assert!(cache.write_failed.load(Relaxed));
        let dir2 = tempfile::tempdir().unwrap();
        let cache = ChunkCache::open(dir2.path(), 1 << 20).unwrap();
        fs::remove_dir(dir2.path().join("tmp")).unwrap();
        assert!(cache.insert(&hash, &bytes).is_none(), "no room to write");
        assert!(cache.write_failed.load(Relaxed));
    }
}

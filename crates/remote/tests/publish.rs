//! Publishing and collecting against the in-memory store: round trips checked byte for byte and
//! by the engine's fsck, a crash at every step of a publish, two publishers at once, and gc
//! never taking a kept generation's chunk.

use async_trait::async_trait;
use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::fsck::{check, FsckOptions};
use ferrofs::{Cred, FileSystem, MkfsOptions, MountOptions};
use ferrofs_remote::gc::gc;
use ferrofs_remote::manifest::ChunkRef;
use ferrofs_remote::publish::{publish, PublishError};
use ferrofs_remote::store::check_chunk;
use ferrofs_remote::Remote;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const IMAGE_BYTES: u64 = 64 << 20;
const CHUNK: u32 = 256 << 10;
const ROOT: Cred = Cred { uid: 0, gid: 0 };

/// A fresh image with `files` files of distinct content, unmounted cleanly.
fn image(files: usize, seed: u8) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(IMAGE_BYTES));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    fs.mkdir(ferrofs::ROOT_INO, b"d", 0o755, ROOT).unwrap();
    for i in 0..files {
        fs.write_file(&format!("/d/f{i}"), &vec![seed.wrapping_add(i as u8); 40_000 + i], ROOT).unwrap();
    }
    fs.unmount().unwrap();
    dev
}

fn bytes_of(dev: &dyn BlockDevice) -> Vec<u8> {
    let mut bytes = vec![0; dev.size() as usize];
    dev.read_at(&mut bytes, 0).unwrap();
    bytes
}

/// The image of the generation `HEAD` names, put back together from its chunks (each checked
/// against its hash); None before the first publish.
fn reassemble(remote: &Remote) -> Option<Vec<u8>> {
    let manifest = remote.manifest(remote.head().unwrap()?).unwrap();
    let mut image = Vec::with_capacity(manifest.image_size as usize);
    for (index, chunk) in manifest.chunks.iter().enumerate() {
        let len = manifest.chunk_len(index as u64) as usize;
        match chunk {
            ChunkRef::Zero => image.resize(image.len() + len, 0),
            ChunkRef::Stored(hash) => {
                let bytes = remote.get_chunk(hash).unwrap();
                assert_eq!(bytes.len(), len);
                image.extend_from_slice(&bytes);
            }
        }
    }
    Some(image)
}

/// fsck finds nothing wrong with `image`, and file `/d/f{n}` holds what `image()` wrote.
fn assert_sound(image: &[u8], seed: u8, file: usize) {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let report = check(&*dev, &FsckOptions::default(), &|_, _, _| {}).unwrap();
    assert_eq!(report.errors_found, 0, "{:?}", report.messages);
    let fs = FileSystem::mount_device(dev, &MountOptions { read_only: true, ..Default::default() }).unwrap();
    assert_eq!(fs.read_file(&format!("/d/f{file}")).unwrap(), vec![seed.wrapping_add(file as u8); 40_000 + file]);
}

#[test]
fn publish_round_trips_and_uploads_only_changes() {
    let remote = Remote::memory();
    let first = image(20, 1);
    // 4 MiB no two of whose chunks are alike (251 is prime to the chunk size).
    let fs = FileSystem::mount_device(first.clone(), &MountOptions::default()).unwrap();
    let big: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8 + 1).collect();
    fs.write_file("/big", &big, ROOT).unwrap();
    fs.unmount().unwrap();
    let report = publish(&remote, &*first, CHUNK).unwrap();
    assert_eq!((report.generation, report.parent), (1, 0));
    assert_eq!(report.chunks, IMAGE_BYTES / u64::from(CHUNK));
    assert!(report.zero_chunks > report.chunks / 2, "a mostly empty image is mostly zero chunks: {report:?}");
    let image_one = bytes_of(&*first);
    assert_eq!(reassemble(&remote).unwrap(), image_one);
    assert_sound(&image_one, 1, 19);
    let manifest = remote.manifest(1).unwrap();
    assert_eq!(manifest.metadata.first(), Some(&0), "the superblock's chunk is fetched first");
    assert!(report.metadata_chunks < report.chunks - report.zero_chunks, "file data is not metadata: {report:?}");

    // One more file: far fewer chunks go up the second time.
    let fs = FileSystem::mount_device(first.clone(), &MountOptions::default()).unwrap();
    fs.write_file("/d/new", b"hello", ROOT).unwrap();
    fs.unmount().unwrap();
    let second = publish(&remote, &*first, CHUNK).unwrap();
    assert_eq!((second.generation, second.parent), (2, 1));
    assert!(second.uploaded_chunks * 4 < report.uploaded_chunks, "{second:?} after {report:?}");
    let image_two = bytes_of(&*first);
    assert_eq!(reassemble(&remote).unwrap(), image_two);
    assert_sound(&image_two, 1, 3);
}

/// Which operation a crash hits, and whether the store had done it when the process died.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// Operation K and all later ones never reach the store.
    Before(usize),
    /// Operation K is done but its answer is lost; the later ones never happen.
    After(usize),
}

/// An in-memory store that dies at a chosen operation, and can hold every manifest write at a
/// barrier (two publishers meet there).
#[derive(Debug)]
struct FaultStore {
    inner: Arc<InMemory>,
    ops: AtomicUsize,
    crash: Option<Crash>,
    manifest_rendezvous: Option<Arc<Barrier>>,
}

impl std::fmt::Display for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultStore({:?})", self.crash)
    }
}

fn injected() -> object_store::Error {
    object_store::Error::Generic { store: "FaultStore", source: "injected crash".into() }
}

impl FaultStore {
    fn over(inner: Arc<InMemory>, crash: Option<Crash>) -> FaultStore {
        FaultStore { inner, ops: AtomicUsize::new(0), crash, manifest_rendezvous: None }
    }

    /// Runs one operation as the crash plan allows.
    async fn op<T>(&self, run: impl std::future::Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
        let n = self.ops.fetch_add(1, SeqCst);
        match self.crash {
            Some(Crash::Before(k)) if n >= k => Err(injected()),
            Some(Crash::After(k)) if n > k => Err(injected()),
            Some(Crash::After(k)) if n == k => {
                run.await?;
                Err(injected())
            }
            _ => run.await,
        }
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if let Some(barrier) = self.manifest_rendezvous.as_ref().filter(|_| location.as_ref().contains("manifests/")) {
            barrier.wait();
        }
        self.op(self.inner.put_opts(location, payload, opts)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.op(self.inner.put_multipart_opts(location, opts)).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.op(self.inner.get_opts(location, options)).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if matches!(self.crash, Some(Crash::Before(k) | Crash::After(k)) if self.ops.fetch_add(1, SeqCst) >= k) {
            return futures::stream::once(async { Err(injected()) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.op(self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.op(self.inner.copy_opts(from, to, options)).await
    }
}

#[test]
fn a_crash_at_any_step_leaves_one_whole_generation() {
    let old = image(8, 10);
    let new = image(12, 20);
    let (old_bytes, new_bytes) = (bytes_of(&*old), bytes_of(&*new));
    let mut crashes_before_head = 0;
    let mut crashes_after_head = 0;
    for step in 0.. {
        let mut finished = true;
        for crash in [Crash::Before(step), Crash::After(step)] {
            let memory = Arc::new(InMemory::new());
            let clean = Remote::with_store(memory.clone(), Path::default());
            publish(&clean, &*old, CHUNK).unwrap();
            let faulty = Remote::with_store(Arc::new(FaultStore::over(memory.clone(), Some(crash))), Path::default());
            let result = publish(&faulty, &*new, CHUNK);
            finished &= result.is_ok();
            // Whatever the crash hit: HEAD names one generation, and it is one whole image.
            let seen = reassemble(&clean).unwrap();
            match clean.head().unwrap() {
                Some(1) => {
                    assert!(seen == old_bytes, "{crash:?}: generation 1 is not the old image");
                    crashes_before_head += 1;
                }
                Some(2) => {
                    assert!(seen == new_bytes, "{crash:?}: generation 2 is not the new image");
                    crashes_after_head += 1;
                }
                other => panic!("{crash:?}: HEAD is {other:?}"),
            }
            // And the next publish goes through, over whatever was left.
            let next = publish(&clean, &*new, CHUNK).unwrap();
            assert!(next.generation >= 2, "{crash:?}: {next:?}");
            assert!(reassemble(&clean).unwrap() == new_bytes, "{crash:?}: the publish after the crash");
        }
        if finished {
            break;
        }
    }
    assert!(crashes_before_head > 10, "the crash hit every step of the upload");
    assert!(crashes_after_head >= 2, "and the points after HEAD moved");
}

#[test]
fn of_two_publishers_at_once_exactly_one_wins() {
    let memory = Arc::new(InMemory::new());
    let clean = Remote::with_store(memory.clone(), Path::default());
    publish(&clean, &*image(3, 1), CHUNK).unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let images = [image(5, 50), image(7, 70)];
    let results: Vec<Result<_, PublishError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = images
            .iter()
            .map(|dev| {
                let store =
                    FaultStore { manifest_rendezvous: Some(barrier.clone()), ..FaultStore::over(memory.clone(), None) };
                let remote = Remote::with_store(Arc::new(store), Path::default());
                scope.spawn(move || publish(&remote, &**dev, CHUNK))
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().unwrap()).collect()
    });
    let winners: Vec<usize> = (0..2).filter(|&i| results[i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let loser = &results[1 - winners[0]];
    assert!(matches!(loser, Err(PublishError::Lost(_))), "{loser:?}");
    let message = loser.as_ref().unwrap_err().to_string();
    assert!(message.starts_with("another publisher won") && !message.contains('\n'), "{message}");
    assert_eq!(clean.head().unwrap(), Some(2));
    assert!(reassemble(&clean).unwrap() == bytes_of(&*images[winners[0]]));
}

#[test]
fn gc_keeps_every_chunk_of_the_kept_generations() {
    let remote = Remote::memory();
    let dev = image(10, 1);
    let mut images = Vec::new();
    for round in 0..4u8 {
        let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
        fs.write_file(&format!("/d/round{round}"), &vec![round; 300_000], ROOT).unwrap();
        fs.unmount().unwrap();
        publish(&remote, &*dev, CHUNK).unwrap();
        images.push(bytes_of(&*dev));
    }
    // A chunk a publish in progress uploaded and no manifest names yet.
    let pending = vec![9u8; 4096];
    let pending_hash = ferrofs_remote::store::chunk_hash(&pending);
    remote.put(&remote.chunk_key(&pending_hash), pending.clone().into(), object_store::PutMode::Overwrite).unwrap();
    let report = gc(&remote, 2, Duration::from_secs(3600)).unwrap();
    assert_eq!(report.kept, vec![3, 4]);
    assert_eq!(report.manifests_deleted, 2);
    assert_eq!(report.chunks_deleted, 0, "every unnamed chunk is younger than the grace: {report:?}");
    assert!(report.chunks_spared > 0);

    let report = gc(&remote, 2, Duration::ZERO).unwrap();
    assert!(report.chunks_deleted > 0, "{report:?}");
    assert!(matches!(remote.get_chunk(&pending_hash), Err(ferrofs_remote::RemoteError::NotFound(_))));
    for generation in [3, 4] {
        let manifest = remote.manifest(generation).unwrap();
        for chunk in &manifest.chunks {
            if let ChunkRef::Stored(hash) = chunk {
                let bytes = remote.get_chunk(hash).unwrap();
                check_chunk(hash, &bytes).unwrap();
            }
        }
    }
    assert!(reassemble(&remote).unwrap() == images[3]);
    assert!(matches!(remote.manifest(2), Err(ferrofs_remote::RemoteError::NotFound(_))));
    // Nothing more to take.
    let again = gc(&remote, 2, Duration::ZERO).unwrap();
    assert_eq!((again.manifests_deleted, again.chunks_deleted), (0, 0));
}

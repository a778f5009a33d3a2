//! Publishing one generation of an image (docs/DESIGN.md, "Publishing to object storage").
//!
//! The order is what makes every crash harmless: first the chunks (new keys, or the same bytes
//! again under a key that already names them), then the manifest under a key no generation
//! has used (create-only), and last `HEAD`, moved by one conditional write from the
//! generation this publish started from. Until that write lands, `HEAD` names the previous
//! generation, whose manifest and chunks nothing here touches; once it lands, every object the
//! new generation needs is already there.

use crate::manifest::{ChunkRef, Manifest, ManifestError, CHUNK_SIZE_MAX, CHUNK_SIZE_MIN};
use crate::store::{chunk_hash, generation_name, parse_generation, Remote, RemoteError};
use bytes::Bytes;
use ferrofs::dev::BlockDevice;
use ferrofs::BLOCK_SIZE;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutPayload};
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Chunk size when none is asked for: big enough that a GET's latency is small beside its
/// transfer, small enough that a reader fetches little it does not need.
pub const CHUNK_SIZE_DEFAULT: u32 = 1 << 20;
/// Uploads in flight at once.
pub const UPLOADS_IN_FLIGHT: usize = 16;
/// A publish that took longer than this from its first upload to moving `HEAD` gives up
/// instead: `gc` may delete a chunk no manifest names once it is [`crate::gc::GRACE_MIN`]
/// old, and this publish's chunks are named by no manifest `HEAD` reaches until it is done.
pub const PUBLISH_WINDOW: Duration = Duration::from_secs(45 * 60);

/// What a publish did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// The generation now in `HEAD`.
    pub generation: u64,
    /// The generation it replaced, 0 for the first.
    pub parent: u64,
    /// Chunks in the image.
    pub chunks: u64,
    /// Chunks of all zeros (not stored).
    pub zero_chunks: u64,
    /// Chunks uploaded by this publish.
    pub uploaded_chunks: u64,
    /// Their bytes.
    pub uploaded_bytes: u64,
    /// Chunks listed for readers to fetch first.
    pub metadata_chunks: u64,
}

/// Why a publish stopped; `HEAD` still names the generation it started from.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The store failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// Another publisher got there first.
    #[error("another publisher won: {0}; nothing of this publish is visible (run it again to publish over theirs)")]
    Lost(String),
    /// The image could not be read or is not a ferrofs image.
    #[error("{0}")]
    Image(String),
    /// The publish took longer than [`PUBLISH_WINDOW`].
    #[error("the upload took {0:?}, longer than the {PUBLISH_WINDOW:?} gc leaves new chunks alone; run it again (the chunks uploaded are not sent twice)")]
    TooSlow(Duration),
}

/// One chunk as read: its place in the manifest, and whether readers should fetch it first.
struct ReadChunk {
    chunk: ChunkRef,
    metadata: bool,
    uploaded_bytes: u64,
}

/// Publishes the file system on `dev` as the next generation under `remote`. Nothing may
/// write `dev` meanwhile (an unmounted image under its lock, with an empty log).
pub fn publish(remote: &Remote, dev: &dyn BlockDevice, chunk_size: u32) -> Result<PublishReport, PublishError> {
    let superblock = ferrofs::read_superblock(dev).map_err(|error| PublishError::Image(error.to_string()))?;
    let image_size = superblock.geo.block_count * BLOCK_SIZE as u64;
    if dev.size() < image_size {
        return Err(PublishError::Image(format!(
            "the image is {} bytes, shorter than its file system ({image_size} bytes)",
            dev.size()
        )));
    }
    let head = remote.head_versioned()?;
    let parent = head.as_ref().map_or(0, |(generation, _)| *generation);
    // Chunks the parent names are there for as long as it is `HEAD` (gc keeps `HEAD`'s); if it
    // stops being `HEAD`, this publish loses at the last step anyway.
    let present: HashSet<[u8; 32]> = match parent {
        0 => HashSet::new(),
        _ => stored_hashes(&remote.manifest(parent)?),
    };
    let generation = next_generation(remote, parent)?;
    if !(CHUNK_SIZE_MIN..=CHUNK_SIZE_MAX).contains(&chunk_size) || !chunk_size.is_power_of_two() {
        return Err(PublishError::Image(format!(
            "chunk size {chunk_size} is not a power of two from {CHUNK_SIZE_MIN} to {CHUNK_SIZE_MAX}"
        )));
    }
    let static_metadata = fixed_metadata_chunks(&superblock.geo, chunk_size);
    let chunk_count = Manifest::chunk_count(image_size, chunk_size);
    let mut manifest = Manifest {
        generation,
        parent,
        image_size,
        chunk_size,
        block_size: BLOCK_SIZE as u32,
        uuid: superblock.uuid,
        chunks: vec![ChunkRef::Zero; chunk_count as usize],
        metadata: Vec::new(),
    };
    manifest.check().map_err(|why| PublishError::Image(format!("cannot cut this image into chunks: {why}")))?;

    let started = Instant::now();
    let scheduled = &Mutex::new(present);
    let geometry = &manifest;
    let read_chunks: Vec<ReadChunk> = remote.block_on(
        futures::stream::iter(0..chunk_count)
            .map(|index| {
                let read = read_chunk(dev, geometry, index, static_metadata.contains(&index));
                async move {
                    let (bytes, metadata) = read?;
                    upload_chunk(remote, scheduled, bytes, metadata).await
                }
            })
            .buffered(UPLOADS_IN_FLIGHT)
            .try_collect(),
    )?;
    let mut report = PublishReport { generation, parent, chunks: chunk_count, ..Default::default() };
    for (index, read) in read_chunks.into_iter().enumerate() {
        report.zero_chunks += u64::from(read.chunk == ChunkRef::Zero);
        report.uploaded_chunks += u64::from(read.uploaded_bytes > 0);
        report.uploaded_bytes += read.uploaded_bytes;
        if read.metadata {
            manifest.metadata.push(index as u32);
        }
        manifest.chunks[index] = read.chunk;
    }
    report.metadata_chunks = manifest.metadata.len() as u64;
    debug_assert_eq!(manifest.check(), Ok(()));

    let manifest_key = remote.manifest_key(generation);
    remote.put(&manifest_key, manifest.encode().into(), PutMode::Create).map_err(|error| match error {
        RemoteError::Conflict(_) => PublishError::Lost(format!("generation {generation} was published first")),
        other => other.into(),
    })?;
    if started.elapsed() > PUBLISH_WINDOW {
        return Err(PublishError::TooSlow(started.elapsed()));
    }
    let mode = head.map_or(PutMode::Create, |(_, version)| PutMode::Update(version));
    remote.put(&remote.head_key(), generation_name(generation).into_bytes().into(), mode).map_err(
        |error| match error {
            RemoteError::Conflict(_) => PublishError::Lost(format!("HEAD moved off generation {parent}")),
            other => other.into(),
        },
    )?;
    // A server whose conditional writes are not atomic could let two publishers both pass;
    // the one whose manifest is not the one stored learns it here.
    if remote.manifest(generation)? != manifest {
        return Err(PublishError::Lost(format!("generation {generation} holds another publisher's manifest")));
    }
    Ok(report)
}

/// The SHA-256 of every stored chunk of `manifest`.
pub fn stored_hashes(manifest: &Manifest) -> HashSet<[u8; 32]> {
    manifest
        .chunks
        .iter()
        .filter_map(|chunk| match chunk {
            ChunkRef::Stored(hash) => Some(*hash),
            ChunkRef::Zero => None,
        })
        .collect()
}

/// The generations that have a manifest, in order.
pub fn manifest_generations(remote: &Remote) -> Result<Vec<u64>, RemoteError> {
    let mut generations: Vec<u64> = remote
        .list(&remote.manifests_dir())?
        .iter()
        .filter_map(|object| object.location.filename().and_then(|name| parse_generation(name.as_bytes())))
        .collect();
    generations.sort_unstable();
    Ok(generations)
}

/// The first generation above `HEAD` and above every manifest: a publish that died after its
/// manifest but before moving `HEAD` left that generation's key taken.
fn next_generation(remote: &Remote, head: u64) -> Result<u64, RemoteError> {
    let highest = manifest_generations(remote)?.last().copied().unwrap_or(0).max(head);
    highest.checked_add(1).ok_or_else(|| RemoteError::Manifest {
        generation: highest,
        error: ManifestError::Invalid("no generation number is left".to_string()),
    })
}

/// The chunks that hold the superblock and each allocation group's header, bitmaps, orphan
/// table and inode table: every mount reads them first.
fn fixed_metadata_chunks(geo: &ferrofs::Geometry, chunk_size: u32) -> HashSet<u64> {
    let chunk_of = |block: u64| block * BLOCK_SIZE as u64 / u64::from(chunk_size);
    let mut chunks = HashSet::from([0]);
    for agno in 0..geo.ag_count {
        let layout = geo.ag_layout(agno);
        let end = layout.inode_table + layout.inode_table_blocks;
        chunks.extend(chunk_of(layout.start)..=chunk_of(end - 1));
    }
    chunks
}

/// Reads chunk `index` of the image; whether it holds metadata: `fixed`, or any of its blocks
/// is a B+tree node or metadata data block.
fn read_chunk(
    dev: &dyn BlockDevice,
    manifest: &Manifest,
    index: u64,
    fixed: bool,
) -> Result<(Bytes, bool), PublishError> {
    let offset = index * u64::from(manifest.chunk_size);
    let mut bytes = vec![0; manifest.chunk_len(index) as usize];
    dev.read_at(&mut bytes, offset)
        .map_err(|error| PublishError::Image(format!("read the image at byte {offset}: {error}")))?;
    let first_block = offset / BLOCK_SIZE as u64;
    let metadata = fixed
        || bytes
            .chunks_exact(BLOCK_SIZE)
            .enumerate()
            .any(|(at, block)| ferrofs::is_index_block(block, first_block + at as u64));
    Ok((bytes.into(), metadata))
}

/// Uploads one chunk unless it is all zeros, or the parent generation or this publish already
/// has it.
async fn upload_chunk(
    remote: &Remote,
    scheduled: &Mutex<HashSet<[u8; 32]>>,
    bytes: Bytes,
    metadata: bool,
) -> Result<ReadChunk, PublishError> {
    if bytes.iter().all(|&byte| byte == 0) {
        return Ok(ReadChunk { chunk: ChunkRef::Zero, metadata: false, uploaded_bytes: 0 });
    }
    let hash = chunk_hash(&bytes);
    let chunk = ChunkRef::Stored(hash);
    if !scheduled.lock().expect("upload set").insert(hash) {
        return Ok(ReadChunk { chunk, metadata, uploaded_bytes: 0 });
    }
    let key = remote.chunk_key(&hash);
    let uploaded_bytes = bytes.len() as u64;
    // Overwrite, not create-only: the bytes are the key's own, and writing them again renews
    // the object's age that gc's grace period counts from.
    remote
        .object_store()
        .put(&key, PutPayload::from_bytes(bytes))
        .await
        .map_err(|error| remote.error("write", &key, error))?;
    Ok(ReadChunk { chunk, metadata, uploaded_bytes })
}

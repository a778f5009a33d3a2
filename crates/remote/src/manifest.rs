//! The manifest of one published generation: the image's geometry and the list of its chunks.
//!
//! docs/SPEC.md ("Published images") describes the bytes. The encoding is little-endian, fixed
//! size apart from the two lists, and ends with a SHA-256 over everything before it. `decode`
//! takes the bytes as hostile: it checks the length against the counts before allocating, the
//! checksum, every geometry rule and every index, and returns an error, never panics.

use sha2::{Digest, Sha256};

/// The first 8 bytes of every manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"FFSMANIF";
/// The encoding version this code writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// Bytes before the chunk list: magic, version, chunk size, block size, reserved, generation,
/// parent, image size, uuid, chunk count, metadata count.
pub const MANIFEST_HEADER_BYTES: usize = 80;
/// Bytes of one chunk entry: its SHA-256, or 32 zero bytes for an all-zero chunk.
pub const CHUNK_ENTRY_BYTES: usize = 32;
/// Bytes of the trailing SHA-256.
pub const MANIFEST_CHECKSUM_BYTES: usize = 32;
/// Smallest chunk size a manifest may name (one 4 KiB page).
pub const CHUNK_SIZE_MIN: u32 = 4096;
/// Largest chunk size a manifest may name: one object per GET must stay reasonable.
pub const CHUNK_SIZE_MAX: u32 = 64 << 20;
/// Smallest block size a manifest may name (the engine's smallest).
pub const BLOCK_SIZE_MIN: u32 = 512;
/// Largest block size a manifest may name (the engine's largest).
pub const BLOCK_SIZE_MAX: u32 = 65536;
/// Most chunks one manifest may list: metadata indices are 32-bit.
pub const CHUNK_COUNT_MAX: u64 = u32::MAX as u64;

/// One chunk of the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkRef {
    /// All zero bytes: not stored, read as zeros.
    Zero,
    /// Stored at `chunks/<hex of this SHA-256 of its bytes>`.
    Stored([u8; 32]),
}

/// One published generation of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// This generation's number, at least 1.
    pub generation: u64,
    /// The generation this one was published over, 0 for the first.
    pub parent: u64,
    /// The image's size in bytes, a multiple of `block_size`.
    pub image_size: u64,
    /// Bytes per chunk (the last chunk may be shorter), a power of two.
    pub chunk_size: u32,
    /// The file system's block size, a power of two no larger than `chunk_size`.
    pub block_size: u32,
    /// The file system's UUID.
    pub uuid: [u8; 16],
    /// One entry per chunk, `ceil(image_size / chunk_size)` of them.
    pub chunks: Vec<ChunkRef>,
    /// Chunk indices to prefetch first (superblock, AG headers, inode tables, directory
    /// blocks), strictly increasing.
    pub metadata: Vec<u32>,
}

/// Why a manifest's bytes were refused; each is one line naming what was wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    /// Fewer bytes than the fixed header and checksum.
    #[error("manifest too short: {0} bytes")]
    TooShort(usize),
    /// The first bytes are not the manifest magic.
    #[error("not a ferrofs manifest (bad magic)")]
    BadMagic,
    /// A version this code does not read.
    #[error("manifest version {0} is not supported (this ferrofs reads version {MANIFEST_VERSION})")]
    UnsupportedVersion(u32),
    /// The length does not match the counts in the header.
    #[error("manifest length {actual} does not match its counts (expected {expected})")]
    Length {
        /// What the header's counts imply.
        expected: u64,
        /// What was read.
        actual: usize,
    },
    /// The trailing SHA-256 does not match the bytes.
    #[error("manifest checksum mismatch: the manifest is damaged")]
    Checksum,
    /// A field breaks a geometry or consistency rule.
    #[error("manifest is inconsistent: {0}")]
    Invalid(String),
}

impl Manifest {
    /// The number of chunks an image of `image_size` bytes has at `chunk_size`.
    pub fn chunk_count(image_size: u64, chunk_size: u32) -> u64 {
        image_size.div_ceil(u64::from(chunk_size))
    }

    /// The byte length of chunk `index`: `chunk_size`, or less for the last one.
    pub fn chunk_len(&self, index: u64) -> u64 {
        let start = index * u64::from(self.chunk_size);
        debug_assert!(start < self.image_size, "chunk {index} past the image");
        (self.image_size - start).min(u64::from(self.chunk_size))
    }

    /// The manifest's bytes (docs/SPEC.md, "Published images").
    pub fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.check(), Ok(()), "encoding an invalid manifest");
        let len = encoded_len(self.chunks.len() as u64, self.metadata.len() as u64)
            .expect("a checked manifest's length fits in memory") as usize;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MANIFEST_MAGIC);
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&self.block_size.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.image_size.to_le_bytes());
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        debug_assert_eq!(out.len(), MANIFEST_HEADER_BYTES);
        for chunk in &self.chunks {
            match chunk {
                ChunkRef::Zero => out.extend_from_slice(&[0; CHUNK_ENTRY_BYTES]),
                ChunkRef::Stored(hash) => out.extend_from_slice(hash),
            }
        }
        for index in &self.metadata {
            out.extend_from_slice(&index.to_le_bytes());
        }
        let checksum = Sha256::digest(&out);
        out.extend_from_slice(&checksum);
        debug_assert_eq!(out.len(), len);
        out
    }

    /// Parses and checks a manifest's bytes; any damage or inconsistency is an error.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() < MANIFEST_HEADER_BYTES + MANIFEST_CHECKSUM_BYTES {
            return Err(ManifestError::TooShort(bytes.len()));
        }
        let mut reader = Reader { bytes, at: 0 };
        if reader.take::<8>() != MANIFEST_MAGIC {
            return Err(ManifestError::BadMagic);
        }
        let version = reader.u32();
        if version != MANIFEST_VERSION {
            return Err(ManifestError::UnsupportedVersion(version));
        }
        let chunk_size = reader.u32();
        let block_size = reader.u32();
        let reserved = reader.u32();
        let generation = reader.u64();
        let parent = reader.u64();
        let image_size = reader.u64();
        let uuid = reader.take::<16>();
        let chunk_count = reader.u64();
        let metadata_count = reader.u64();
        debug_assert_eq!(reader.at, MANIFEST_HEADER_BYTES);
        // The length first, so that a hostile count cannot make us allocate.
        let expected = encoded_len(chunk_count, metadata_count);
        if expected != Some(bytes.len() as u64) {
            return Err(ManifestError::Length { expected: expected.unwrap_or(u64::MAX), actual: bytes.len() });
        }
        let (body, checksum) = bytes.split_at(bytes.len() - MANIFEST_CHECKSUM_BYTES);
        if Sha256::digest(body).as_slice() != checksum {
            return Err(ManifestError::Checksum);
        }
        if reserved != 0 {
            return Err(ManifestError::Invalid(format!("reserved field is {reserved:#x}, not 0")));
        }
        let chunks = (0..chunk_count)
            .map(|_| {
                let entry = reader.take::<CHUNK_ENTRY_BYTES>();
                if entry == [0; CHUNK_ENTRY_BYTES] {
                    ChunkRef::Zero
                } else {
                    ChunkRef::Stored(entry)
                }
            })
            .collect();
        let metadata = (0..metadata_count).map(|_| reader.u32()).collect();
        let manifest = Manifest { generation, parent, image_size, chunk_size, block_size, uuid, chunks, metadata };
        manifest.check().map_err(ManifestError::Invalid)?;
        Ok(manifest)
    }

    /// Checks every rule docs/SPEC.md states for the fields; the reason on failure.
    pub fn check(&self) -> Result<(), String> {
        let power_of_two_in = |value: u32, min: u32, max: u32| value.is_power_of_two() && (min..=max).contains(&value);
        if !power_of_two_in(self.chunk_size, CHUNK_SIZE_MIN, CHUNK_SIZE_MAX) {
            return Err(format!(
                "chunk size {} is not a power of two in {CHUNK_SIZE_MIN}..={CHUNK_SIZE_MAX}",
                self.chunk_size
            ));
        }
        if !power_of_two_in(self.block_size, BLOCK_SIZE_MIN, BLOCK_SIZE_MAX) {
            return Err(format!(
                "block size {} is not a power of two in {BLOCK_SIZE_MIN}..={BLOCK_SIZE_MAX}",
                self.block_size
            ));
        }
        if self.block_size > self.chunk_size {
            return Err(format!("block size {} is larger than chunk size {}", self.block_size, self.chunk_size));
        }
        if self.image_size == 0 || !self.image_size.is_multiple_of(u64::from(self.block_size)) {
            return Err(format!(
                "image size {} is not a positive multiple of the block size {}",
                self.image_size, self.block_size
            ));
        }
        let chunk_count = Self::chunk_count(self.image_size, self.chunk_size);
        if chunk_count > CHUNK_COUNT_MAX {
            return Err(format!("{chunk_count} chunks is more than {CHUNK_COUNT_MAX}"));
        }
        if self.chunks.len() as u64 != chunk_count {
            return Err(format!(
                "{} chunks listed, but an image of {} bytes in {}-byte chunks has {chunk_count}",
                self.chunks.len(),
                self.image_size,
                self.chunk_size
            ));
        }
        if self.generation == 0 || self.parent >= self.generation {
            return Err(format!(
                "generation {} with parent {}: generations start at 1 and grow",
                self.generation, self.parent
            ));
        }
        if let Some(&index) = self.metadata.iter().find(|&&index| u64::from(index) >= chunk_count) {
            return Err(format!("metadata chunk {index} is past the last chunk {}", chunk_count - 1));
        }
        if !self.metadata.windows(2).all(|pair| pair[0] < pair[1]) {
            return Err("metadata chunk indices are not strictly increasing".to_string());
        }
        if self.chunks.contains(&ChunkRef::Stored([0; 32])) {
            return Err("a stored chunk's hash is all zeros".to_string());
        }
        Ok(())
    }
}

/// The encoded length of a manifest with these counts, or None if it overflows.
fn encoded_len(chunk_count: u64, metadata_count: u64) -> Option<u64> {
    let chunks = chunk_count.checked_mul(CHUNK_ENTRY_BYTES as u64)?;
    let metadata = metadata_count.checked_mul(4)?;
    chunks.checked_add(metadata)?.checked_add((MANIFEST_HEADER_BYTES + MANIFEST_CHECKSUM_BYTES) as u64)
}

/// Reads little-endian fields off a slice whose length the caller has already checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let field = self.bytes[self.at..self.at + N].try_into().expect("N bytes");
        self.at += N;
        field
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        Manifest {
            generation: 3,
            parent: 2,
            image_size: 3 * 65536 + 4096,
            chunk_size: 65536,
            block_size: 4096,
            uuid: [7; 16],
            chunks: vec![
                ChunkRef::Stored([1; 32]),
                ChunkRef::Zero,
                ChunkRef::Stored([2; 32]),
                ChunkRef::Stored([1; 32]),
            ],
            metadata: vec![0, 2],
        }
    }

    /// A valid encoding with one field changed and the checksum recomputed, so that the field
    /// checks (not the checksum) must catch it.
    fn resealed(mut bytes: Vec<u8>, edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let body_len = bytes.len() - MANIFEST_CHECKSUM_BYTES;
        edit(&mut bytes[..body_len]);
        let checksum = Sha256::digest(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&checksum);
        bytes
    }

    #[test]
    fn round_trip() {
        let manifest = sample();
        let bytes = manifest.encode();
        assert_eq!(bytes.len(), 80 + 4 * 32 + 2 * 4 + 32);
        assert_eq!(&bytes[..8], b"FFSMANIF");
        assert_eq!(Manifest::decode(&bytes), Ok(manifest));
    }

    #[test]
    fn last_chunk_is_short() {
        let manifest = sample();
        assert_eq!(manifest.chunk_len(0), 65536);
        assert_eq!(manifest.chunk_len(3), 4096);
    }

    #[test]
    fn damaged_bytes_fail_the_checksum() {
        let mut bytes = sample().encode();
        bytes[100] ^= 1;
        assert_eq!(Manifest::decode(&bytes), Err(ManifestError::Checksum));
    }

    #[test]
    fn each_field_rule_is_checked() {
        let bytes = sample().encode();
        type Edit = fn(&mut [u8]);
        let cases: [(&str, Edit); 8] = [
            ("chunk size", |b| b[12..16].copy_from_slice(&65535u32.to_le_bytes())),
            ("block size", |b| b[16..20].copy_from_slice(&256u32.to_le_bytes())),
            ("reserved", |b| b[20] = 1),
            ("generation", |b| b[24..32].copy_from_slice(&0u64.to_le_bytes())),
            ("parent", |b| b[32..40].copy_from_slice(&3u64.to_le_bytes())),
            ("image size", |b| b[40..48].copy_from_slice(&(3 * 65536u64).to_le_bytes())),
            ("metadata index", |b| b[80 + 128 + 4] = 4),
            ("metadata order", |b| b[80 + 128 + 4] = 0),
        ];
        for (what, edit) in cases {
            let result = Manifest::decode(&resealed(bytes.clone(), edit));
            assert!(matches!(result, Err(ManifestError::Invalid(_))), "{what}: {result:?}");
        }
    }

    #[test]
    fn hostile_counts_are_refused_before_allocating() {
        let bytes = resealed(sample().encode(), |b| {
            b[64..72].copy_from_slice(&u64::MAX.to_le_bytes());
        });
        assert!(matches!(Manifest::decode(&bytes), Err(ManifestError::Length { .. })));
    }

    #[test]
    fn magic_version_and_length() {
        let bytes = sample().encode();
        assert_eq!(Manifest::decode(&bytes[..50]), Err(ManifestError::TooShort(50)));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(Manifest::decode(&bad), Err(ManifestError::BadMagic));
        let mut bad = bytes.clone();
        bad[8] = 2;
        assert_eq!(Manifest::decode(&bad), Err(ManifestError::UnsupportedVersion(2)));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(Manifest::decode(&long), Err(ManifestError::Length { .. })));
    }

    fn any_manifest() -> impl Strategy<Value = Manifest> {
        (12u32..=16, 9u32..=12, 1u64..64, 1u64..1000, any::<[u8; 16]>()).prop_flat_map(
            |(chunk_shift, block_shift, blocks, generation, uuid)| {
                let block_shift = block_shift.min(chunk_shift);
                let image_size = blocks << block_shift;
                let count = Manifest::chunk_count(image_size, 1 << chunk_shift) as usize;
                let chunk = prop_oneof![
                    Just(ChunkRef::Zero),
                    any::<[u8; 32]>().prop_filter("not zero", |h| *h != [0; 32]).prop_map(ChunkRef::Stored),
                ];
                (
                    proptest::collection::vec(chunk, count),
                    proptest::collection::btree_set(0..count as u32, 0..=count),
                    0..generation,
                )
                    .prop_map(move |(chunks, metadata, parent)| Manifest {
                        generation,
                        parent,
                        image_size,
                        chunk_size: 1 << chunk_shift,
                        block_size: 1 << block_shift,
                        uuid,
                        chunks,
                        metadata: metadata.into_iter().collect(),
                    })
            },
        )
    }

    proptest! {
        #[test]
        fn any_valid_manifest_round_trips(manifest in any_manifest()) {
            prop_assert_eq!(Manifest::decode(&manifest.encode()), Ok(manifest));
        }

        #[test]
        fn any_byte_flip_is_an_error(manifest in any_manifest(), at in any::<usize>(), bit in 0u8..8) {
            let mut bytes = manifest.encode();
            let at = at % bytes.len();
            bytes[at] ^= 1 << bit;
            prop_assert!(Manifest::decode(&bytes).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Manifest::decode(&bytes);
        }

        #[test]
        fn resealed_arbitrary_header_never_panics(
            manifest in any_manifest(),
            header in proptest::collection::vec(any::<u8>(), MANIFEST_HEADER_BYTES - 12),
        ) {
            // Past magic and version, any header with a valid checksum: only the field checks
            // stand between it and the engine.
            let bytes = resealed(manifest.encode(), |b| b[12..MANIFEST_HEADER_BYTES].copy_from_slice(&header));
            if let Ok(decoded) = Manifest::decode(&bytes) {
                prop_assert_eq!(decoded.check(), Ok(()));
            }
        }
    }
}

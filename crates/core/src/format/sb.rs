//! Superblock and the geometry derived from it. The superblock is written by mkfs only (a
//! copy sits in block 0 of every AG; AG 0's is the primary), so it never tears in use: the
//! moving parts (log tail) live in the log's own ping-pong header blocks.

use super::*;
use crate::error::{Error, Result};

pub const MAGIC_SB: u32 = 0x4646_5342; // "FFSB"
pub const VERSION: u32 = 1;
/// The smallest allocation group, in blocks (docs/SPEC.md §3.1).
pub const MIN_AG_BLOCKS: u64 = 256;
pub const MAX_AG_BLOCKS: u64 = 1 << 24; // 64 GiB
pub const MAX_AGS: u32 = 1 << 16;
pub const MIN_LOG_BLOCKS: u64 = 64;
/// Where the identity (uuid and label) lies. With the checksum, it is all the superblock
/// changes after mkfs (`tune`), and it lies in the first 512-byte sector, which the media
/// write atomically: a rewrite of the block leaves the old identity or the new, never a mix.
const UUID_OFFSET: usize = 80;
const LABEL_OFFSET: usize = 104;
/// The longest label, in bytes of UTF-8 (ext4 allows 16, XFS 12).
pub const LABEL_MAX: usize = 32;
/// The end of the identity fields: the bytes `tune` may change all lie below it.
pub const IDENTITY_END: usize = LABEL_OFFSET + LABEL_MAX;

/// The authoritative, validated description of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks of the whole image.
    pub block_count: u64,
    /// Allocation groups; all but the last have `ag_blocks` blocks.
    pub ag_count: u32,
    /// Blocks of each allocation group (the last may be shorter).
    pub ag_blocks: u64,
    /// Inode slots of each allocation group's inode table.
    pub inodes_per_ag: u32,
    /// Slots of each allocation group's orphan table.
    pub orphan_slots_per_ag: u32,
    /// Blocks of the log (in AG 0), its two header blocks included.
    pub log_blocks: u64,
}

/// The superblock as decoded and checked (docs/SPEC.md §4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The image's geometry.
    pub geo: Geometry,
    /// The image's identity: a random (version 4) UUID unless mkfs or tune was given one.
    pub uuid: [u8; 16],
    /// When mkfs wrote it, seconds since the epoch.
    pub mkfs_time: i64,
    /// The file system's name, "" for none: UTF-8 without NUL, at most [`LABEL_MAX`] bytes
    /// ([`check_label`]).
    pub label: String,
}

/// Why `label` cannot be a file system label, if it cannot.
pub fn check_label(label: &str) -> std::result::Result<(), &'static str> {
    if label.len() > LABEL_MAX {
        return Err("label longer than 32 bytes");
    }
    if label.contains('\0') {
        return Err("label holds a NUL byte");
    }
    Ok(())
}

/// Where each structure of one AG lives, in absolute block numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgLayout {
    pub agno: u32,
    pub start: u64,
    pub blocks: u64,
    pub header: u64,
    pub block_bitmap: u64,
    pub block_bitmap_blocks: u64,
    pub inode_bitmap: u64,
    pub inode_bitmap_blocks: u64,
    pub orphan_table: u64,
    pub orphan_blocks: u64,
    pub inode_table: u64,
    pub inode_table_blocks: u64,
    /// AG 0 only: the log (two header blocks, then the record area).
    pub log: u64,
    pub log_blocks: u64,
    /// First block available for data and B+tree nodes.
    pub data_start: u64,
}

impl Geometry {
    /// Blocks of the log's ring of records: the log less its header blocks.
    pub fn log_ring_blocks(&self) -> u64 {
        self.log_blocks - super::log::LOG_HEADER_BLOCKS
    }

    /// Where each structure of allocation group `agno` lives.
    pub fn ag_layout(&self, agno: u32) -> AgLayout {
        debug_assert!(agno < self.ag_count);
        let start = agno as u64 * self.ag_blocks;
        let blocks = (self.block_count - start).min(self.ag_blocks);
        let header = start + 1;
        let block_bitmap = header + 1;
        let block_bitmap_blocks = self.ag_blocks.div_ceil(BITMAP_BITS);
        let inode_bitmap = block_bitmap + block_bitmap_blocks;
        let inode_bitmap_blocks = (self.inodes_per_ag as u64).div_ceil(BITMAP_BITS);
        let orphan_table = inode_bitmap + inode_bitmap_blocks;
        let orphan_blocks = self.orphan_slots_per_ag as u64 / ORPHAN_SLOTS_PER_BLOCK;
        let inode_table = orphan_table + orphan_blocks;
        let inode_table_blocks = self.inodes_per_ag as u64 / INODES_PER_BLOCK;
        let log = inode_table + inode_table_blocks;
        let log_blocks = if agno == 0 { self.log_blocks } else { 0 };
        AgLayout {
            agno,
            start,
            blocks,
            header,
            block_bitmap,
            block_bitmap_blocks,
            inode_bitmap,
            inode_bitmap_blocks,
            orphan_table,
            orphan_blocks,
            inode_table,
            inode_table_blocks,
            log,
            log_blocks,
            data_start: log + log_blocks,
        }
    }

    /// Byte offset of an inode's 256-byte slot, or an error if the number is outside the image.
    pub fn inode_offset(&self, ino: u64) -> Result<u64> {
        let (ag, idx) = (ino_ag(ino), ino_index(ino));
        if ag >= self.ag_count || idx >= self.inodes_per_ag || ino == 0 {
            return Err(Error::corrupt("inode number", ino, "outside the image"));
        }
        let l = self.ag_layout(ag);
        Ok(l.inode_table * BLOCK_SIZE as u64 + idx as u64 * INODE_SIZE as u64)
    }

    /// The allocation group block `blkno` lies in.
    pub fn block_ag(&self, blkno: u64) -> u32 {
        (blkno / self.ag_blocks) as u32
    }

    /// Is `[blkno, blkno+len)` inside one AG's data area? (Untrusted extents are checked here.)
    pub fn is_data_range(&self, blkno: u64, len: u64) -> bool {
        if len == 0 || blkno >= self.block_count || blkno.checked_add(len).is_none_or(|e| e > self.block_count) {
            return false;
        }
        let l = self.ag_layout(self.block_ag(blkno));
        blkno >= l.data_start && blkno + len <= l.start + l.blocks
    }

    /// Inode slots of the whole image.
    pub fn total_inodes(&self) -> u64 {
        self.ag_count as u64 * self.inodes_per_ag as u64
    }

    /// Reject geometry no mkfs could have written: every later computation trusts it.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let g = self;
        if g.ag_count < 1 || g.ag_count > MAX_AGS {
            return Err(format!("ag count {} out of range", g.ag_count));
        }
        if g.ag_blocks < MIN_AG_BLOCKS || g.ag_blocks > MAX_AG_BLOCKS {
            return Err(format!("ag size {} blocks out of range", g.ag_blocks));
        }
        let full = (g.ag_count as u64 - 1).checked_mul(g.ag_blocks).ok_or("ag geometry overflows")?;
        if g.block_count <= full || g.block_count - full < MIN_AG_BLOCKS || g.block_count - full > g.ag_blocks {
            return Err(format!("block count {} does not match {} AGs of {}", g.block_count, g.ag_count, g.ag_blocks));
        }
        if g.inodes_per_ag == 0 || !(g.inodes_per_ag as u64).is_multiple_of(INODES_PER_BLOCK) {
            return Err(format!("inodes per ag {} not a positive multiple of {}", g.inodes_per_ag, INODES_PER_BLOCK));
        }
        if g.orphan_slots_per_ag == 0 || !(g.orphan_slots_per_ag as u64).is_multiple_of(ORPHAN_SLOTS_PER_BLOCK) {
            return Err(format!(
                "orphan slots per ag {} not a positive multiple of {}",
                g.orphan_slots_per_ag, ORPHAN_SLOTS_PER_BLOCK
            ));
        }
        if g.log_blocks < MIN_LOG_BLOCKS || g.log_blocks > g.ag_blocks / 2 {
            return Err(format!("log size {} blocks out of range", g.log_blocks));
        }
        for agno in [0, g.ag_count - 1] {
            let l = g.ag_layout(agno);
            if l.data_start + 16 > l.start + l.blocks {
                return Err(format!("ag {} metadata does not fit its {} blocks", agno, l.blocks));
            }
        }
        Ok(())
    }
}

impl Superblock {
    /// The superblock as written at block `blkno` (the primary at 0, a copy in each AG).
    pub fn encode(&self, blkno: u64) -> Box<[u8; BLOCK_SIZE]> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        let g = &self.geo;
        init_header(&mut b[..], MAGIC_SB, blkno, 0);
        put_u32(&mut b[..], 32, VERSION);
        put_u32(&mut b[..], 36, BLOCK_SIZE as u32);
        put_u64(&mut b[..], 40, g.block_count);
        put_u32(&mut b[..], 48, g.ag_count);
        put_u32(&mut b[..], 52, INODE_SIZE as u32);
        put_u64(&mut b[..], 56, g.ag_blocks);
        put_u32(&mut b[..], 64, g.inodes_per_ag);
        put_u32(&mut b[..], 68, g.orphan_slots_per_ag);
        put_u64(&mut b[..], 72, g.log_blocks);
        put_u64(&mut b[..], 96, self.mkfs_time as u64);
        put_identity(&mut b[..], &self.uuid, &self.label);
        debug_assert_eq!(
            Superblock::decode(&b[..], blkno).ok().as_ref(),
            Some(self),
            "superblock changed in its encoding"
        );
        b
    }

    /// Whether `older` is this file system's superblock from before it grew: the same in every
    /// field but the size (fewer blocks, perhaps fewer AGs). A copy a grow had yet to rewrite
    /// when it stopped (docs/SPEC.md §4).
    pub fn grew_from(&self, older: &Superblock) -> bool {
        let mut resized = self.clone();
        resized.geo.block_count = older.geo.block_count;
        resized.geo.ag_count = older.geo.ag_count;
        resized == *older && older.geo.block_count < self.geo.block_count
    }

    /// Decode and check the superblock read from block `blkno`: checksum, version, sizes
    /// and a geometry mkfs could have written (docs/SPEC.md §3.3).
    pub fn decode(b: &[u8], blkno: u64) -> Result<Superblock> {
        verify_block(b, "superblock", MAGIC_SB, blkno, Some(0))?;
        let bad = |d: String| Error::corrupt("superblock", blkno, d);
        if get_u32(b, 32) != VERSION {
            return Err(bad(format!("unsupported version {}", get_u32(b, 32))));
        }
        if get_u32(b, 36) != BLOCK_SIZE as u32 || get_u32(b, 52) != INODE_SIZE as u32 {
            return Err(bad("unsupported block or inode size".into()));
        }
        let geo = Geometry {
            block_count: get_u64(b, 40),
            ag_count: get_u32(b, 48),
            ag_blocks: get_u64(b, 56),
            inodes_per_ag: get_u32(b, 64),
            orphan_slots_per_ag: get_u32(b, 68),
            log_blocks: get_u64(b, 72),
        };
        geo.validate().map_err(bad)?;
        Ok(Superblock {
            geo,
            uuid: b[UUID_OFFSET..UUID_OFFSET + 16].try_into().unwrap(),
            mkfs_time: get_u64(b, 96) as i64,
            label: decode_label(&b[LABEL_OFFSET..LABEL_OFFSET + LABEL_MAX]).map_err(|e| bad(e.into()))?,
        })
    }
}

/// Write `uuid` and `label` into the superblock block `b` and seal it: everything `tune`
/// changes, all of it in the first sector.
pub fn put_identity(b: &mut [u8], uuid: &[u8; 16], label: &str) {
    debug_assert_eq!(check_label(label), Ok(()));
    b[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(uuid);
    b[LABEL_OFFSET..IDENTITY_END].fill(0);
    b[LABEL_OFFSET..LABEL_OFFSET + label.len()].copy_from_slice(label.as_bytes());
    seal_block(b, 0);
}

/// The label field: UTF-8 padded with zeros (all zeros, as on images made before labels: none).
fn decode_label(field: &[u8]) -> std::result::Result<String, &'static str> {
    let len = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    if field[len..].iter().any(|&c| c != 0) {
        return Err("label holds a NUL byte");
    }
    let label = std::str::from_utf8(&field[..len]).map_err(|_| "label is not UTF-8")?;
    Ok(label.to_string())
}

//! Shared on-disk constants and the self-describing header every metadata block carries.
//! docs/SPEC.md is the prose form of this file and of `format/`.

use crate::error::{Error, Result};

/// Bytes of a block: the unit of allocation, I/O and logging (docs/SPEC.md §3.1).
pub const BLOCK_SIZE: usize = 4096;

/// Every metadata block starts with this 32-byte header (little-endian):
/// `magic u32 | crc32c u32 | blkno u64 | owner u64 | lsn u64`.
/// The crc covers the whole block with the crc field taken as zero. `blkno` catches
/// misdirected writes, `owner` (AG number or inode number) catches cross-linked blocks,
/// `lsn` is the checkpoint sequence that last logged the block.
pub const HDR_SIZE: usize = 32;

pub const MAGIC_AGH: u32 = 0x4646_4147; // "FFAG"
pub const MAGIC_BITMAP: u32 = 0x4646_424d; // "FFBM"
pub const MAGIC_ORPHAN: u32 = 0x4646_4f52; // "FFOR"
pub const MAGIC_BTREE: u32 = 0x4646_4254; // "FFBT"
pub const MAGIC_DATA_META: u32 = 0x4646_444d; // "FFDM" (symlink target / xattr value block)

pub fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// crc32c of `b` with the 4 bytes at `crc_off` taken as zero.
pub fn crc_with_hole(b: &[u8], crc_off: usize) -> u32 {
    let c = crc32c::crc32c(&b[..crc_off]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &b[crc_off + 4..])
}

/// Write a fresh header into a block that is being initialised in memory.
pub fn init_header(block: &mut [u8], magic: u32, blkno: u64, owner: u64) {
    debug_assert_eq!(block.len(), BLOCK_SIZE);
    block[..HDR_SIZE].fill(0);
    put_u32(block, 0, magic);
    put_u64(block, 8, blkno);
    put_u64(block, 16, owner);
}

pub fn header_magic(block: &[u8]) -> u32 {
    get_u32(block, 0)
}
pub fn header_owner(block: &[u8]) -> u64 {
    get_u64(block, 16)
}
pub fn header_lsn(block: &[u8]) -> u64 {
    get_u64(block, 24)
}

/// Stamp the lsn and the checksum; done once per block image, when it is written to the log
/// or to its home location, never on the in-memory hot path.
pub fn seal_block(block: &mut [u8], lsn: u64) {
    put_u64(block, 24, lsn);
    let crc = crc_with_hole(block, 4);
    put_u32(block, 4, crc);
}

/// Check a block read from the device: checksum, magic, self address and (if given) owner.
/// Every byte from disk is untrusted; this is the first gate.
pub fn verify_block(block: &[u8], what: &'static str, magic: u32, blkno: u64, owner: Option<u64>) -> Result<()> {
    if block.len() != BLOCK_SIZE {
        return Err(Error::corrupt(what, blkno, "short block"));
    }
    let stored = get_u32(block, 4);
    if crc_with_hole(block, 4) != stored {
        return Err(Error::corrupt(what, blkno, "checksum mismatch"));
    }
    if get_u32(block, 0) != magic {
        return Err(Error::corrupt(what, blkno, format!("bad magic {:#x}", get_u32(block, 0))));
    }
    if get_u64(block, 8) != blkno {
        return Err(Error::corrupt(what, blkno, format!("block claims to be {}", get_u64(block, 8))));
    }
    if let Some(o) = owner {
        if get_u64(block, 16) != o {
            return Err(Error::corrupt(what, blkno, format!("owner {} expected {}", get_u64(block, 16), o)));
        }
    }
    Ok(())
}

/// Whether `block`, read from block `blkno`, is a verified B+tree node (directory, extent map
/// or xattr tree) or metadata data block (symlink target, xattr value): what a reader that
/// fetches an image lazily (a published one) wants before file data.
pub fn is_index_block(block: &[u8], blkno: u64) -> bool {
    let magic = header_magic(block);
    matches!(magic, MAGIC_BTREE | MAGIC_DATA_META) && verify_block(block, "index block", magic, blkno, None).is_ok()
}

pub mod inode;
pub mod log;
pub mod sb;

pub use inode::{DiskInode, Extent, Fork, INODE_SIZE};
pub use sb::{AgLayout, Geometry, Superblock};

/// Bits of a bitmap block after its header.
pub const BITMAP_BITS: u64 = ((BLOCK_SIZE - HDR_SIZE) * 8) as u64;
/// Orphan slots (u64 inode numbers) in an orphan table block after its header.
pub const ORPHAN_SLOTS_PER_BLOCK: u64 = ((BLOCK_SIZE - HDR_SIZE) / 8) as u64;
pub const INODES_PER_BLOCK: u64 = (BLOCK_SIZE / INODE_SIZE) as u64;
/// The longest name of a directory entry, in bytes (docs/SPEC.md §3.1).
pub const NAME_MAX: usize = 255;
/// The largest extended attribute value, Linux's `XATTR_SIZE_MAX` (docs/SPEC.md §3.1, §14).
pub const XATTR_VALUE_MAX: usize = 65536;

/// Inode numbers carry their AG in the high 32 bits: `ino = agno << 32 | index`. Index 0 of
/// AG 0 is never used, so 0 is "no inode" and the root is inode 1 (FUSE's root id).
pub const ROOT_INO: u64 = 1;

pub fn ino_ag(ino: u64) -> u32 {
    (ino >> 32) as u32
}
pub fn ino_index(ino: u64) -> u32 {
    ino as u32
}
pub fn make_ino(agno: u32, index: u32) -> u64 {
    (agno as u64) << 32 | index as u64
}

/// The AG header block: static geometry of one allocation group. Free counts are not kept
/// here: they are derived from the bitmaps at mount (so no commit ever logs this block).
pub mod agh {
    use super::*;
    pub const AGNO: usize = 32;
    pub const BLOCKS: usize = 40;
    pub const INODES: usize = 48;
    pub const ORPHAN_SLOTS: usize = 52;

    pub fn build(blkno: u64, agno: u32, blocks: u64, inodes: u32, orphan_slots: u32) -> Box<[u8; BLOCK_SIZE]> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        init_header(&mut b[..], MAGIC_AGH, blkno, agno as u64);
        put_u32(&mut b[..], AGNO, agno);
        put_u64(&mut b[..], BLOCKS, blocks);
        put_u32(&mut b[..], INODES, inodes);
        put_u32(&mut b[..], ORPHAN_SLOTS, orphan_slots);
        b
    }

    /// Whether a header's `blocks` fits an AG the superblock gives `layout_blocks`: equal, or
    /// fewer (but at least an AG's minimum) in the header of an AG that was the short last
    /// one before the file system grew, which the grow had yet to rewrite when it stopped
    /// (docs/SPEC.md §5). The superblock is authoritative either way.
    pub fn blocks_fit(header_blocks: u64, layout_blocks: u64) -> bool {
        header_blocks == layout_blocks || (sb::MIN_AG_BLOCKS..layout_blocks).contains(&header_blocks)
    }
}

//! Grow a file system that is not mounted (`ferrofs grow`), in xfs_growfs's order: the last AG
//! grows to a full one (its bitmap already has room for `ag_blocks` bits, docs/SPEC.md §3.5),
//! then whole new AGs follow, written by mkfs's own code. AGs keep their size, so every block
//! and inode number keeps its meaning.
//!
//! The primary superblock is the commit point (docs/DESIGN.md, "Growing"): the new AGs are
//! written and flushed first, past the end the old superblock gives the file system, where
//! nothing reads them; then the primary; then the header of the AG that was the short last
//! one, and the superblock copies of the old AGs. A crash before the primary leaves the old
//! file system; after it, the new one, with blocks a reader knows as left by a grow
//! (`agh::blocks_fit`, `Superblock::grew_from`) until this code or `fsck -y` rewrites them.
//!
//! ```
//! use ferrofs::{dev::MemDevice, grow, mkfs, MkfsOptions};
//!
//! let small = MemDevice::new(64 << 20);
//! let opts = MkfsOptions { ag_count: Some(4), ..MkfsOptions::default() };
//! mkfs::mkfs(&small, &opts, &|_, _| {})?;
//! let mut bytes = small.to_bytes();
//! bytes.resize(96 << 20, 0); // the image file, made 32 MiB longer
//! let dev = MemDevice::from_bytes(&bytes);
//! let sb = grow::grow(&dev, 96 << 20, &|done, total| eprintln!("AG {done} of {total}"))?;
//! assert_eq!((sb.geo.ag_count, sb.geo.block_count), (6, (96 << 20) / 4096));
//! # Ok::<(), ferrofs::Error>(())
//! ```

use crate::dev::{BlockDevice, SECTOR_SIZE};
use crate::error::{Error, Result};
use crate::format::sb::{MAX_AGS, MIN_AG_BLOCKS};
use crate::format::{
    agh, seal_block, verify_block, Geometry, Superblock, BITMAP_BITS, BLOCK_SIZE, HDR_SIZE, MAGIC_AGH, MAGIC_BITMAP,
};
use crate::journal::recover;
use crate::mkfs;
use crate::mount::read_superblock;

const BS: u64 = BLOCK_SIZE as u64;

/// The geometry `old` grows into on a device of `size` bytes: AGs of the same size, the last
/// one filled up first, then new ones. A tail too short for an AG and its metadata stays
/// unused, as xfs_growfs leaves it. [`Error::Geometry`] says why when that would shrink the
/// file system, add nothing to it, or take more than `MAX_AGS` AGs.
pub fn plan(old: &Geometry, size: u64) -> Result<Geometry> {
    let old_bytes = old.block_count * BS;
    if size / BS < old.block_count {
        return Err(Error::Geometry(format!(
            "{size} bytes is smaller than the file system ({old_bytes} bytes): ferrofs cannot shrink"
        )));
    }
    if size / BS == old.block_count {
        return Err(Error::Geometry(format!("the file system already has {old_bytes} bytes: nothing to grow")));
    }
    let most = old.ag_blocks * MAX_AGS as u64;
    if size / BS > most {
        return Err(Error::Geometry(format!(
            "{size} bytes is more than the file system can grow to: at most {} bytes ({MAX_AGS} allocation \
             groups of {} bytes)",
            most * BS,
            old.ag_blocks * BS
        )));
    }
    let with_tail = sized(old, size / BS);
    let geo = match with_tail.validate() {
        Ok(()) => with_tail,
        // The tail cannot hold a new AG's metadata: the AGs before it are the most that fits.
        Err(_) => sized(old, (with_tail.ag_count as u64 - 1) * old.ag_blocks),
    };
    if geo.block_count <= old.block_count {
        let smallest = smallest_new_ag(old) * BS;
        return Err(Error::Geometry(format!(
            "{size} bytes adds no usable space: a new allocation group needs at least {smallest} bytes \
             (the file system is {old_bytes} bytes, so at least {} in all)",
            old_bytes + smallest
        )));
    }
    geo.validate().map_err(Error::Geometry)?;
    debug_assert!(geo.ag_count >= old.ag_count && geo.block_count > old.block_count);
    Ok(geo)
}

/// `old` with `block_count` blocks, in as many AGs of `old.ag_blocks` as that takes.
fn sized(old: &Geometry, block_count: u64) -> Geometry {
    Geometry { block_count, ag_count: block_count.div_ceil(old.ag_blocks) as u32, ..*old }
}

/// Blocks of the shortest AG that can follow `old`'s AGs: its metadata and 16 data blocks
/// (docs/SPEC.md §3.3).
fn smallest_new_ag(old: &Geometry) -> u64 {
    let next = Geometry { ag_count: old.ag_count + 1, ..*old };
    let l = next.ag_layout(old.ag_count);
    (l.data_start - l.start + 16).max(MIN_AG_BLOCKS)
}

/// The file system on `dev` and what growing it to `size` bytes makes of it, without writing:
/// fails as [`grow`] would before it writes (a log to replay, a size that shrinks or adds
/// nothing). `size` may be larger than `dev` (an image file yet to be extended).
pub fn check(dev: &dyn BlockDevice, size: u64) -> Result<(Superblock, Geometry)> {
    let sb = read_superblock(dev)?;
    // resize2fs's rule: a journal that needs recovery is replayed first (e2fsck, or a mount).
    let pending = recover(dev, &sb.geo, false)?.records;
    if pending > 0 {
        return Err(Error::Busy(format!(
            "its log holds {pending} records not yet written home (it was not unmounted cleanly); \
             replay them first (fsck or a mount)"
        )));
    }
    let geo = plan(&sb.geo, size)?;
    check_last_ag_tail(dev, &sb.geo)?;
    Ok((sb, geo))
}

/// The bits past the end of the last AG are what its new blocks will be marked with: they
/// must be clear, as they are on every image fsck passes (docs/SPEC.md §6), or those blocks
/// would be in use by nothing.
fn check_last_ag_tail(dev: &dyn BlockDevice, old: &Geometry) -> Result<()> {
    let l = old.ag_layout(old.ag_count - 1);
    let mut b = vec![0u8; BLOCK_SIZE];
    for i in 0..l.block_bitmap_blocks {
        let (blkno, first) = (l.block_bitmap + i, i * BITMAP_BITS);
        dev.read_at(&mut b, blkno * BS)?;
        verify_block(&b, "bitmap", MAGIC_BITMAP, blkno, Some(l.agno as u64))?;
        let past_end = l.blocks.max(first) - first..old.ag_blocks.min(first + BITMAP_BITS).saturating_sub(first);
        if past_end.clone().any(|bit| b[HDR_SIZE + (bit / 8) as usize] >> (bit % 8) & 1 == 1) {
            let why = "bits past the end of the last AG are set (run fsck first)";
            return Err(Error::corrupt("bitmap", blkno, why));
        }
    }
    Ok(())
}

/// Grow the file system on `dev`, which must not be mounted, to `size` bytes of it (see
/// [`plan`]); returns the new superblock. `progress(done, total)` is called once per new AG.
/// A crash at any point leaves either the old or the new file system, each one that mounts and
/// checks clean.
pub fn grow(dev: &dyn BlockDevice, size: u64, progress: &dyn Fn(u64, u64)) -> Result<Superblock> {
    if size > dev.size() {
        return Err(Error::Geometry(format!("{size} bytes asked of a device of {} bytes", dev.size())));
    }
    let (old, geo) = check(dev, size)?;
    let new = Superblock { geo, ..old.clone() };
    let added = geo.ag_count - old.geo.ag_count;
    for agno in old.geo.ag_count..geo.ag_count {
        mkfs::write_ag(dev, &new, agno)?;
        progress((agno - old.geo.ag_count + 1) as u64, added as u64);
    }
    dev.flush()?;
    // The commit point. It cannot tear into a third state: the fields that change (and the
    // checksum) lie in its first sector, and a sector is written whole (docs/DESIGN.md).
    let (before, after) = (old.encode(0), new.encode(0));
    debug_assert_eq!(before[SECTOR_SIZE as usize..], after[SECTOR_SIZE as usize..]);
    dev.write_at(&after[..], 0)?;
    dev.flush()?;
    finish(dev, &new)?;
    Ok(new)
}

/// Bring every old AG up to date with the new superblock `sb`: the header of the AG that was
/// the short last one, and the superblock copies. Each was written by mkfs (or an earlier grow)
/// and is checked as a reader would before it is replaced.
fn finish(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let geo = &sb.geo;
    let mut b = vec![0u8; BLOCK_SIZE];
    for agno in 0..geo.ag_count {
        let l = geo.ag_layout(agno);
        dev.read_at(&mut b, l.header * BS)?;
        verify_block(&b, "AG header", MAGIC_AGH, l.header, Some(agno as u64))?;
        if crate::format::get_u64(&b, agh::BLOCKS) != l.blocks {
            let mut header = agh::build(l.header, agno, l.blocks, geo.inodes_per_ag, geo.orphan_slots_per_ag);
            seal_block(&mut header[..], 0);
            dev.write_at(&header[..], l.header * BS)?;
        }
        if agno > 0 {
            dev.read_at(&mut b, l.start * BS)?;
            if Superblock::decode(&b, l.start).is_ok_and(|copy| sb.grew_from(&copy)) {
                dev.write_at(&sb.encode(l.start)[..], l.start * BS)?;
            }
        }
    }
    dev.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(block_count: u64, ag_blocks: u64) -> Geometry {
        let g = Geometry {
            block_count,
            ag_count: block_count.div_ceil(ag_blocks) as u32,
            ag_blocks,
            inodes_per_ag: 1024,
            orphan_slots_per_ag: 508,
            log_blocks: 64,
        };
        g.validate().unwrap();
        g
    }

    /// The short last AG fills up first, then whole AGs follow; a tail too short for an AG's
    /// metadata is left out, and a size that adds nothing or shrinks is refused, saying why.
    #[test]
    fn plans_fill_the_last_ag_then_add_whole_ones() {
        let old = geo(4096 + 1000, 4096);
        assert_eq!(plan(&old, (4096 + 1001) * BS).unwrap(), geo(4096 + 1001, 4096), "one block more");
        assert_eq!(plan(&old, 3 * 4096 * BS).unwrap(), geo(3 * 4096, 4096));
        assert_eq!(plan(&old, (3 * 4096 + 300) * BS).unwrap(), geo(3 * 4096 + 300, 4096), "a new short AG");
        assert_eq!(plan(&old, (2 * 4096 + 10) * BS).unwrap(), geo(2 * 4096, 4096), "a tail too short");
        assert_eq!(plan(&old, (3 * 4096 + 300) * BS + 17).unwrap().block_count, 3 * 4096 + 300, "whole blocks");
        let full = geo(2 * 4096, 4096);
        let err = plan(&full, (2 * 4096 + 20) * BS).unwrap_err().to_string();
        assert!(err.contains("adds no usable space") && err.contains("at least"), "{err}");
        assert!(plan(&full, 4096 * BS).unwrap_err().to_string().contains("cannot shrink"));
        assert!(plan(&full, 2 * 4096 * BS + 100).unwrap_err().to_string().contains("nothing to grow"));
        let most = plan(&full, MAX_AGS as u64 * 4096 * BS).unwrap();
        assert_eq!((most.ag_count, most.block_count), (MAX_AGS, MAX_AGS as u64 * 4096), "at most MAX_AGS");
        let err = plan(&full, u64::MAX).unwrap_err().to_string();
        assert!(err.contains("more than the file system can grow to"), "{err}");
    }
}

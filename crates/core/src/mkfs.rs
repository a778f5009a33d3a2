//! Make a file system: choose the geometry, write every AG's static metadata, the log
//! headers and the root directory. Everything mkfs writes is sealed like any other block.
//!
//! ```
//! use ferrofs::{dev::MemDevice, mkfs, MkfsOptions};
//!
//! let dev = MemDevice::new(64 << 20);
//! let opts = MkfsOptions { ag_count: Some(4), ..MkfsOptions::default() };
//! let planned = mkfs::plan(64 << 20, &opts)?; // what mkfs would make, nothing written
//! let sb = mkfs::mkfs(&dev, &opts, &|done, total| eprintln!("AG {done} of {total}"))?;
//! assert_eq!(sb.geo, planned);
//! # Ok::<(), ferrofs::Error>(())
//! ```

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::inode::{Timespec, S_IFDIR};
use crate::format::log::LogHeader;
/// The smallest allocation group, in blocks: a device smaller than this holds no file system.
pub use crate::format::sb::MIN_AG_BLOCKS;
use crate::format::sb::{MAX_AGS, MIN_LOG_BLOCKS};
use crate::format::*;

/// What to make: the geometry's free choices and the root directory's owner.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Number of allocation groups; default: one per GiB, at least 4 (parallel creators).
    pub ag_count: Option<u32>,
    /// One inode per this many bytes of space (default 8 KiB).
    pub bytes_per_inode: u64,
    /// Log size in blocks; default: 1/32 of the image, between 2 MiB and 256 MiB.
    pub log_blocks: Option<u64>,
    /// Orphan slots: one per this many inodes (default 8).
    pub inodes_per_orphan_slot: u64,
    /// Owner and permission bits of the root directory (mke2fs `-E root_owner`).
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
    /// Permission bits of the root directory (0o755 by default).
    pub root_mode: u16,
    /// The file system's label (mke2fs `-L`), "" for none; see [`check_label`](crate::check_label).
    pub label: String,
    /// The file system's UUID (mke2fs `-U`); default: a random one (version 4).
    pub uuid: Option<[u8; 16]>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            ag_count: None,
            bytes_per_inode: 8192,
            log_blocks: None,
            inodes_per_orphan_slot: 8,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
            label: String::new(),
            uuid: None,
        }
    }
}

fn round_up(v: u64, m: u64) -> u64 {
    v.div_ceil(m) * m
}

/// Choose and validate a geometry for a device of `size` bytes: what [`mkfs`] would make,
/// or [`Error::Geometry`] naming the limit the options or the size break.
pub fn plan(size: u64, o: &MkfsOptions) -> Result<Geometry> {
    let block_count = size / BLOCK_SIZE as u64;
    if block_count < MIN_AG_BLOCKS {
        return Err(Error::Geometry(format!(
            "{size} bytes is less than one allocation group ({MIN_AG_BLOCKS} blocks of {BLOCK_SIZE} bytes)"
        )));
    }
    let ag_count = o.ag_count.unwrap_or_else(|| (block_count / (1 << 18)).clamp(4, 1024) as u32).clamp(1, MAX_AGS);
    let ag_count = ag_count.min((block_count / (MIN_AG_BLOCKS * 4)).max(1) as u32);
    let ag_blocks = block_count.div_ceil(ag_count as u64);
    // The last AG must not be tiny: drop it into its neighbour by recomputing the count.
    let ag_count = block_count.div_ceil(ag_blocks) as u32;
    if o.bytes_per_inode < INODE_SIZE as u64 || o.inodes_per_orphan_slot == 0 {
        return Err(Error::Invalid("inode density or orphan ratio out of range"));
    }
    let inodes_per_ag =
        round_up((ag_blocks * BLOCK_SIZE as u64 / o.bytes_per_inode).clamp(64, u32::MAX as u64 / 2), INODES_PER_BLOCK);
    let orphan_slots_per_ag = round_up((inodes_per_ag / o.inodes_per_orphan_slot).max(1), ORPHAN_SLOTS_PER_BLOCK);
    // min/max, not clamp: on a device too small for any log, validate() below says so.
    let log_blocks =
        o.log_blocks.unwrap_or((block_count / 32).clamp(512, 65536)).min(ag_blocks / 2).max(MIN_LOG_BLOCKS);
    let geo = Geometry {
        block_count,
        ag_count,
        ag_blocks,
        inodes_per_ag: inodes_per_ag as u32,
        orphan_slots_per_ag: orphan_slots_per_ag as u32,
        log_blocks,
    };
    geo.validate().map_err(Error::Geometry)?;
    Ok(geo)
}

pub(crate) fn now() -> Timespec {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

/// Write a new file system over whatever `dev` holds, and return its superblock.
/// `progress(done, total)` is called once per AG.
pub fn mkfs(dev: &dyn BlockDevice, o: &MkfsOptions, progress: &dyn Fn(u64, u64)) -> Result<Superblock> {
    let geo = plan(dev.size(), o)?;
    sb::check_label(&o.label).map_err(Error::Invalid)?;
    let t = now();
    let uuid = o.uuid.unwrap_or_else(|| uuid::Uuid::new_v4().into_bytes());
    let sb = Superblock { geo, uuid, mkfs_time: t.sec, label: o.label.clone() };
    for agno in 0..geo.ag_count {
        write_ag(dev, &sb, agno)?;
        progress(agno as u64 + 1, geo.ag_count as u64);
    }
    write_log(dev, &geo)?;
    write_root(dev, &geo, o, t)?;
    dev.flush()?;
    Ok(sb)
}

fn write_block(dev: &dyn BlockDevice, blkno: u64, b: &mut [u8]) -> Result<()> {
    if header_magic(b) != sb::MAGIC_SB {
        seal_block(b, 0);
    }
    dev.write_at(b, blkno * BLOCK_SIZE as u64)?;
    Ok(())
}

fn bitmap_block(blkno: u64, agno: u32, first_bit: u64, used_below: u64) -> Box<[u8; BLOCK_SIZE]> {
    let mut b = Box::new([0u8; BLOCK_SIZE]);
    init_header(&mut b[..], MAGIC_BITMAP, blkno, agno as u64);
    for i in first_bit..used_below.min(first_bit + BITMAP_BITS) {
        let rel = i - first_bit;
        b[HDR_SIZE + (rel / 8) as usize] |= 1 << (rel % 8);
    }
    b
}

/// Write AG `agno`'s superblock copy, header, bitmaps and orphan table (not its inode table:
/// a slot is read only once its bitmap bit is set, and its first write is whole). Also what
/// a grow writes into each new AG.
pub(crate) fn write_ag(dev: &dyn BlockDevice, sb: &Superblock, agno: u32) -> Result<()> {
    let geo = &sb.geo;
    let l = geo.ag_layout(agno);
    dev.write_at(&sb.encode(l.start)[..], l.start * BLOCK_SIZE as u64)?;
    write_block(
        dev,
        l.header,
        &mut agh::build(l.header, agno, l.blocks, geo.inodes_per_ag, geo.orphan_slots_per_ag)[..],
    )?;
    let meta = l.data_start - l.start;
    for i in 0..l.block_bitmap_blocks {
        write_block(dev, l.block_bitmap + i, &mut bitmap_block(l.block_bitmap + i, agno, i * BITMAP_BITS, meta)[..])?;
    }
    // AG 0: inode 0 is never used (0 means "no inode"), inode 1 is the root.
    let used_inodes = if agno == 0 { 2 } else { 0 };
    for i in 0..l.inode_bitmap_blocks {
        write_block(
            dev,
            l.inode_bitmap + i,
            &mut bitmap_block(l.inode_bitmap + i, agno, i * BITMAP_BITS, used_inodes)[..],
        )?;
    }
    for i in 0..l.orphan_blocks {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        init_header(&mut b[..], MAGIC_ORPHAN, l.orphan_table + i, agno as u64);
        write_block(dev, l.orphan_table + i, &mut b[..])?;
    }
    Ok(())
}

fn write_log(dev: &dyn BlockDevice, geo: &Geometry) -> Result<()> {
    let l = geo.ag_layout(0);
    for gen in 0..2u64 {
        let h = LogHeader { gen, epoch: 1, tail_off: 0, tail_seq: 1 };
        dev.write_at(&h.encode(l.log + gen)[..], (l.log + gen) * BLOCK_SIZE as u64)?;
    }
    // Zero the first ring block so no stale record from an earlier file system replays.
    dev.write_at(&[0u8; BLOCK_SIZE], (l.log + 2) * BLOCK_SIZE as u64)?;
    // The log is written over and over for the file system's life: allocate its storage
    // once here rather than on each record's first pass (a sparse image file, or one on a
    // host file system, would otherwise allocate inside fsync's latency).
    dev.preallocate(l.log * BLOCK_SIZE as u64, geo.log_blocks * BLOCK_SIZE as u64)?;
    Ok(())
}

fn write_root(dev: &dyn BlockDevice, geo: &Geometry, o: &MkfsOptions, t: Timespec) -> Result<()> {
    let mut root = DiskInode::new(S_IFDIR | (o.root_mode & 0o7777), o.root_uid, o.root_gid, t, 1);
    root.nlink = 2;
    root.parent = ROOT_INO;
    let mut img = [0u8; INODE_SIZE];
    root.encode(ROOT_INO, 0, &mut img);
    dev.write_at(&img, geo.inode_offset(ROOT_INO)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    /// Each image gets its own random version 4 UUID (they once shared a time-based prefix and
    /// ended in zeros), or the one asked for; and the label asked for.
    #[test]
    fn uuids_are_random_v4_unless_given() {
        let made = |o: &MkfsOptions| mkfs(&MemDevice::new(4 << 20), o, &|_, _| {}).unwrap();
        let (a, b) = (made(&MkfsOptions::default()), made(&MkfsOptions::default()));
        assert_ne!(a.uuid[..8], b.uuid[..8]);
        for sb in [&a, &b] {
            let u = uuid::Uuid::from_bytes(sb.uuid);
            assert_eq!((u.get_version_num(), u.get_variant()), (4, uuid::Variant::RFC4122), "{u}");
            assert_eq!(sb.label, "");
        }
        let given = made(&MkfsOptions { uuid: Some([9; 16]), label: "données".into(), ..MkfsOptions::default() });
        assert_eq!((given.uuid, given.label.as_str()), ([9; 16], "données"));
        let long = MkfsOptions { label: "l".repeat(sb::LABEL_MAX + 1), ..MkfsOptions::default() };
        let e = mkfs(&MemDevice::new(4 << 20), &long, &|_, _| {}).unwrap_err();
        assert!(e.to_string().contains("label longer than 32 bytes"), "{e}");
    }

    /// Images made before labels hold zeros there: no label. A label field that is not UTF-8
    /// or has bytes after its NUL padding is a damaged superblock.
    #[test]
    fn the_label_field_decodes_strictly() {
        let sb = mkfs(&MemDevice::new(4 << 20), &MkfsOptions::default(), &|_, _| {}).unwrap();
        let mut b = sb.encode(0);
        assert!(b[104..136].iter().all(|&c| c == 0), "no label is all zeros, as on old images");
        for (field, why) in [(&b"\xff\xfe"[..], "not UTF-8"), (b"ab\0c", "NUL")] {
            b[104..104 + field.len()].copy_from_slice(field);
            seal_block(&mut b[..], 0);
            let e = Superblock::decode(&b[..], 0).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
    }

    /// Every size, from nothing up to a few AGs, with any AG count, plans or says why: never
    /// a panic.
    #[test]
    fn plan_fails_cleanly_on_small_devices() {
        for size in (0..4 << 20).step_by(60_000) {
            for ag_count in [None, Some(1), Some(3), Some(1000)] {
                let o = MkfsOptions { ag_count, ..MkfsOptions::default() };
                match plan(size, &o) {
                    Ok(g) => assert!(g.validate().is_ok() && g.block_count * BLOCK_SIZE as u64 <= size),
                    Err(e) => assert_eq!(e.errno(), libc::EINVAL, "{e}"),
                }
            }
        }
        assert!(plan(100 << 10, &MkfsOptions::default())
            .unwrap_err()
            .to_string()
            .contains("less than one allocation group"));
    }
}

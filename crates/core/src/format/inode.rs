//! The 256-byte on-disk inode and its decoded in-memory form. An inode is logged as its own
//! item (not as part of its table block), so it carries its own checksum, number and lsn.

use super::*;
use crate::error::{Error, Result};

/// Bytes of one on-disk inode (docs/SPEC.md §9).
pub const INODE_SIZE: usize = 256;
pub const MAGIC_INODE: u16 = 0x4e49; // "IN"
pub const INODE_VERSION: u8 = 1;
pub const FORK_OFF: usize = 144;
pub const FORK_SIZE: usize = 64;
pub const XATTR_INLINE_OFF: usize = FORK_OFF + FORK_SIZE;
pub const XATTR_INLINE_SIZE: usize = INODE_SIZE - XATTR_INLINE_OFF;
pub const INLINE_EXTENTS: usize = FORK_SIZE / 16;
pub const EXTENT_LEN_MAX: u32 = (1 << 15) - 1;
/// Largest file: 2^44 blocks (64 PiB) keeps every block offset arithmetic far from overflow
/// (docs/SPEC.md §3.1, §10: `lblk + len` ≤ 2^44).
pub const MAX_FILE_BLOCKS: u64 = 1 << 44;
/// Hard links per inode (docs/SPEC.md §3.1, §9.3): every call that adds a link enforces it,
/// and loading an inode with more is corruption.
pub const LINK_MAX: u32 = 65_000;
/// Longest symlink target in bytes (docs/SPEC.md §3.1, §9.2): one block, less a NUL.
pub const SYMLINK_MAX: usize = 4095;
const PBLK_MASK: u64 = (1 << 48) - 1;

const FORK_EMPTY: u8 = 0;
const FORK_EXTENTS: u8 = 1;
const FORK_BTREE: u8 = 2;
const FORK_INLINE: u8 = 3;
const FORK_DEVICE: u8 = 4;

/// Packed to 12 bytes: four of them sit in every cached inode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, packed(4))]
pub struct Timespec {
    /// Seconds since the epoch (negative before it).
    pub sec: i64,
    /// Nanoseconds within the second, below 10^9.
    pub nsec: u32,
}

/// A run of file blocks: `len` blocks from file block `lblk` live at device block `pblk`.
/// `unwritten` extents are allocated but read as zeros (fallocate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    pub lblk: u64,
    pub pblk: u64,
    pub len: u32,
    pub unwritten: bool,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.lblk + self.len as u64
    }
    /// The 8-byte value stored after the key (`lblk`) in an extent B+tree or inline slot.
    pub fn pack_value(&self) -> u64 {
        debug_assert!(self.len >= 1 && self.len <= EXTENT_LEN_MAX && self.pblk <= PBLK_MASK);
        self.pblk | (self.len as u64) << 48 | (self.unwritten as u64) << 63
    }
    pub fn unpack(lblk: u64, v: u64) -> Extent {
        Extent { lblk, pblk: v & PBLK_MASK, len: ((v >> 48) & 0x7fff) as u32, unwritten: v >> 63 == 1 }
    }
}

/// What the 64-byte data fork holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fork {
    /// No data (empty file, empty directory).
    Empty,
    /// Up to four extents, sorted by `lblk`.
    Extents { n: u8, ext: [Extent; INLINE_EXTENTS] },
    /// Root block of a B+tree (directory entries, or extents of a file with more than four).
    Btree(u64),
    /// A short symlink target.
    Inline { len: u8, bytes: [u8; FORK_SIZE] },
    /// Character or block device number.
    Device(u64),
}

/// The decoded inode. Kept in memory as the authoritative copy; encoded when logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskInode {
    pub mode: u16,
    pub flags: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// 0 = not on the orphan list; otherwise slot index + 1 in this inode's AG orphan table.
    pub orphan_slot: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub btime: Timespec,
    pub generation: u32,
    /// Directories: the parent directory (".."); other inodes: 0.
    pub parent: u64,
    /// Root of the xattr B+tree, 0 if all xattrs are inline.
    pub xattr_root: u64,
    pub fork: Fork,
    pub xattr_inline: XattrArea,
}

/// The inode's inline xattr area. In memory it is allocated only while it holds something:
/// most inodes have no xattrs, and the bytes saved are per cached inode.
#[derive(Clone, Debug, Default)]
pub struct XattrArea(Option<Box<[u8; XATTR_INLINE_SIZE]>>);

/// Equal when the bytes are: an allocated area left all zeros is the same area as none, as
/// on disk.
impl PartialEq for XattrArea {
    fn eq(&self, other: &XattrArea) -> bool {
        self.bytes() == other.bytes()
    }
}
impl Eq for XattrArea {}

static EMPTY_XATTR_AREA: [u8; XATTR_INLINE_SIZE] = [0; XATTR_INLINE_SIZE];

impl XattrArea {
    pub fn from_bytes(b: &[u8; XATTR_INLINE_SIZE]) -> XattrArea {
        XattrArea(b.iter().any(|&x| x != 0).then(|| Box::new(*b)))
    }

    pub fn bytes(&self) -> &[u8; XATTR_INLINE_SIZE] {
        self.0.as_deref().unwrap_or(&EMPTY_XATTR_AREA)
    }

    pub fn bytes_mut(&mut self) -> &mut [u8; XATTR_INLINE_SIZE] {
        self.0.get_or_insert_with(|| Box::new([0; XATTR_INLINE_SIZE]))
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }
}

pub const S_IFMT: u16 = 0o170000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFIFO: u16 = 0o010000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_ISGID: u16 = 0o2000;

pub fn valid_file_type(mode: u16) -> bool {
    matches!(mode & S_IFMT, S_IFDIR | S_IFREG | S_IFLNK | S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK)
}

impl DiskInode {
    pub fn new(mode: u16, uid: u32, gid: u32, now: Timespec, generation: u32) -> DiskInode {
        debug_assert!(valid_file_type(mode));
        DiskInode {
            mode,
            flags: 0,
            uid,
            gid,
            nlink: 1,
            orphan_slot: 0,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            generation,
            parent: 0,
            xattr_root: 0,
            fork: Fork::Empty,
            xattr_inline: XattrArea::default(),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }

    /// Count `delta` blocks gained (B+tree nodes, mapped extents) or given back. The count
    /// comes from disk, so one that would drop below zero is corruption of inode `ino`.
    pub fn add_blocks(&mut self, ino: u64, delta: i64) -> Result<()> {
        self.blocks = self.blocks.checked_add_signed(delta).ok_or_else(|| {
            Error::corrupt("inode", ino, format!("block count {} cannot change by {}", self.blocks, delta))
        })?;
        Ok(())
    }

    /// One link fewer (a subdirectory's ".." going away). A directory with subdirectories has
    /// at least three links, so running out is corruption of inode `ino`.
    pub fn drop_dir_link(&mut self, ino: u64) -> Result<()> {
        self.nlink = self
            .nlink
            .checked_sub(1)
            .ok_or_else(|| Error::corrupt("inode", ino, "link count below its subdirectories"))?;
        Ok(())
    }

    pub fn encode(&self, ino: u64, lsn: u64, out: &mut [u8; INODE_SIZE]) {
        out.fill(0);
        put_u16(out, 0, MAGIC_INODE);
        out[2] = INODE_VERSION;
        put_u64(out, 8, ino);
        put_u64(out, 16, lsn);
        put_u32(out, 24, self.generation);
        put_u16(out, 28, self.mode);
        put_u16(out, 30, self.flags);
        put_u32(out, 32, self.uid);
        put_u32(out, 36, self.gid);
        put_u32(out, 40, self.nlink);
        put_u32(out, 44, self.orphan_slot);
        put_u64(out, 48, self.size);
        put_u64(out, 56, self.blocks);
        for (i, t) in [self.atime, self.mtime, self.ctime, self.btime].iter().enumerate() {
            put_u64(out, 64 + 8 * i, t.sec as u64);
            put_u32(out, 96 + 4 * i, t.nsec);
        }
        put_u64(out, 112, self.parent);
        put_u64(out, 120, self.xattr_root);
        let (fmt, len) = self.encode_fork(&mut out[FORK_OFF..FORK_OFF + FORK_SIZE]);
        out[3] = fmt;
        out[128] = len;
        out[XATTR_INLINE_OFF..].copy_from_slice(self.xattr_inline.bytes());
        let crc = crc_with_hole(out, 4);
        put_u32(out, 4, crc);
        debug_assert_eq!(Self::parse(out).as_ref(), Ok(self), "inode {ino} changed in its encoding");
    }

    fn encode_fork(&self, f: &mut [u8]) -> (u8, u8) {
        match &self.fork {
            Fork::Empty => (FORK_EMPTY, 0),
            Fork::Extents { n, ext } => {
                for (i, e) in ext[..*n as usize].iter().enumerate() {
                    put_u64(f, 16 * i, e.lblk);
                    put_u64(f, 16 * i + 8, e.pack_value());
                }
                (FORK_EXTENTS, *n)
            }
            Fork::Btree(root) => {
                put_u64(f, 0, *root);
                (FORK_BTREE, 0)
            }
            Fork::Inline { len, bytes } => {
                f.copy_from_slice(bytes);
                (FORK_INLINE, *len)
            }
            Fork::Device(rdev) => {
                put_u64(f, 0, *rdev);
                (FORK_DEVICE, 0)
            }
        }
    }

    /// The lsn an encoded image was sealed with (`seal`): the record it was logged in.
    pub fn sealed_lsn(img: &[u8]) -> u64 {
        get_u64(img, 16)
    }

    /// Re-stamp the lsn of an encoded image and its checksum (at checkpoint time).
    pub fn seal(img: &mut [u8], lsn: u64) {
        debug_assert_eq!(img.len(), INODE_SIZE);
        put_u64(img, 16, lsn);
        let crc = crc_with_hole(img, 4);
        put_u32(img, 4, crc);
    }

    /// Decode and validate an inode image read from disk or from the log. Checks everything a
    /// later code path would otherwise trust: checksum, self number, type, fork contents.
    pub fn decode(b: &[u8; INODE_SIZE], ino: u64, geo: &Geometry) -> Result<DiskInode> {
        let bad = |d: String| Error::corrupt("inode", ino, d);
        if get_u16(b, 0) != MAGIC_INODE || b[2] != INODE_VERSION {
            return Err(bad("bad magic or version".into()));
        }
        if crc_with_hole(b, 4) != get_u32(b, 4) {
            return Err(bad("checksum mismatch".into()));
        }
        if get_u64(b, 8) != ino {
            return Err(bad(format!("inode claims to be {}", get_u64(b, 8))));
        }
        let mode = get_u16(b, 28);
        if !valid_file_type(mode) {
            return Err(bad(format!("invalid mode {:o}", mode)));
        }
        let di = Self::parse(b).map_err(bad)?;
        if let Fork::Btree(root) = di.fork {
            if !geo.is_data_range(root, 1) {
                return Err(bad(format!("B+tree root {} outside the data area", root)));
            }
        }
        di.check_shape(geo).map_err(bad)?;
        Ok(di)
    }

    /// The fields of an inode image, with no check but that its fork format and length are
    /// ones it could hold: `decode` checks the rest, and `encode` parses its own output back.
    fn parse(b: &[u8; INODE_SIZE]) -> std::result::Result<DiskInode, String> {
        let ts = |i: usize| Timespec { sec: get_u64(b, 64 + 8 * i) as i64, nsec: get_u32(b, 96 + 4 * i) };
        Ok(DiskInode {
            mode: get_u16(b, 28),
            flags: get_u16(b, 30),
            uid: get_u32(b, 32),
            gid: get_u32(b, 36),
            nlink: get_u32(b, 40),
            orphan_slot: get_u32(b, 44),
            size: get_u64(b, 48),
            blocks: get_u64(b, 56),
            atime: ts(0),
            mtime: ts(1),
            ctime: ts(2),
            btime: ts(3),
            generation: get_u32(b, 24),
            parent: get_u64(b, 112),
            xattr_root: get_u64(b, 120),
            fork: Self::parse_fork(b[3], b[128], &b[FORK_OFF..FORK_OFF + FORK_SIZE])?,
            xattr_inline: XattrArea::from_bytes(b[XATTR_INLINE_OFF..].try_into().unwrap()),
        })
    }

    fn parse_fork(fmt: u8, len: u8, f: &[u8]) -> std::result::Result<Fork, String> {
        match fmt {
            FORK_EMPTY => Ok(Fork::Empty),
            FORK_EXTENTS => {
                if len == 0 || len as usize > INLINE_EXTENTS {
                    return Err(format!("{} inline extents", len));
                }
                let mut ext = [Extent::default(); INLINE_EXTENTS];
                for (i, e) in ext[..len as usize].iter_mut().enumerate() {
                    *e = Extent::unpack(get_u64(f, 16 * i), get_u64(f, 16 * i + 8));
                }
                Ok(Fork::Extents { n: len, ext })
            }
            FORK_BTREE => Ok(Fork::Btree(get_u64(f, 0))),
            FORK_INLINE => {
                if len as usize > FORK_SIZE {
                    return Err(format!("inline data of {} bytes", len));
                }
                Ok(Fork::Inline { len, bytes: f.try_into().unwrap() })
            }
            FORK_DEVICE => Ok(Fork::Device(get_u64(f, 0))),
            _ => Err(format!("unknown fork format {}", fmt)),
        }
    }

    /// Structural invariants shared by decode (untrusted input) and encode-time assertions.
    pub fn check_shape(&self, geo: &Geometry) -> std::result::Result<(), String> {
        if let Fork::Extents { n, ext } = &self.fork {
            let mut prev_end = 0u64;
            for e in &ext[..*n as usize] {
                // `lblk` is untrusted: compare without computing `end()`, which could overflow.
                if e.len == 0
                    || e.lblk < prev_end
                    || e.lblk > MAX_FILE_BLOCKS - e.len as u64
                    || !geo.is_data_range(e.pblk, e.len as u64)
                {
                    return Err(format!("bad extent {:?}", e));
                }
                // Only fallocate makes unwritten extents, and only on regular files: a
                // symlink's target is always written data.
                if e.unwritten && self.mode & S_IFMT != S_IFREG {
                    return Err(format!("unwritten extent {:?} in a non-regular file", e));
                }
                prev_end = e.end();
            }
        }
        let fits = matches!(
            (&self.fork, self.mode & S_IFMT),
            (Fork::Empty, _)
                | (Fork::Extents { .. }, S_IFREG | S_IFLNK)
                | (Fork::Btree(_), S_IFREG | S_IFDIR | S_IFLNK)
                | (Fork::Inline { .. }, S_IFLNK)
                | (Fork::Device(_), S_IFCHR | S_IFBLK)
        );
        if !fits {
            return Err(format!("fork {:?} does not fit mode {:o}", self.fork, self.mode));
        }
        if self.xattr_root != 0 && !geo.is_data_range(self.xattr_root, 1) {
            return Err(format!("xattr root {} outside the data area", self.xattr_root));
        }
        if !xattr_inline_valid(self.xattr_inline.bytes()) {
            return Err("inline xattr list overruns its area".into());
        }
        if self.orphan_slot > geo.orphan_slots_per_ag {
            return Err(format!("orphan slot {} out of range", self.orphan_slot));
        }
        if self.atime.nsec >= 1_000_000_000 || self.mtime.nsec >= 1_000_000_000 || self.ctime.nsec >= 1_000_000_000 {
            return Err("nanoseconds out of range".into());
        }
        Ok(())
    }

    /// Bounds on the counts the engine does arithmetic on, checked when it loads an inode:
    /// `blocks` by the device, and from below by the inline extents it includes; `size` by
    /// the largest file; `nlink` by the limit every call that adds a link enforces. Not part
    /// of `check_shape`, because fsck decodes inodes whose counts are wrong in order to
    /// recount and fix them.
    pub fn check_counts(&self, geo: &Geometry) -> std::result::Result<(), String> {
        if self.blocks > geo.block_count {
            return Err(format!("block count {} larger than the device", self.blocks));
        }
        if let Fork::Extents { n, ext } = &self.fork {
            let mapped: u64 = ext[..*n as usize].iter().map(|e| e.len as u64).sum();
            if mapped > self.blocks {
                return Err(format!("block count {} below the {} blocks of its extents", self.blocks, mapped));
            }
        }
        if self.size > MAX_FILE_BLOCKS * BLOCK_SIZE as u64 {
            return Err(format!("size {} out of range", self.size));
        }
        if self.nlink > LINK_MAX {
            return Err(format!("link count {} out of range", self.nlink));
        }
        Ok(())
    }
}

/// The inline xattr list (`name_len u8 | value_len u8 | name | value`, ended by a zero
/// name length or the end of the area) stays inside its 48 bytes, and no name holds a NUL
/// (no caller could ask for it by name).
pub fn xattr_inline_valid(a: &[u8; XATTR_INLINE_SIZE]) -> bool {
    let mut at = 0;
    while at + 2 <= a.len() && a[at] != 0 {
        let name = at + 2..at + 2 + a[at] as usize;
        at = name.end + a[at + 1] as usize;
        if at > a.len() || a[name].contains(&0) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_xattr_lists_are_checked() {
        let mut a = [0u8; XATTR_INLINE_SIZE];
        assert!(xattr_inline_valid(&a), "an empty list");
        a[..6].copy_from_slice(&[2, 2, b'a', b'b', 1, 2]);
        assert!(xattr_inline_valid(&a), "one entry");
        a[3] = 0;
        assert!(!xattr_inline_valid(&a), "a NUL in a name (found by the corruption sweep)");
        a[3] = b'b';
        a[7] = XATTR_INLINE_SIZE as u8;
        a[6] = 1;
        assert!(!xattr_inline_valid(&a), "an entry overrunning the area");
    }

    #[test]
    fn an_inode_survives_its_encoding() {
        let mut di = DiskInode::new(S_IFREG | 0o644, 1, 2, Timespec { sec: -3, nsec: 4 }, 5);
        let mut ext = [Extent::default(); INLINE_EXTENTS];
        ext[0] = Extent { lblk: 7, pblk: 300, len: 2, unwritten: true };
        di.fork = Fork::Extents { n: 1, ext };
        di.xattr_inline.bytes_mut()[..4].copy_from_slice(&[1, 1, b'a', b'b']);
        let mut img = [0; INODE_SIZE];
        di.encode(9, 10, &mut img);
        assert_eq!(DiskInode::parse(&img), Ok(di.clone()));
        // An area emptied in place is no area, as on disk.
        di.xattr_inline.bytes_mut().fill(0);
        di.encode(9, 10, &mut img);
        assert_eq!(DiskInode::parse(&img).unwrap().xattr_inline, XattrArea::default());
    }

    /// Debug builds check every encoding against its parse: a fork no image can hold is caught
    /// where it is encoded, not when it is read back after a crash.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "changed in its encoding")]
    fn an_encoding_that_loses_the_fork_is_caught() {
        let mut di = DiskInode::new(S_IFREG | 0o644, 0, 0, Timespec::default(), 1);
        di.fork = Fork::Extents { n: 0, ext: [Extent::default(); INLINE_EXTENTS] };
        di.encode(9, 0, &mut [0; INODE_SIZE]);
    }
}

//! Offline consistency check and repair (`ferrofs fsck`), with e2fsck's exit codes.
//!
//! # What is trusted
//! The superblock (or its backup), the log, the directory tree reachable from the root and the
//! orphan tables are the primary records. Everything else is derived from them and checked
//! against what they imply: allocation bitmaps, link counts, directory sizes, inode block
//! counts, `..` pointers, entry file types, AG headers and superblock copies.
//!
//! # Passes
//! 1. Superblock: the primary decodes (else the backup is used) and agrees with the copies
//!    (when the copies in AG 1 and AG 2 agree with each other and not with it, they win);
//!    every AG's copy matches the one used.
//! 2. Log: replayed first, as a mount would: onto the device when repairing, into memory
//!    otherwise (`-n` never writes).
//! 3. AG metadata: every AG header, bitmap and orphan-table block verifies (checksum, magic,
//!    self address, owner); a header's geometry matches the superblock.
//! 4. Tree walk from the root, iterative: each directory is scanned once, so a second name for
//!    one (a hard-linked directory, or a cycle) is an error, never a loop. Every reachable
//!    inode decodes and has its entry's file type; a directory's `..` is the directory naming
//!    it and its size is its entry count; names are valid and sit in their hash range; every
//!    B+tree passes `btree::check`; extents are sorted, disjoint and inside data areas; an
//!    inode's `blocks` is the data blocks plus tree nodes it owns.
//! 5. Orphan tables: a slot names an allocated inode of its AG whose `orphan_slot` points
//!    back; an inode that says it is on a slot is named by it.
//! 6. Disconnected inodes: allocated (by a verified bitmap block), decodable, with links, but
//!    reached by no name and no slot. They go into /lost+found (xfs_repair's phase 6).
//! 7. Directory changes found by 4-6 are applied (phase 5 of xfs_repair: rebuilds need free
//!    blocks, known only now).
//! 8. Link counts: one per name, or 2 + subdirectories for a directory; 0 for an orphan no
//!    name reaches.
//! 9. Inode bitmaps against the live inodes (reachable, or pending on an orphan list).
//! 10. Block ownership: AG metadata, the log and everything live inodes own. A block claimed
//!     twice is a cross-link (a data extent's is found as it is claimed); the block bitmaps
//!     must match the claims exactly.
//!
//! # Repair
//! The checker always builds the repaired image in memory, so `-n` reports exactly what a
//! repair would do; with `repair` it then writes it (blocks resealed, inodes re-encoded; see
//! `write_repairs` for the order that keeps a crash repairable). Fixed: bitmaps (rebuilt from
//! the claims, freeing leaks and marking in-use blocks and inodes), link counts, directory
//! sizes, `blocks`, `..`, symlink sizes, bad orphan slots and slot fields, entries naming
//! nothing, malformed entries, invalid, misplaced (outside their hash range) and duplicate
//! names (removed), entries with the wrong file type (retyped), extra names of a directory
//! (removed), AG headers and superblock copies (rebuilt from the superblock), bitmap and orphan
//! blocks that fail verification (rebuilt), and a log that cannot be replayed (reset: whatever
//! it held is lost). Damaged structures, as e2fsck and xfs_repair treat them:
//! - an inode that fails verification, or a file whose data map (extent, extent-tree node) or
//!   symlink target does, is cleared: zeroed and freed, its entries removed, its blocks freed;
//! - an xattr tree or record that fails loses the inode its tree-held xattrs, not the inode;
//! - a directory tree that fails is rebuilt from the entries of the leaves still reachable
//!   through nodes that verify (`btree::salvage`); the other entries are gone;
//! - a root inode that fails is recreated empty;
//! - an unlinked directory (on an orphan list) that still has entries loses them;
//! - an inode left without a name by any of these (or by damage to its entry) is reconnected
//!   as `/lost+found/#<ino>` (made, mode 0700, if missing), a detached directory with all it
//!   holds. An inode with no links and no orphan slot is leaked and freed;
//! - a data extent whose blocks another inode claimed first gets a copy of them (e2fsck's
//!   pass 1D): which of the two is damaged cannot be told, so both keep what they hold.
//!
//! Left alone, exit 4: a B+tree node claimed twice (a cross-link no copy can settle).
//!
//! An entry naming an inode the inode bitmap calls free is trusted when the inode decodes: the
//! bitmap is the derived record. If it does not decode, or its slot is all zeros (never
//! written, whatever the bitmap says: what a lost checkpoint leaves), the entry names nothing
//! and goes. Freed inodes keep their old images, so only an inode a verified bitmap block
//! marks in use is ever reconnected.
//!
//! # Orphans
//! An inode on an orphan list was unlinked while open, or was being truncated, at the crash.
//! The next read-write mount finishes the job with the engine's own journaled code, so fsck
//! reports valid orphans as notes, not errors, and leaves them even when repairing (doing the
//! job here would duplicate that code without a journal). Their blocks count as in use.
//!
//! # Bounds
//! Geometry is validated before it sizes anything and every other count read from disk is
//! checked before use. Memory is proportional to the metadata present: one bit per block and
//! inode, a few words per live inode and per extent or tree node. B+trees are at most
//! `btree::MAX_DEPTH` deep; the walk visits each inode once; at most [`MAX_MESSAGES`] messages
//! are kept (the counts stay exact). Corrupt input yields findings, never a panic; only device
//! errors and an unreadable superblock end a check early (an `Err`: exit 8).

use std::collections::btree_map::Entry as MapEntry;
use std::collections::{hash_map, BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::ops::Range;

use parking_lot::Mutex;

use crate::btree::{self, NodeStore};
use crate::buf::{Block, Buf, BufRef};
use crate::dev::BlockDevice;
use crate::dir;
use crate::error::{Error, Result};
use crate::format::inode::{MAX_FILE_BLOCKS, SYMLINK_MAX, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK};
use crate::format::log::{LogHeader, LOG_HEADER_BLOCKS};
use crate::format::{
    self, agh, ino_ag, ino_index, make_ino, AgLayout, DiskInode, Extent, Fork, Geometry, Superblock, BITMAP_BITS, BLOCK_SIZE, HDR_SIZE, INODE_SIZE,
    MAGIC_AGH, MAGIC_BITMAP, MAGIC_BTREE, MAGIC_DATA_META, MAGIC_ORPHAN, NAME_MAX, ORPHAN_SLOTS_PER_BLOCK, ROOT_INO,
};
use crate::journal;
use crate::mkfs;
use crate::mount;
use crate::xattr;

/// Most messages a report keeps; later ones are counted, not stored.
pub const MAX_MESSAGES: usize = 1000;

/// Where disconnected inodes are reconnected, in the root.
const LOST_FOUND: &[u8] = b"lost+found";
/// Suffixes tried when a name the repair adds is taken.
const NAME_TRIES: u32 = 100;

/// Exit codes, e2fsck's bits: 5 means some errors were fixed and some were left.
pub const EXIT_CLEAN: i32 = 0;
pub const EXIT_FIXED: i32 = 1;
pub const EXIT_UNCORRECTED: i32 = 4;
/// `check` returned an error: the device failed, or no superblock could be read.
pub const EXIT_OPERATIONAL: i32 = 8;

const BS: u64 = BLOCK_SIZE as u64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsckOptions {
    /// Write the repairs. `false` is `-n`: the device is never written, not even by log replay.
    pub repair: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsckReport {
    pub errors_found: u64,
    /// Errors repaired; always 0 without `repair`.
    pub errors_fixed: u64,
    /// One finding per line: errors ("inode 7: nlink 3 but 2 names", tagged "[fixed]" or
    /// "[not fixed]" when repairing) and notes ("note: ..."). At most [`MAX_MESSAGES`] plus a
    /// last line counting the ones left out.
    pub messages: Vec<String>,
    /// Live inodes: reachable from the root, or pending on an orphan list.
    pub inodes: u64,
    /// Reachable directories, the root included.
    pub dirs: u64,
    /// Blocks in use: AG metadata, the log and everything live inodes own.
    pub blocks_used: u64,
    pub log_records_replayed: u64,
}

impl FsckReport {
    /// e2fsck's convention: 0 clean, bit 1 errors fixed, bit 4 errors left. ([`EXIT_OPERATIONAL`]
    /// is for a `check` that returned an error.)
    pub fn exit_code(&self) -> i32 {
        let mut code = EXIT_CLEAN;
        if self.errors_fixed > 0 {
            code |= EXIT_FIXED;
        }
        if self.errors_found > self.errors_fixed {
            code |= EXIT_UNCORRECTED;
        }
        code
    }

    pub fn is_clean(&self) -> bool {
        self.errors_found == 0
    }
}

/// Check the image on `dev`, and repair it if `opts.repair`. `progress(phase, done, total)`
/// reports advancement. `dev` is a plain reference, not the `Arc` that `dev::OverlayDevice`
/// wants: `-n` replays the log into a private overlay instead. Returns `Err` only for an
/// operational failure (device I/O, no usable superblock); findings go into the report.
pub fn check(dev: &dyn BlockDevice, opts: &FsckOptions, progress: &dyn Fn(&str, u64, u64)) -> Result<FsckReport> {
    let sb = trusted_superblock(dev)?;
    let overlay = ReplayOverlay::new(dev);
    let view: &dyn BlockDevice = if opts.repair { dev } else { &overlay };
    let mut c = Checker::new(view, sb, opts.repair, progress);
    c.check_primary_superblock()?;
    c.replay_log()?;
    c.check_ags()?;
    c.walk_tree()?;
    c.check_orphans()?;
    c.reconnect()?;
    c.check_orphan_fields()?; // of every live inode, the reconnected ones too
    c.apply_changes()?;
    c.check_link_counts()?;
    c.check_inode_maps()?;
    c.check_block_maps()?;
    if opts.repair {
        c.write_repairs()?;
    }
    Ok(c.into_report())
}

/// The superblock a mount would use, unless its copies in AG 1 and AG 2 agree with each other
/// and not with it: then the primary's checksum is valid over damaged fields, and the copies
/// win (check_primary_superblock rewrites it).
fn trusted_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let sb = mount::read_superblock(dev)?;
    let mut b = Box::new([0u8; BLOCK_SIZE]);
    dev.read_at(&mut b[..], 0)?;
    let Some(copy) = mount::backup_superblock(dev, &b[..]).filter(|c| *c != sb && c.geo.ag_count > 2) else {
        return Ok(sb);
    };
    let second = 2 * copy.geo.ag_blocks;
    dev.read_at(&mut b[..], second * BS)?;
    Ok(if Superblock::decode(&b[..], second).is_ok_and(|c| c == copy) { copy } else { sb })
}

// ---------------------------------------------------------------------------------------------
// Findings

#[derive(Default)]
struct Findings {
    messages: Vec<String>,
    unshown: u64,
    errors: u64,
    fixable: u64,
    repair: bool,
}

impl Findings {
    /// An error the repair fixes; the caller registers the fix in the same step.
    fn fixable(&mut self, msg: impl fmt::Display) {
        self.error(true, msg);
    }

    /// An error the repair leaves alone.
    fn unfixable(&mut self, msg: impl fmt::Display) {
        self.error(false, msg);
    }

    fn error(&mut self, fixable: bool, msg: impl fmt::Display) {
        self.errors += 1;
        self.fixable += u64::from(fixable);
        let outcome = match (self.repair, fixable) {
            (false, _) => "",
            (true, true) => " [fixed]",
            (true, false) => " [not fixed]",
        };
        self.push(format!("{msg}{outcome}"));
    }

    /// Something worth saying that is not an error (a pending orphan, a replayed log).
    fn note(&mut self, msg: impl fmt::Display) {
        self.push(format!("note: {msg}"));
    }

    fn push(&mut self, msg: String) {
        if self.messages.len() < MAX_MESSAGES {
            self.messages.push(msg);
        } else {
            self.unshown += 1;
        }
    }
}

/// Device I/O failures end the check; any other error is a finding about the image.
fn finding(e: Error) -> Result<Error> {
    match e {
        Error::Io(_) => Err(e),
        other => Ok(other),
    }
}

/// A verification failure's text, without the engine's "corrupt X at block N" framing.
fn detail(e: &Error) -> String {
    match e {
        Error::Corrupt { detail, .. } => detail.clone(),
        other => other.to_string(),
    }
}

/// A B+tree failure: which node, and what is wrong with it.
fn node_detail(e: &Error) -> String {
    match e {
        Error::Corrupt { block, detail, .. } => format!("node {block}: {detail}"),
        other => other.to_string(),
    }
}

fn blocks_desc(start: u64, len: u64) -> String {
    match len {
        1 => format!("block {start}"),
        _ => format!("blocks {}-{}", start, start + len - 1),
    }
}

/// "1 name", "2 names".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The 4-bit type a directory entry stores for an inode of this mode.
fn ftype_of(mode: u16) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}

fn kind_name(mode: u16) -> &'static str {
    match mode & S_IFMT {
        S_IFDIR => "directory",
        S_IFREG => "regular file",
        S_IFLNK => "symlink",
        S_IFCHR => "character device",
        S_IFBLK => "block device",
        S_IFIFO => "fifo",
        S_IFSOCK => "socket",
        _ => "inode of unknown type",
    }
}

/// Read and decode an inode; returns it with the lsn its image carries.
fn read_inode(dev: &dyn BlockDevice, geo: &Geometry, ino: u64) -> Result<(DiskInode, u64)> {
    let mut img = [0u8; INODE_SIZE];
    dev.read_at(&mut img, geo.inode_offset(ino)?)?;
    Ok((DiskInode::decode(&img, ino, geo)?, format::get_u64(&img, 16)))
}

// ---------------------------------------------------------------------------------------------
// Device access: the `-n` overlay and the B+tree node stores

/// Where `-n` replays the log: recovery's writes land in memory and reads see them, so the
/// check sees the recovered image while the device is never written.
struct ReplayOverlay<'a> {
    dev: &'a dyn BlockDevice,
    blocks: Mutex<HashMap<u64, Box<Block>>>,
}

impl<'a> ReplayOverlay<'a> {
    fn new(dev: &'a dyn BlockDevice) -> Self {
        ReplayOverlay { dev, blocks: Mutex::new(HashMap::new()) }
    }
}

/// The per-block pieces of a byte range: (block, offset in the block, range in the buffer).
fn block_pieces(off: u64, len: usize) -> impl Iterator<Item = (u64, usize, Range<usize>)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        (at < len).then(|| {
            let pos = off + at as u64;
            let in_block = (pos % BS) as usize;
            let n = (BLOCK_SIZE - in_block).min(len - at);
            let piece = (pos / BS, in_block, at..at + n);
            at += n;
            piece
        })
    })
}

impl BlockDevice for ReplayOverlay<'_> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.dev.read_at(buf, off)?;
        let blocks = self.blocks.lock();
        for (blkno, in_block, piece) in block_pieces(off, buf.len()) {
            if let Some(b) = blocks.get(&blkno) {
                let n = piece.len();
                buf[piece].copy_from_slice(&b[in_block..in_block + n]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > self.size()) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write past the end of the device"));
        }
        let mut blocks = self.blocks.lock();
        for (blkno, in_block, piece) in block_pieces(off, buf.len()) {
            let b = match blocks.entry(blkno) {
                hash_map::Entry::Occupied(e) => e.into_mut(),
                hash_map::Entry::Vacant(e) => {
                    let mut b = Box::new([0u8; BLOCK_SIZE]);
                    self.dev.read_at(&mut b[..], blkno * BS)?;
                    e.insert(b)
                }
            };
            b[in_block..in_block + piece.len()].copy_from_slice(&buf[piece]);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.dev.size()
    }
}

/// Read-only access to one inode's B+tree nodes, verified as the engine verifies them: the
/// pointer lies in a data area, and checksum, magic, self address and owner all match.
struct DevStore<'a> {
    dev: &'a dyn BlockDevice,
    geo: &'a Geometry,
    owner: u64,
}

impl<'a> DevStore<'a> {
    fn new(dev: &'a dyn BlockDevice, geo: &'a Geometry, owner: u64) -> Self {
        DevStore { dev, geo, owner }
    }
}

impl NodeStore for DevStore<'_> {
    fn read_node(&mut self, blkno: u64) -> Result<BufRef> {
        if !self.geo.is_data_range(blkno, 1) {
            return Err(Error::corrupt("btree node", blkno, "pointer outside the data area"));
        }
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        self.dev.read_at(&mut b[..], blkno * BS)?;
        format::verify_block(&b[..], "btree node", MAGIC_BTREE, blkno, Some(self.owner))?;
        Ok(Buf::new(blkno, b))
    }
    fn new_node(&mut self) -> Result<BufRef> {
        Err(Error::ReadOnly)
    }
    fn free_node(&mut self, _blkno: u64) -> Result<()> {
        Err(Error::ReadOnly)
    }
    fn dirty(&mut self, _buf: &BufRef) {
        debug_assert!(false, "fsck changed a node through a read-only store");
    }
    fn owner(&self) -> u64 {
        self.owner
    }
}

/// An inode's tree under repair (a directory, or an extent map whose extent moves to its
/// copy): each node is read once, then edited in memory; new nodes come from the blocks
/// nothing claims. The repair writes the edited and new nodes and
/// releases the freed ones.
struct EditStore<'a, 'f> {
    dev: DevStore<'a>,
    free: &'f mut FreeBlocks,
    nodes: HashMap<u64, BufRef>,
    dirty: BTreeSet<u64>,
    freed: Vec<u64>,
    fresh: Vec<u64>,
}

impl<'a, 'f> EditStore<'a, 'f> {
    fn new(dev: DevStore<'a>, free: &'f mut FreeBlocks) -> Self {
        EditStore { dev, free, nodes: HashMap::new(), dirty: BTreeSet::new(), freed: Vec::new(), fresh: Vec::new() }
    }
}

impl NodeStore for EditStore<'_, '_> {
    fn read_node(&mut self, blkno: u64) -> Result<BufRef> {
        if let Some(b) = self.nodes.get(&blkno) {
            return Ok(b.clone());
        }
        let b = self.dev.read_node(blkno)?;
        self.nodes.insert(blkno, b.clone());
        Ok(b)
    }
    fn new_node(&mut self) -> Result<BufRef> {
        let blkno = self.free.take_run(self.dev.geo, 1).ok_or(Error::NoSpace)?;
        let b = Buf::new(blkno, Box::new([0u8; BLOCK_SIZE]));
        self.nodes.insert(blkno, b.clone());
        self.fresh.push(blkno);
        Ok(b)
    }
    fn free_node(&mut self, blkno: u64) -> Result<()> {
        self.freed.push(blkno);
        Ok(())
    }
    fn dirty(&mut self, buf: &BufRef) {
        self.dirty.insert(buf.blkno);
    }
    fn owner(&self) -> u64 {
        self.dev.owner
    }
}

/// The blocks a repair may give new tree nodes: data-area blocks nothing claims.
struct FreeBlocks {
    used: BitSet,
    /// Where the next search starts: blocks are handed out in order.
    next: u64,
}

impl FreeBlocks {
    /// The first of `len` free blocks in a row (in one AG's data area: AGs begin with metadata).
    fn take_run(&mut self, geo: &Geometry, len: u64) -> Option<u64> {
        let mut run = 0;
        for b in self.next..geo.block_count {
            run = if self.used.get(b) || !geo.is_data_range(b, 1) { 0 } else { run + 1 };
            if run == len {
                let start = b + 1 - len;
                (start..=b).for_each(|x| self.used.insert(x));
                self.next = b + 1;
                return Some(start);
            }
        }
        None
    }
}

/// A name for `base` that directory `dir` does not hold yet (`base`, else `base.1`, ...), and
/// the lowest free key in its hash range.
fn free_name(store: &mut dyn NodeStore, root: u64, dir: u64, base: &[u8]) -> Result<(Vec<u8>, u64)> {
    for n in 0..NAME_TRIES {
        let mut name = base.to_vec();
        if n > 0 {
            name.extend_from_slice(format!(".{n}").as_bytes());
        }
        let (found, free) = dir::probe_hashed(store, root, &name, &entry_name, dir, &|_, _| Ok(()))?;
        if let (None, Some(key)) = (found, free) {
            return Ok((name, key));
        }
    }
    Err(Error::Corrupt { what: "directory", block: dir, detail: format!("no free name like {:?}", String::from_utf8_lossy(base)) })
}

/// The name in a directory entry's value (`ino u64 | file type u8 | name`).
fn entry_name(value: &[u8]) -> Option<&[u8]> {
    value.get(9..)
}

// ---------------------------------------------------------------------------------------------
// On-disk tables: bitmaps and orphan tables

/// A plain set of `0..len`.
struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    fn new(len: u64) -> BitSet {
        BitSet { words: vec![0; len.div_ceil(64) as usize] }
    }
    fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }
    fn insert(&mut self, i: u64) {
        self.words[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn len(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// One AG's run of header-checked blocks (a bitmap, or the orphan table), held in memory so
/// repairs edit it in place. A block that fails verification is rebuilt: its header is
/// rewritten on write-back and its old contents are never trusted.
struct Table {
    magic: u32,
    agno: u32,
    first: u64,
    blocks: Vec<Box<Block>>,
    valid: Vec<bool>,
    dirty: Vec<bool>,
}

/// Where bit `i` of a bitmap lives: (block, byte, mask).
fn bit_pos(i: u64) -> (usize, usize, u8) {
    ((i / BITMAP_BITS) as usize, HDR_SIZE + (i % BITMAP_BITS / 8) as usize, 1 << (i % 8))
}

/// Where orphan slot `s` lives: (block, byte offset).
fn slot_pos(s: u32) -> (usize, usize) {
    let s = u64::from(s);
    ((s / ORPHAN_SLOTS_PER_BLOCK) as usize, HDR_SIZE + 8 * (s % ORPHAN_SLOTS_PER_BLOCK) as usize)
}

impl Table {
    fn load(dev: &dyn BlockDevice, what: &'static str, magic: u32, l: &AgLayout, (first, count): (u64, u64), out: &mut Findings) -> Result<Table> {
        let mut t = Table { magic, agno: l.agno, first, blocks: Vec::new(), valid: Vec::new(), dirty: Vec::new() };
        for blkno in first..first + count {
            let mut b = Box::new([0u8; BLOCK_SIZE]);
            dev.read_at(&mut b[..], blkno * BS)?;
            let verified = format::verify_block(&b[..], what, magic, blkno, Some(u64::from(l.agno)));
            if let Err(e) = &verified {
                out.fixable(format!("AG {} {what} block {blkno}: {}", l.agno, detail(e)));
            }
            t.blocks.push(b);
            t.valid.push(verified.is_ok());
            t.dirty.push(verified.is_err());
        }
        Ok(t)
    }

    fn capacity_bits(&self) -> u64 {
        self.blocks.len() as u64 * BITMAP_BITS
    }

    fn bit(&self, i: u64) -> bool {
        let (b, byte, mask) = bit_pos(i);
        self.blocks[b][byte] & mask != 0
    }

    fn set_bit(&mut self, i: u64, used: bool) {
        let (b, byte, mask) = bit_pos(i);
        if (self.blocks[b][byte] & mask != 0) != used {
            self.blocks[b][byte] ^= mask;
            self.dirty[b] = true;
        }
    }

    /// Whether bit `i` comes from a block that verified (else it means nothing).
    fn bit_verified(&self, i: u64) -> bool {
        self.valid[bit_pos(i).0]
    }

    fn count_bits(&self, len: u64) -> u64 {
        (0..len).filter(|&i| self.bit(i)).count() as u64
    }

    /// Set every bit to `want(i, currently set)`; bits at and past `len` are cleared. Calls
    /// `changed(start, len, now_set)` for each run of changed bits in verified blocks (a
    /// rebuilt block's old bits mean nothing, so its changes are not findings). A run never
    /// spans `len`.
    fn reconcile(&mut self, len: u64, want: impl Fn(u64, bool) -> bool, mut changed: impl FnMut(u64, u64, bool) -> Result<()>) -> Result<()> {
        let mut run: Option<(u64, u64, bool)> = None;
        for i in 0..self.capacity_bits() {
            let have = self.bit(i);
            let wanted = i < len && want(i, have);
            if have == wanted {
                continue;
            }
            self.set_bit(i, wanted);
            if !self.bit_verified(i) {
                continue;
            }
            match &mut run {
                Some((start, n, set)) if *start + *n == i && *set == wanted && i != len => *n += 1,
                _ => {
                    if let Some((start, n, set)) = run.replace((i, 1, wanted)) {
                        changed(start, n, set)?;
                    }
                }
            }
        }
        match run {
            Some((start, n, set)) => changed(start, n, set),
            None => Ok(()),
        }
    }

    fn slot(&self, s: u32) -> u64 {
        let (b, off) = slot_pos(s);
        format::get_u64(&self.blocks[b][..], off)
    }

    fn clear_slot(&mut self, s: u32) {
        let (b, off) = slot_pos(s);
        format::put_u64(&mut self.blocks[b][..], off, 0);
        self.dirty[b] = true;
    }

    /// The occupied slots, in order.
    fn occupied_slots(&self) -> Vec<(u32, u64)> {
        let slots = self.blocks.len() as u64 * ORPHAN_SLOTS_PER_BLOCK;
        (0..slots as u32).map(|s| (s, self.slot(s))).filter(|&(_, ino)| ino != 0).collect()
    }

    /// An orphan block that failed verification names no trustworthy inode: start it empty.
    fn empty_invalid(&mut self) {
        for (b, valid) in self.blocks.iter_mut().zip(&self.valid) {
            if !valid {
                b[HDR_SIZE..].fill(0);
            }
        }
    }

    /// Write back the changed blocks, sealed (rebuilt ones with a fresh header).
    fn write(&mut self, dev: &dyn BlockDevice) -> Result<()> {
        for (i, b) in self.blocks.iter_mut().enumerate().filter(|(i, _)| self.dirty[*i]) {
            let blkno = self.first + i as u64;
            let lsn = if self.valid[i] { format::header_lsn(&b[..]) } else { 0 };
            if !self.valid[i] {
                format::init_header(&mut b[..], self.magic, blkno, u64::from(self.agno));
            }
            format::seal_block(&mut b[..], lsn);
            dev.write_at(&b[..], blkno * BS)?;
        }
        Ok(())
    }
}

struct AgTables {
    block_map: Table,
    inode_map: Table,
    orphans: Table,
}

// ---------------------------------------------------------------------------------------------
// What the walk records

/// Who a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Owner {
    AgMetadata(u32),
    Log,
    Inode(u64),
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::AgMetadata(agno) => write!(f, "AG {agno} metadata"),
            Owner::Log => write!(f, "the log"),
            Owner::Inode(ino) => write!(f, "inode {ino}"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Claim {
    start: u64,
    len: u64,
    owner: Owner,
}

impl Claim {
    fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// What the walk learned about one live inode.
struct Tally {
    mode: u16,
    nlink: u32,
    orphan_slot: u32,
    /// Reached through a name (or the root); false for a pending orphan no name reaches.
    reachable: bool,
    names: u32,
    subdirs: u32,
}

impl Tally {
    fn new(di: &DiskInode, reachable: bool) -> Tally {
        Tally { mode: di.mode, nlink: di.nlink, orphan_slot: di.orphan_slot, reachable, names: 0, subdirs: 0 }
    }

    fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    /// "." and the parent's entry plus each subdirectory's "..", or one link per name; none
    /// for an orphan nothing names.
    fn expected_nlink(&self) -> u32 {
        match (self.reachable, self.is_dir()) {
            (false, _) => 0,
            (true, true) => self.subdirs.saturating_add(2),
            (true, false) => self.names,
        }
    }

    /// Why `expected_nlink` is what it is.
    fn link_basis(&self) -> String {
        match (self.reachable, self.is_dir()) {
            (false, _) => "no name reaches it".into(),
            (true, true) => format!("expected {} (2 + {})", self.expected_nlink(), count(self.subdirs.into(), "subdirectory", "subdirectories")),
            (true, false) => count(self.names.into(), "name", "names"),
        }
    }
}

/// One directory entry being checked: `ino u64 | file type u8 | name` (see `dir`).
struct DirEntryRef<'v> {
    dir: u64,
    key: u64,
    value: &'v [u8],
    ino: u64,
    ftype: u8,
    name: &'v [u8],
}

impl<'v> DirEntryRef<'v> {
    fn parse(dir: u64, key: u64, value: &'v [u8]) -> Option<Self> {
        (value.len() >= 10 && value.len() <= 9 + NAME_MAX).then(|| DirEntryRef { dir, key, value, ino: format::get_u64(value, 0), ftype: value[8], name: &value[9..] })
    }
}

impl fmt::Display for DirEntryRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "directory {} entry {:?}", self.dir, String::from_utf8_lossy(self.name))
    }
}

/// What an entry's inode number leads to.
enum Target {
    /// Nothing: the entry goes. The string says why.
    Nothing(String),
    /// An allocated inode that does not decode.
    Unreadable(Error),
    /// An inode the walk has already seen.
    Live,
    /// An inode seen for the first time.
    New(Box<DiskInode>),
}

/// What scanning one directory's entries found.
#[derive(Default)]
struct DirScan {
    entries: u64,
    /// Keys of the entries the repair removes.
    remove: Vec<u64>,
    /// Entries the repair rewrites with the right file type.
    retype: Vec<(u64, Vec<u8>)>,
    /// The hash bucket being scanned and the names seen in it (entries arrive in key order).
    bucket: u64,
    bucket_names: HashSet<Vec<u8>>,
}

/// A directory's pending changes. The checker learns them while it walks but applies them
/// after: only then is every block's owner known, and a rebuilt or growing tree needs new
/// blocks.
#[derive(Default)]
struct DirEdit {
    /// The tree failed its check: build a new one from these entries, salvaged from the
    /// leaves still readable (the old tree's nodes are claimed by nobody, so they are freed).
    rebuild: Option<Vec<(u64, Vec<u8>)>>,
    /// Keys of the entries to remove.
    remove: Vec<u64>,
    /// Entries rewritten whole (a corrected file type).
    replace: Vec<(u64, Vec<u8>)>,
    /// Names to add: (name, inode, file type).
    add: Vec<(Vec<u8>, u64, u8)>,
    /// Nodes of the directory's xattr tree, for its `blocks`.
    xattr_nodes: u64,
}

impl DirEdit {
    fn is_empty(&self) -> bool {
        self.rebuild.is_none() && self.remove.is_empty() && self.replace.is_empty() && self.add.is_empty()
    }
}

/// The repaired copy of an inode, written back by the repair.
struct InodeFix {
    di: DiskInode,
    lsn: u64,
}

// ---------------------------------------------------------------------------------------------
// The checker

struct Checker<'a> {
    /// The image being checked: the device when repairing, the replay overlay otherwise.
    dev: &'a dyn BlockDevice,
    sb: Superblock,
    geo: Geometry,
    progress: &'a dyn Fn(&str, u64, u64),
    out: Findings,
    ags: Vec<AgTables>,
    /// Live inodes: reachable from the root, or pending on an orphan list.
    inodes: BTreeMap<u64, Tally>,
    /// Directories found but not scanned yet: the walk's explicit stack.
    pending_dirs: Vec<(u64, DiskInode)>,
    claims: Vec<Claim>,
    /// Tree nodes the repair frees (entries removed), with the inode that owned them.
    released: HashSet<(u64, Owner)>,
    /// Directory changes, applied once every block's owner is known.
    dir_edits: BTreeMap<u64, DirEdit>,
    /// Damaged inodes the repair zeroes and frees.
    cleared: BTreeSet<u64>,
    /// Where disconnected inodes go: the root's "lost+found", once found or made.
    lost_found: Option<u64>,
    /// New tree nodes: written, and flushed, before anything that points at them.
    fresh_nodes: BTreeSet<u64>,
    /// Every claim by its first block: (end, owner, the extent if it is one), to find a
    /// cross-link as it is made.
    claimed: BTreeMap<u64, (u64, Owner, Option<Extent>)>,
    /// Extents whose blocks another inode claimed first: (inode, extent). Each gets a copy.
    clones: Vec<(u64, Extent)>,
    /// Block copies the repair makes: (from, to, blocks). Written with the new nodes.
    copies: Vec<(u64, u64, u64)>,
    inode_fixes: BTreeMap<u64, InodeFix>,
    /// Whole-block rewrites: edited tree nodes, AG headers, superblock copies, a reset log.
    block_writes: BTreeMap<u64, Box<Block>>,
    allocated_inodes: u64,
    blocks_used: u64,
    log_records: u64,
}

impl<'a> Checker<'a> {
    fn new(dev: &'a dyn BlockDevice, sb: Superblock, repair: bool, progress: &'a dyn Fn(&str, u64, u64)) -> Self {
        Checker {
            dev,
            geo: sb.geo,
            sb,
            progress,
            out: Findings { repair, ..Findings::default() },
            ags: Vec::new(),
            inodes: BTreeMap::new(),
            pending_dirs: Vec::new(),
            claims: Vec::new(),
            released: HashSet::new(),
            dir_edits: BTreeMap::new(),
            cleared: BTreeSet::new(),
            lost_found: None,
            fresh_nodes: BTreeSet::new(),
            claimed: BTreeMap::new(),
            clones: Vec::new(),
            copies: Vec::new(),
            inode_fixes: BTreeMap::new(),
            block_writes: BTreeMap::new(),
            allocated_inodes: 0,
            blocks_used: 0,
            log_records: 0,
        }
    }

    fn read_block(&self, blkno: u64) -> Result<Box<Block>> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        self.dev.read_at(&mut b[..], blkno * BS)?;
        Ok(b)
    }

    fn claim(&mut self, start: u64, len: u64, owner: Owner) {
        self.claim_as(start, len, owner, None);
    }

    fn claim_as(&mut self, start: u64, len: u64, owner: Owner, extent: Option<Extent>) {
        self.claims.push(Claim { start, len, owner });
        self.claimed.insert(start, (start + len, owner, extent));
    }

    /// A verified B+tree node is what it says it is: a data extent that claimed its block
    /// first is the wrong one, and gets a copy of its blocks instead. (Its claim stays in
    /// `claims` with no blocks, so that the positions of later claims do not move.)
    fn claim_node(&mut self, blkno: u64, owner: Owner) {
        let first = self.claimed.range(..=blkno).next_back().filter(|(_, (end, _, _))| *end > blkno).map(|(&start, &c)| (start, c));
        if let Some((start, (_, Owner::Inode(ino), Some(e)))) = first {
            self.out.fixable(format!("inode {ino}: {} shares a block with a B+tree node of {owner}; given a copy of its own", describe_extent(&e)));
            self.claimed.remove(&start);
            if let Some(c) = self.claims.iter_mut().rev().find(|c| c.start == start && c.owner == Owner::Inode(ino)) {
                c.len = 0;
            }
            self.clones.push((ino, e));
        }
        self.claim(blkno, 1, owner);
    }

    /// Who already claims a block of `start..start + len`, if anyone. Exact while claims do
    /// not overlap, which only tree nodes may still do (reported as cross-links at the end).
    fn claimed_by(&self, start: u64, len: u64) -> Option<Owner> {
        self.claimed.range(..start + len).next_back().filter(|(_, (end, _, _))| *end > start).map(|(_, &(_, owner, _))| owner)
    }

    /// Withdraw the claims made since there were `from` (an inode being cleared).
    fn retract_claims(&mut self, from: usize) {
        for c in self.claims.drain(from..) {
            if self.claimed.get(&c.start).is_some_and(|&(_, owner, _)| owner == c.owner) {
                self.claimed.remove(&c.start);
            }
        }
    }

    /// Change the repaired copy of an inode (read on first use).
    fn fix_inode(&mut self, ino: u64, f: impl FnOnce(&mut DiskInode)) -> Result<()> {
        let fix = match self.inode_fixes.entry(ino) {
            MapEntry::Occupied(e) => e.into_mut(),
            MapEntry::Vacant(e) => {
                let (di, lsn) = read_inode(self.dev, &self.geo, ino)?;
                e.insert(InodeFix { di, lsn })
            }
        };
        f(&mut fix.di);
        Ok(())
    }

    /// Whether the inode bitmap marks a (valid) inode number in use. A bitmap block that failed
    /// verification says nothing, so the answer is then yes: the safe side.
    fn inode_allocated(&self, ino: u64) -> bool {
        let map = &self.ags[ino_ag(ino) as usize].inode_map;
        let i = u64::from(ino_index(ino));
        !map.bit_verified(i) || map.bit(i)
    }

    /// Whether a verified inode bitmap block marks the inode in use. Freed inodes keep their
    /// old images, so where the bitmap says nothing, an inode that decodes may be long gone.
    fn inode_marked(&self, ino: u64) -> bool {
        let map = &self.ags[ino_ag(ino) as usize].inode_map;
        let i = u64::from(ino_index(ino));
        map.bit_verified(i) && map.bit(i)
    }

    // ---- superblock, log, AG metadata ----------------------------------------------------

    fn check_primary_superblock(&mut self) -> Result<()> {
        let b = self.read_block(0)?;
        let problem = match Superblock::decode(&b[..], 0) {
            Err(e) => detail(&e),
            Ok(primary) if primary != self.sb => "differs from the copies in AG 1 and AG 2, which agree".into(),
            Ok(_) => return Ok(()),
        };
        self.out.fixable(format!("superblock (block 0): {problem}; using the copy in AG 1"));
        self.block_writes.insert(0, self.sb.encode(0));
        Ok(())
    }

    /// Replay the log as a mount would. A repair first replays into memory (`recover` writes
    /// the items it replays to whatever device it is given) to learn whether there is anything
    /// to replay, so that repairing a cleanly unmounted image writes nothing, not even a new
    /// log header.
    fn replay_log(&mut self) -> Result<()> {
        (self.progress)("log", 0, 1);
        let probe = ReplayOverlay::new(self.dev);
        let target: &dyn BlockDevice = if self.out.repair { &probe } else { self.dev };
        match journal::recover(target, &self.geo, false) {
            Ok(r) if r.records > 0 => {
                let records = count(r.records, "record", "records");
                if self.out.repair {
                    journal::recover(self.dev, &self.geo, true)?;
                    self.out.note(format!("log: replayed {records}"));
                } else {
                    self.out.note(format!("log: replayed {records} in memory only; the next mount replays them on disk"));
                }
                self.log_records = r.records;
            }
            Ok(_) => {}
            Err(e) => {
                let e = finding(e)?;
                self.out.fixable(format!("log: cannot be replayed ({e}); resetting it loses the changes it held"));
                self.reset_log()?;
            }
        }
        (self.progress)("log", 1, 1);
        Ok(())
    }

    /// Empty log headers, as mkfs writes them, in an epoch after any the old headers name (so
    /// no stale record can replay), and an empty first ring block.
    fn reset_log(&mut self) -> Result<()> {
        let log = self.geo.ag_layout(0).log;
        let mut epoch = 0u64;
        for blkno in log..log + LOG_HEADER_BLOCKS {
            // The headers failed verification: read their epoch field raw, best effort.
            epoch = epoch.max(format::get_u64(&self.read_block(blkno)?[..], 40));
        }
        for gen in 0..LOG_HEADER_BLOCKS {
            let h = LogHeader { gen, epoch: epoch.wrapping_add(1), tail_off: 0, tail_seq: 1 };
            self.block_writes.insert(log + gen, h.encode(log + gen));
        }
        self.block_writes.insert(log + LOG_HEADER_BLOCKS, Box::new([0u8; BLOCK_SIZE]));
        Ok(())
    }

    fn check_ags(&mut self) -> Result<()> {
        for agno in 0..self.geo.ag_count {
            (self.progress)("allocation groups", u64::from(agno) + 1, u64::from(self.geo.ag_count));
            let l = self.geo.ag_layout(agno);
            if agno > 0 {
                self.check_superblock_copy(&l)?;
            }
            self.check_ag_header(&l)?;
            let tables = self.load_tables(&l)?;
            self.allocated_inodes += tables.inode_map.count_bits(u64::from(self.geo.inodes_per_ag));
            self.ags.push(tables);
            self.claim_ag_metadata(&l);
        }
        Ok(())
    }

    fn check_superblock_copy(&mut self, l: &AgLayout) -> Result<()> {
        let b = self.read_block(l.start)?;
        let problem = match Superblock::decode(&b[..], l.start) {
            Err(e) => detail(&e),
            Ok(copy) if copy != self.sb => "differs from the primary".into(),
            Ok(_) => return Ok(()),
        };
        self.out.fixable(format!("AG {} superblock copy (block {}): {problem}", l.agno, l.start));
        self.block_writes.insert(l.start, self.sb.encode(l.start));
        Ok(())
    }

    /// The AG header is static geometry, so the one to compare with is the one mkfs writes.
    fn check_ag_header(&mut self, l: &AgLayout) -> Result<()> {
        let b = self.read_block(l.header)?;
        let mut want = agh::build(l.header, l.agno, l.blocks, self.geo.inodes_per_ag, self.geo.orphan_slots_per_ag);
        let problem = match format::verify_block(&b[..], "AG header", MAGIC_AGH, l.header, Some(u64::from(l.agno))) {
            Err(e) => detail(&e),
            Ok(()) if b[HDR_SIZE..] != want[HDR_SIZE..] => "geometry disagrees with the superblock".into(),
            Ok(()) => return Ok(()),
        };
        self.out.fixable(format!("AG {} header (block {}): {problem}", l.agno, l.header));
        format::seal_block(&mut want[..], 0);
        self.block_writes.insert(l.header, want);
        Ok(())
    }

    fn load_tables(&mut self, l: &AgLayout) -> Result<AgTables> {
        let block_map = Table::load(self.dev, "block bitmap", MAGIC_BITMAP, l, (l.block_bitmap, l.block_bitmap_blocks), &mut self.out)?;
        let inode_map = Table::load(self.dev, "inode bitmap", MAGIC_BITMAP, l, (l.inode_bitmap, l.inode_bitmap_blocks), &mut self.out)?;
        let mut orphans = Table::load(self.dev, "orphan table", MAGIC_ORPHAN, l, (l.orphan_table, l.orphan_blocks), &mut self.out)?;
        orphans.empty_invalid();
        Ok(AgTables { block_map, inode_map, orphans })
    }

    fn claim_ag_metadata(&mut self, l: &AgLayout) {
        if l.log_blocks > 0 {
            self.claim(l.start, l.log - l.start, Owner::AgMetadata(l.agno));
            self.claim(l.log, l.log_blocks, Owner::Log);
        } else {
            self.claim(l.start, l.data_start - l.start, Owner::AgMetadata(l.agno));
        }
    }

    // ---- the tree walk -------------------------------------------------------------------

    fn walk_tree(&mut self) -> Result<()> {
        let root = match read_inode(self.dev, &self.geo, ROOT_INO) {
            Ok((di, _)) if di.is_dir() => di,
            Ok((di, _)) => return self.recreate_root(&format!("is a {}, not a directory", kind_name(di.mode))),
            Err(e) => {
                let e = finding(e)?;
                return self.recreate_root(&detail(&e));
            }
        };
        self.inodes.insert(ROOT_INO, Tally::new(&root, true));
        if root.parent != ROOT_INO {
            self.out.fixable(format!("directory {ROOT_INO} (root): '..' is {}, not itself", root.parent));
            self.fix_inode(ROOT_INO, |d| d.parent = ROOT_INO)?;
        }
        self.pending_dirs.push((ROOT_INO, root));
        self.drain_dirs()
    }

    /// A root that cannot be read is replaced by an empty one, as mkfs makes it. Nothing of
    /// the old one is claimed, so what it owned is freed; what it named is reconnected.
    fn recreate_root(&mut self, why: &str) -> Result<()> {
        self.out.fixable(format!("root inode {ROOT_INO}: {why}; recreated empty (what it named goes to /lost+found)"));
        let mut root = DiskInode::new(S_IFDIR | 0o755, 0, 0, mkfs::now(), 1);
        root.nlink = 2;
        root.parent = ROOT_INO;
        self.new_inode(ROOT_INO, root);
        self.dir_edits.insert(ROOT_INO, DirEdit { rebuild: Some(Vec::new()), ..DirEdit::default() });
        Ok(())
    }

    /// Record an inode the repair creates: live, reachable, written whole.
    fn new_inode(&mut self, ino: u64, di: DiskInode) {
        self.inodes.insert(ino, Tally::new(&di, true));
        self.inode_fixes.insert(ino, InodeFix { di, lsn: 0 });
        self.mark_inode(ino, true);
    }

    fn mark_inode(&mut self, ino: u64, used: bool) {
        self.ags[ino_ag(ino) as usize].inode_map.set_bit(u64::from(ino_index(ino)), used);
    }

    fn drain_dirs(&mut self) -> Result<()> {
        while let Some((ino, di)) = self.pending_dirs.pop() {
            self.check_dir(ino, &di)?;
            (self.progress)("inodes", self.inodes.len() as u64, self.allocated_inodes);
        }
        Ok(())
    }

    /// Check a directory's tree and entries. A tree that fails its check is rebuilt from the
    /// entries of the leaves still readable; the entries of lost leaves are gone, and the
    /// inodes only they named are reconnected later. All tree changes wait in `dir_edits`
    /// until every block's owner is known (a rebuild needs free blocks).
    fn check_dir(&mut self, ino: u64, di: &DiskInode) -> Result<()> {
        let xattr_nodes = self.check_xattrs(ino, di)?;
        let root = dir::root_of(di);
        let mut edit = DirEdit { xattr_nodes, ..DirEdit::default() };
        let nodes = match self.check_tree(ino, "directory", root)? {
            Ok(nodes) => nodes,
            Err(why) => {
                let mut salvaged = Vec::new();
                let lost = btree::salvage(&mut DevStore::new(self.dev, &self.geo, ino), root, &mut |k, v| salvaged.push((k, v.to_vec())))?;
                let kept = count(salvaged.len() as u64, "entry", "entries");
                self.out.fixable(format!("inode {ino}: {why}; rebuilt from its readable leaves ({kept} kept, {} lost)", count(lost, "node", "nodes")));
                edit.rebuild = Some(salvaged);
                0
            }
        };
        if root != 0 && self.inodes.get(&ino).is_some_and(|t| !t.reachable) {
            self.out.fixable(format!("directory {ino}: unlinked, but still has entries (removed; what they name is reconnected)"));
            edit.rebuild = Some(Vec::new());
            self.dir_edits.insert(ino, edit);
            return Ok(());
        }
        let mut scan = DirScan::default();
        match &edit.rebuild {
            Some(entries) => entries.iter().try_for_each(|(key, value)| self.check_entry(ino, *key, value, &mut scan))?,
            None => self.scan_entries(ino, root, &mut scan)?,
        }
        if edit.rebuild.is_none() {
            self.check_dir_counts(ino, di, &scan, nodes + xattr_nodes)?;
        }
        edit.remove = scan.remove;
        edit.replace = scan.retype;
        self.dir_edits.insert(ino, edit);
        Ok(())
    }

    /// A directory's size is its entry count and its `blocks` the nodes it owns. With entries
    /// to remove, the edit fixes both once it is applied.
    fn check_dir_counts(&mut self, ino: u64, di: &DiskInode, scan: &DirScan, owned: u64) -> Result<()> {
        if di.size != scan.entries {
            self.out.fixable(format!("directory {ino}: size {} but {}", di.size, count(scan.entries, "entry", "entries")));
        }
        if owned != di.blocks {
            self.out.fixable(format!("inode {ino}: blocks {} but owns {owned}", di.blocks));
        }
        if scan.remove.is_empty() && scan.retype.is_empty() && (di.size != scan.entries || owned != di.blocks) {
            self.fix_inode(ino, |d| {
                d.size = scan.entries;
                d.blocks = owned;
            })?;
        }
        Ok(())
    }

    fn scan_entries(&mut self, dir: u64, root: u64, scan: &mut DirScan) -> Result<()> {
        let (dev, geo) = (self.dev, self.geo);
        btree::range(&mut DevStore::new(dev, &geo, dir), root, 0, &mut |key, value| {
            self.check_entry(dir, key, value, scan)?;
            Ok(true)
        })
    }

    /// Check one entry; one that is malformed, misnamed or names nothing is removed (the inode
    /// it named, if intact and named nowhere else, is reconnected later).
    fn check_entry(&mut self, dir: u64, key: u64, value: &[u8], scan: &mut DirScan) -> Result<()> {
        scan.entries += 1;
        let Some(e) = DirEntryRef::parse(dir, key, value) else {
            self.out.fixable(format!("directory {dir}: entry {key:#x} is malformed ({} bytes); removed", value.len()));
            scan.remove.push(key);
            return Ok(());
        };
        if let Some(why) = self.entry_name_problem(&e, scan) {
            self.out.fixable(format!("{e}: {why}; removed"));
            scan.remove.push(key);
            return Ok(());
        }
        match self.resolve(e.ino)? {
            Target::Nothing(why) => {
                self.out.fixable(format!("{e}: {why}"));
                scan.remove.push(key);
            }
            Target::Unreadable(err) => {
                self.out.fixable(format!("{e}: inode {}: {}; inode cleared, entry removed", e.ino, detail(&err)));
                self.clear_inode(e.ino);
                scan.remove.push(key);
            }
            Target::Live => self.add_name(&e, scan),
            Target::New(di) => {
                let is_dir = di.is_dir();
                self.inodes.insert(e.ino, Tally::new(&di, true));
                if !self.reach(dir, e.ino, *di)? {
                    scan.remove.push(key);
                    return Ok(());
                }
                if dir == ROOT_INO && is_dir && e.name == LOST_FOUND {
                    self.lost_found = Some(e.ino);
                }
                self.add_name(&e, scan);
            }
        }
        Ok(())
    }

    fn entry_name_problem(&mut self, e: &DirEntryRef, scan: &mut DirScan) -> Option<String> {
        if dir::check_name(e.name).is_err() {
            return Some("invalid name".into());
        }
        let bucket = e.key >> 16;
        if bucket != dir::name_hash(e.name) {
            return Some(format!("key {:#x} is outside its name's hash range (lookups cannot find it)", e.key));
        }
        if bucket != scan.bucket {
            scan.bucket = bucket;
            scan.bucket_names.clear();
        }
        (!scan.bucket_names.insert(e.name.to_vec())).then(|| "duplicate name".into())
    }

    /// What an entry's inode number leads to. An inode that does not decode is only trusted
    /// to exist if the bitmap allocates it and its slot holds something: an all-zero slot was
    /// never written, so dropping the entry loses nothing.
    fn resolve(&self, ino: u64) -> Result<Target> {
        let Ok(offset) = self.geo.inode_offset(ino) else {
            return Ok(Target::Nothing(format!("inode {ino} is outside the image")));
        };
        if self.cleared.contains(&ino) {
            return Ok(Target::Nothing(format!("inode {ino} was cleared")));
        }
        if self.inodes.contains_key(&ino) {
            return Ok(Target::Live);
        }
        let mut img = [0u8; INODE_SIZE];
        self.dev.read_at(&mut img, offset)?;
        Ok(match DiskInode::decode(&img, ino, &self.geo) {
            Ok(di) => Target::New(Box::new(di)),
            Err(_) if img.iter().all(|&b| b == 0) => Target::Nothing(format!("inode {ino} was never written")),
            Err(e) if !self.inode_allocated(ino) => Target::Nothing(format!("inode {ino} is free and does not decode ({})", detail(&e))),
            Err(e) => Target::Unreadable(e),
        })
    }

    /// A damaged inode goes: its slot is zeroed and freed. What it owned is claimed by nobody,
    /// so the block map frees it.
    fn clear_inode(&mut self, ino: u64) {
        self.inodes.remove(&ino);
        self.inode_fixes.remove(&ino);
        self.cleared.insert(ino);
        self.mark_inode(ino, false);
    }

    /// Count a name of a live inode. A directory keeps only its first: any other is removed.
    fn add_name(&mut self, e: &DirEntryRef, scan: &mut DirScan) {
        let Some(t) = self.inodes.get_mut(&e.ino) else { return };
        if t.is_dir() && (t.names > 0 || e.ino == ROOT_INO) {
            self.out.fixable(format!("{e}: directory {} already has a name (a hard-linked directory or a cycle)", e.ino));
            scan.remove.push(e.key);
            return;
        }
        t.names = t.names.saturating_add(1);
        let (want, is_dir, kind) = (ftype_of(t.mode), t.is_dir(), kind_name(t.mode));
        if e.ftype != want {
            self.out.fixable(format!("{e}: file type {} but inode {} is a {kind}", e.ftype, e.ino));
            let mut v = e.value.to_vec();
            v[8] = want;
            scan.retype.push((e.key, v));
        }
        if is_dir {
            self.count_subdir(e.dir);
        }
    }

    fn count_subdir(&mut self, dir: u64) {
        if let Some(parent) = self.inodes.get_mut(&dir) {
            parent.subdirs = parent.subdirs.saturating_add(1);
        }
    }

    /// First sight of a live inode, named in `dir`. Returns false if it was damaged and
    /// cleared (a directory never is: its tree is rebuilt instead).
    fn reach(&mut self, dir: u64, ino: u64, di: DiskInode) -> Result<bool> {
        if !di.is_dir() {
            return self.check_file(ino, &di);
        }
        if di.parent != dir {
            self.out.fixable(format!("directory {ino}: '..' is {}, but it is named in directory {dir}", di.parent));
            self.fix_inode(ino, |d| d.parent = dir)?;
        }
        self.pending_dirs.push((ino, di));
        Ok(true)
    }

    // ---- inodes and what they own --------------------------------------------------------

    /// A live inode that is not a directory: parent, symlink target, xattrs, data blocks.
    /// One whose symlink target or data map is damaged is cleared (its claims withdrawn);
    /// returns whether it stays.
    fn check_file(&mut self, ino: u64, di: &DiskInode) -> Result<bool> {
        let (claims_before, clones_before) = (self.claims.len(), self.clones.len());
        let damage = match self.check_symlink(ino, di)? {
            // Mount refuses such an inode; a directory's size is recounted instead.
            _ if di.size > MAX_FILE_BLOCKS * BS => Some(format!("size {} out of range", di.size)),
            Some(why) => Some(why),
            None => self.check_data(ino, di)?.err(),
        };
        if let Some(why) = damage {
            self.out.fixable(format!("inode {ino}: {why}; inode cleared"));
            self.retract_claims(claims_before);
            self.clones.retain(|&(owner, _)| owner != ino);
            self.clear_inode(ino);
            return Ok(false);
        }
        if di.parent != 0 {
            self.out.fixable(format!("inode {ino}: a {} with parent {}", kind_name(di.mode), di.parent));
            self.fix_inode(ino, |d| d.parent = 0)?;
        }
        // What check_data claimed (mapped blocks, extent-tree nodes) or will copy.
        let claimed: u64 = self.claims[claims_before..].iter().map(|c| c.len).sum();
        let data = claimed + self.clones[clones_before..].iter().filter(|(owner, _)| *owner == ino).map(|(_, e)| u64::from(e.len)).sum::<u64>();
        let owned = self.check_xattrs(ino, di)? + data;
        if di.blocks != owned {
            self.out.fixable(format!("inode {ino}: blocks {} but owns {owned}", di.blocks));
            self.fix_inode(ino, |f| f.blocks = owned)?;
        }
        Ok(true)
    }

    /// What is wrong with a symlink's target, if anything that cannot be recounted.
    fn check_symlink(&mut self, ino: u64, di: &DiskInode) -> Result<Option<String>> {
        if !di.is_symlink() {
            return Ok(None);
        }
        match di.fork {
            Fork::Inline { len, .. } if di.size != u64::from(len) => {
                self.out.fixable(format!("inode {ino}: symlink size {} but its inline target has {len} bytes", di.size));
                self.fix_inode(ino, |d| d.size = u64::from(len))?;
            }
            Fork::Inline { .. } => {}
            _ if di.size == 0 || di.size > SYMLINK_MAX as u64 => return Ok(Some(format!("symlink target of {} bytes", di.size))),
            _ => {}
        }
        Ok(None)
    }

    /// Verify one of `ino`'s B+trees and claim its nodes. Returns how many it has, or what is
    /// wrong with it: then none of its nodes is claimed, as the repair drops the tree.
    fn check_tree(&mut self, ino: u64, what: &str, root: u64) -> Result<std::result::Result<u64, String>> {
        let mut nodes = Vec::new();
        match btree::check(&mut DevStore::new(self.dev, &self.geo, ino), root, &mut |b| nodes.push(b)) {
            Ok(stats) => {
                for b in nodes {
                    self.claim_node(b, Owner::Inode(ino));
                }
                Ok(Ok(stats.nodes))
            }
            Err(e) => Ok(Err(format!("{what} B+tree {}", node_detail(&finding(e)?)))),
        }
    }

    /// Verify the xattr tree, its records and their value blocks; returns the blocks it owns.
    /// A damaged tree, record or value block loses the inode's tree-held xattrs (the tree is
    /// dropped and its blocks are freed), not the inode.
    fn check_xattrs(&mut self, ino: u64, di: &DiskInode) -> Result<u64> {
        let claims_before = self.claims.len();
        let mut damage = self.check_tree(ino, "xattr", di.xattr_root)?.err();
        let mut value_blocks = Vec::new();
        if damage.is_none() {
            let (dev, geo) = (self.dev, self.geo);
            btree::range(&mut DevStore::new(dev, &geo, ino), di.xattr_root, 0, &mut |key, v| {
                damage = xattr_record_problem(key, v).map(|why| format!("xattr record {key:#x}: {why}"));
                if damage.is_none() {
                    value_blocks.extend(xattr::decode_record(v).into_iter().flat_map(|r| r.value.blocks().collect::<Vec<_>>()));
                }
                Ok(damage.is_none())
            })?;
        }
        for &blkno in &value_blocks {
            if damage.is_some() {
                break;
            }
            if !self.geo.is_data_range(blkno, 1) {
                damage = Some(format!("xattr value block {blkno}: lies outside the data area"));
                break;
            }
            self.claim(blkno, 1, Owner::Inode(ino));
            let mut b = vec![0u8; BLOCK_SIZE];
            self.dev.read_at(&mut b, blkno * BS)?;
            damage = format::verify_block(&b, "xattr value block", MAGIC_DATA_META, blkno, Some(ino)).err().map(|e| format!("xattr value block {blkno}: {}", detail(&e)));
        }
        let Some(why) = damage else {
            return Ok(self.claims[claims_before..].iter().map(|c| c.len).sum());
        };
        self.out.fixable(format!("inode {ino}: {why}; its xattr tree is dropped"));
        self.retract_claims(claims_before);
        self.fix_inode(ino, |d| d.xattr_root = 0)?;
        Ok(0)
    }

    /// Verify a file's data map (extents, extent-tree nodes) and claim what it maps; returns
    /// what is wrong with it, if anything.
    fn check_data(&mut self, ino: u64, di: &DiskInode) -> Result<std::result::Result<(), String>> {
        match &di.fork {
            Fork::Extents { n, ext } => {
                let mut prev_end = 0;
                Ok(ext[..*n as usize].iter().try_for_each(|e| self.claim_extent(ino, di.is_reg(), e, &mut prev_end)))
            }
            Fork::Btree(root) => self.check_extent_tree(ino, di.is_reg(), *root),
            Fork::Empty | Fork::Inline { .. } | Fork::Device(_) => Ok(Ok(())),
        }
    }

    fn check_extent_tree(&mut self, ino: u64, regular: bool, root: u64) -> Result<std::result::Result<(), String>> {
        if let Err(why) = self.check_tree(ino, "extent map", root)? {
            return Ok(Err(why));
        }
        let (mut prev_end, mut damage) = (0u64, None);
        let (dev, geo) = (self.dev, self.geo);
        btree::range(&mut DevStore::new(dev, &geo, ino), root, 0, &mut |lblk, v| {
            let checked = match <[u8; 8]>::try_from(v) {
                Err(_) => Err(format!("extent map entry at file block {lblk} has {} bytes", v.len())),
                Ok(raw) => self.claim_extent(ino, regular, &Extent::unpack(lblk, u64::from_le_bytes(raw)), &mut prev_end),
            };
            damage = checked.err();
            Ok(damage.is_none())
        })?;
        Ok(damage.map_or(Ok(()), Err))
    }

    /// Check one extent of `ino` (extents come in file order) and claim its blocks; returns
    /// what is wrong with it, if anything. Unwritten (preallocated) extents are valid in
    /// `regular` files only, anywhere in the file: fallocate with KEEP_SIZE maps them past
    /// the end.
    fn claim_extent(&mut self, ino: u64, regular: bool, e: &Extent, prev_end: &mut u64) -> std::result::Result<(), String> {
        let end = e.lblk.checked_add(u64::from(e.len)).filter(|&end| end <= MAX_FILE_BLOCKS);
        let problem = match end {
            _ if e.len == 0 => "is empty",
            _ if e.unwritten && !regular => "is unwritten in a file that is not regular",
            None => "ends past the largest file",
            Some(_) if e.lblk < *prev_end => "overlaps the extent before it",
            Some(_) if !self.geo.is_data_range(e.pblk, u64::from(e.len)) => "lies outside the data area",
            Some(end) => {
                *prev_end = end;
                match self.claimed_by(e.pblk, u64::from(e.len)) {
                    // Which of the two is wrong cannot be told, so both keep what they hold,
                    // as e2fsck does: this one gets a copy of the blocks.
                    Some(other) => {
                        self.out.fixable(format!("inode {ino}: {} shares blocks with {other}; given a copy of its own", describe_extent(e)));
                        self.clones.push((ino, *e));
                    }
                    None => self.claim_as(e.pblk, u64::from(e.len), Owner::Inode(ino), Some(*e)),
                }
                return Ok(());
            }
        };
        Err(format!("{} {problem}", describe_extent(e)))
    }

    // ---- orphans and link counts ---------------------------------------------------------

    fn check_orphans(&mut self) -> Result<()> {
        for agno in 0..self.geo.ag_count {
            for (slot, ino) in self.ags[agno as usize].orphans.occupied_slots() {
                self.check_orphan_slot(agno, slot, ino)?;
            }
        }
        self.drain_dirs()
    }

    fn check_orphan_slot(&mut self, agno: u32, slot: u32, ino: u64) -> Result<()> {
        let at = format!("AG {agno} orphan slot {slot}");
        let problem = if ino_ag(ino) != agno || self.geo.inode_offset(ino).is_err() {
            format!("inode {ino} is not an inode of this AG")
        } else if !self.inode_allocated(ino) {
            format!("names free inode {ino}")
        } else if let Some(t) = self.inodes.get(&ino) {
            if t.orphan_slot == slot + 1 {
                self.out.note(format!("{at}: inode {ino}: truncate pending; the next read-write mount finishes it"));
                return Ok(());
            }
            format!("inode {ino} does not point back at it (its orphan slot field is {})", t.orphan_slot)
        } else {
            match read_inode(self.dev, &self.geo, ino) {
                Err(e) => {
                    self.clear_inode(ino);
                    format!("inode {ino}: {}; inode cleared", detail(&finding(e)?))
                }
                Ok((di, _)) if di.orphan_slot == slot + 1 => {
                    self.out.note(format!("{at}: inode {ino}: unlinked while open; the next read-write mount frees it"));
                    if self.adopt_orphan(ino, di)? {
                        return Ok(());
                    }
                    format!("inode {ino} was cleared")
                }
                Ok((di, _)) => format!("inode {ino} does not point back at it (its orphan slot field is {})", di.orphan_slot),
            }
        };
        self.out.fixable(format!("{at}: {problem}"));
        self.ags[agno as usize].orphans.clear_slot(slot);
        Ok(())
    }

    /// A valid pending orphan that no name reaches: live, and what it owns is in use.
    /// Returns false if it was damaged and cleared.
    fn adopt_orphan(&mut self, ino: u64, di: DiskInode) -> Result<bool> {
        self.inodes.insert(ino, Tally::new(&di, false));
        if di.is_dir() {
            self.pending_dirs.push((ino, di));
            return Ok(true);
        }
        self.check_file(ino, &di)
    }

    /// A live inode that says it is on an orphan slot must be named by that slot.
    fn check_orphan_fields(&mut self) -> Result<()> {
        let on_lists: Vec<(u64, u32)> = self.inodes.iter().filter(|(_, t)| t.orphan_slot != 0).map(|(&ino, t)| (ino, t.orphan_slot - 1)).collect();
        for (ino, slot) in on_lists {
            let agno = ino_ag(ino);
            if self.ags[agno as usize].orphans.slot(slot) != ino {
                self.out.fixable(format!("inode {ino}: says it is on AG {agno} orphan slot {slot}, which does not name it"));
                self.fix_inode(ino, |d| d.orphan_slot = 0)?;
            }
        }
        Ok(())
    }

    // ---- disconnected inodes and /lost+found -------------------------------------------

    /// Inodes a verified bitmap block allocates that no name and no orphan slot reaches, but
    /// that decode and still count links: they lost their name to damage (a removed entry, a lost leaf, a
    /// cleared or recreated directory). Each is named `#<ino>` in /lost+found, as e2fsck does:
    /// first the roots of detached subtrees (directories whose parent is not detached too), so
    /// that a detached directory keeps what it holds, then the rest.
    fn reconnect(&mut self) -> Result<()> {
        let mut detached = Vec::new();
        for agno in 0..self.geo.ag_count {
            for ino in (0..self.geo.inodes_per_ag).map(|i| make_ino(agno, i)) {
                if ino == 0 || !self.inode_marked(ino) || self.inodes.contains_key(&ino) || self.cleared.contains(&ino) {
                    continue;
                }
                match read_inode(self.dev, &self.geo, ino) {
                    Ok((di, _)) if di.nlink > 0 => detached.push((ino, di)),
                    Ok(_) => {} // unlinked and on no orphan list: leaked, the inode map frees it
                    Err(e) => drop(finding(e)?),
                }
            }
        }
        let detached_dirs: HashSet<u64> = detached.iter().filter(|(_, di)| di.is_dir()).map(|(ino, _)| *ino).collect();
        let rank = |di: &DiskInode| match (di.is_dir(), detached_dirs.contains(&di.parent)) {
            (true, false) => 0,
            (true, true) => 1,
            (false, _) => 2,
        };
        detached.sort_by_key(|(ino, di)| (rank(di), *ino));
        for (ino, di) in detached {
            // An earlier one's subtree may have reached it, or cleared it.
            if !self.inodes.contains_key(&ino) && !self.cleared.contains(&ino) {
                self.connect_lost(ino, di)?;
            }
        }
        Ok(())
    }

    fn connect_lost(&mut self, ino: u64, di: DiskInode) -> Result<()> {
        let lf = self.lost_found()?;
        self.out.fixable(format!("inode {ino}: a {} (nlink {}) that no name reaches; reconnected as /lost+found/#{ino}", kind_name(di.mode), di.nlink));
        let (is_dir, ftype) = (di.is_dir(), ftype_of(di.mode));
        let mut tally = Tally::new(&di, true);
        tally.names = 1;
        self.inodes.insert(ino, tally);
        if !self.reach(lf, ino, di)? {
            return Ok(());
        }
        if is_dir {
            self.count_subdir(lf);
        }
        self.dir_edits.entry(lf).or_default().add.push((format!("#{ino}").into_bytes(), ino, ftype));
        self.drain_dirs()
    }

    /// The root's lost+found directory, made (mode 0700, as e2fsck makes it) if there is none.
    fn lost_found(&mut self) -> Result<u64> {
        if let Some(lf) = self.lost_found {
            return Ok(lf);
        }
        let ino = self.free_inode().ok_or(Error::NoSpace)?;
        let mut di = DiskInode::new(S_IFDIR | 0o700, 0, 0, mkfs::now(), 1);
        di.nlink = 2;
        di.parent = ROOT_INO;
        self.new_inode(ino, di);
        if let Some(t) = self.inodes.get_mut(&ino) {
            t.names = 1;
        }
        self.count_subdir(ROOT_INO);
        self.out.note(format!("created /lost+found (inode {ino})"));
        self.dir_edits.insert(ino, DirEdit { rebuild: Some(Vec::new()), ..DirEdit::default() });
        self.dir_edits.entry(ROOT_INO).or_default().add.push((LOST_FOUND.to_vec(), ino, ftype_of(S_IFDIR)));
        self.lost_found = Some(ino);
        Ok(ino)
    }

    /// The first inode number that is free and that no finding has used.
    fn free_inode(&self) -> Option<u64> {
        let geo = &self.geo;
        (0..geo.ag_count)
            .flat_map(|agno| (0..geo.inodes_per_ag).map(move |i| make_ino(agno, i)))
            .find(|&ino| ino > ROOT_INO && !self.inode_allocated(ino) && !self.inodes.contains_key(&ino) && !self.cleared.contains(&ino))
    }

    // ---- directory changes -----------------------------------------------------------------

    /// Apply every directory's pending changes and give every cross-linked extent its copy,
    /// now that every block's owner is known: what nothing claims is free.
    fn apply_changes(&mut self) -> Result<()> {
        let mut used = BitSet::new(self.geo.block_count);
        for b in self.claims.iter().flat_map(|c| c.start..c.end()) {
            used.insert(b);
        }
        let mut free = FreeBlocks { used, next: 0 };
        for (dir, edit) in std::mem::take(&mut self.dir_edits) {
            if !edit.is_empty() {
                self.apply_dir_edit(dir, edit, &mut free)?;
            }
        }
        // One pass per inode: its tree's nodes are edited in one store.
        let mut clones: BTreeMap<u64, Vec<Extent>> = BTreeMap::new();
        for (ino, e) in std::mem::take(&mut self.clones) {
            clones.entry(ino).or_default().push(e);
        }
        for (ino, extents) in clones {
            self.apply_clones(ino, &extents, &mut free)?;
        }
        Ok(())
    }

    fn current_inode(&self, ino: u64) -> Result<DiskInode> {
        match self.inode_fixes.get(&ino) {
            Some(fix) => Ok(fix.di.clone()),
            None => Ok(read_inode(self.dev, &self.geo, ino)?.0),
        }
    }

    /// Edit a directory's tree in memory (or build a new one from the salvaged entries), then
    /// queue the changed nodes and fix the inode.
    fn apply_dir_edit(&mut self, dir: u64, edit: DirEdit, free: &mut FreeBlocks) -> Result<()> {
        let mut root = match edit.rebuild {
            Some(_) => 0,
            None => dir::root_of(&self.current_inode(dir)?),
        };
        let geo = self.geo;
        let mut store = EditStore::new(DevStore::new(self.dev, &geo, dir), free);
        for (key, value) in edit.rebuild.iter().flatten().chain(&edit.replace) {
            btree::insert(&mut store, &mut root, *key, value)?;
        }
        for &key in &edit.remove {
            btree::remove(&mut store, &mut root, key)?;
        }
        for (name, ino, ftype) in &edit.add {
            let (name, key) = free_name(&mut store, root, dir, name)?;
            let mut value = ino.to_le_bytes().to_vec();
            value.push(*ftype);
            value.extend_from_slice(&name);
            btree::insert(&mut store, &mut root, key, &value)?;
        }
        let stats = btree::check(&mut store, root, &mut |_| {})?;
        self.queue_nodes(dir, store);
        self.fix_inode(dir, |d| {
            dir::set_root(d, root);
            d.size = stats.entries;
            d.blocks = stats.nodes + edit.xattr_nodes;
        })
    }

    /// Move extents of `ino` to copies of their blocks, in blocks nothing claims.
    fn apply_clones(&mut self, ino: u64, extents: &[Extent], free: &mut FreeBlocks) -> Result<()> {
        let mut moved = Vec::with_capacity(extents.len());
        for e in extents {
            let len = u64::from(e.len);
            let to = free.take_run(&self.geo, len).ok_or(Error::NoSpace)?;
            self.claim(to, len, Owner::Inode(ino));
            (to..to + len).for_each(|b| self.set_block_bit(b, true));
            self.copies.push((e.pblk, to, len));
            moved.push(Extent { pblk: to, ..*e });
        }
        match self.current_inode(ino)?.fork {
            Fork::Btree(root) => {
                let geo = self.geo;
                let mut store = EditStore::new(DevStore::new(self.dev, &geo, ino), free);
                let mut new_root = root;
                for m in &moved {
                    btree::insert(&mut store, &mut new_root, m.lblk, &m.pack_value().to_le_bytes())?;
                }
                debug_assert_eq!(new_root, root, "values of the same length are replaced in place");
                self.queue_nodes(ino, store);
                Ok(())
            }
            _ => self.fix_inode(ino, |d| {
                if let Fork::Extents { n, ext } = &mut d.fork {
                    for x in &mut ext[..*n as usize] {
                        if let Some(m) = moved.iter().find(|m| m.lblk == x.lblk) {
                            *x = *m;
                        }
                    }
                }
            }),
        }
    }

    /// Queue the nodes an edit of `owner`'s tree changed, claim the new ones and release the
    /// freed ones.
    fn queue_nodes(&mut self, owner: u64, store: EditStore) {
        let EditStore { nodes, dirty, freed, fresh, .. } = store;
        for (&blkno, node) in dirty.iter().filter(|b| !freed.contains(b)).filter_map(|b| nodes.get_key_value(b)) {
            let mut img = Box::new(**node.read());
            let lsn = format::header_lsn(&img[..]);
            format::seal_block(&mut img[..], lsn);
            self.block_writes.insert(blkno, img);
        }
        for &blkno in fresh.iter().filter(|b| !freed.contains(b)) {
            self.claim(blkno, 1, Owner::Inode(owner));
            self.set_block_bit(blkno, true);
            self.fresh_nodes.insert(blkno);
        }
        for &blkno in freed.iter().filter(|b| !fresh.contains(b)) {
            self.release(owner, blkno);
        }
    }

    /// A node of `dir` the repair freed: no longer claimed, and free in the block bitmap.
    fn release(&mut self, dir: u64, blkno: u64) {
        self.released.insert((blkno, Owner::Inode(dir)));
        self.set_block_bit(blkno, false);
    }

    fn set_block_bit(&mut self, blkno: u64, used: bool) {
        let l = self.geo.ag_layout(self.geo.block_ag(blkno));
        self.ags[l.agno as usize].block_map.set_bit(blkno - l.start, used);
    }

    fn check_link_counts(&mut self) -> Result<()> {
        let wrong: Vec<(u64, u32, u32, String)> =
            self.inodes.iter().filter(|(_, t)| t.nlink != t.expected_nlink()).map(|(&ino, t)| (ino, t.nlink, t.expected_nlink(), t.link_basis())).collect();
        for (ino, have, want, basis) in wrong {
            self.out.fixable(format!("inode {ino}: nlink {have} but {basis}"));
            self.fix_inode(ino, |d| d.nlink = want)?;
        }
        Ok(())
    }

    // ---- allocation maps -----------------------------------------------------------------

    /// The inodes an AG's bitmap must mark: the live ones, and inode 0 ("no inode") in AG 0.
    fn expected_inodes(&self, agno: u32) -> BitSet {
        let mut set = BitSet::new(u64::from(self.geo.inodes_per_ag));
        if agno == 0 {
            set.insert(0);
        }
        for (&ino, _) in self.inodes.range(make_ino(agno, 0)..=make_ino(agno, u32::MAX)) {
            set.insert(u64::from(ino_index(ino)));
        }
        set
    }

    fn check_inode_maps(&mut self) -> Result<()> {
        let (dev, geo) = (self.dev, self.geo);
        for agno in 0..geo.ag_count {
            let expected = self.expected_inodes(agno);
            let Checker { ags, out, .. } = &mut *self;
            let want = |i: u64, _: bool| expected.get(i);
            ags[agno as usize].inode_map.reconcile(u64::from(geo.inodes_per_ag), want, |first, n, used| {
                let what = format!("AG {agno} inode bitmap");
                if first >= u64::from(geo.inodes_per_ag) {
                    out.fixable(format!("{what}: bits past the last inode are set"));
                    return Ok(());
                }
                for ino in (first..first + n).map(|i| make_ino(agno, i as u32)) {
                    if used {
                        out.fixable(format!("{what}: inode {ino} is in use but marked free"));
                    } else {
                        out.fixable(format!("{what}: inode {ino} is allocated but neither reachable nor on an orphan list (leaked {})", describe_inode(dev, &geo, ino)?));
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Cross-links, then each AG's block bitmap against the claims.
    fn check_block_maps(&mut self) -> Result<()> {
        let released = &self.released;
        self.claims.retain(|c| !(c.len == 1 && released.contains(&(c.start, c.owner))));
        self.claims.sort_by_key(|c| c.start); // stable: ties keep walk order, so messages repeat
        self.report_cross_links();
        for agno in 0..self.geo.ag_count {
            (self.progress)("block map", u64::from(agno) + 1, u64::from(self.geo.ag_count));
            self.check_block_map(self.geo.ag_layout(agno))?;
        }
        Ok(())
    }

    fn report_cross_links(&mut self) {
        let mut furthest: Option<Claim> = None;
        for c in self.claims.iter().filter(|c| c.len > 0) {
            if let Some(f) = furthest.filter(|f| c.start < f.end()) {
                self.out.unfixable(format!("{}: claimed by both {} and {}", blocks_desc(c.start, c.end().min(f.end()) - c.start), f.owner, c.owner));
            }
            if furthest.is_none_or(|f| c.end() > f.end()) {
                furthest = Some(*c);
            }
        }
    }

    fn check_block_map(&mut self, l: AgLayout) -> Result<()> {
        let lo = self.claims.partition_point(|c| c.start < l.start);
        let hi = self.claims.partition_point(|c| c.start < l.start + l.blocks);
        let claims = &self.claims[lo..hi];
        let mut expected = BitSet::new(l.blocks);
        for b in claims.iter().flat_map(|c| c.start..c.end()) {
            expected.insert(b - l.start);
        }
        self.blocks_used += expected.len();
        let out = &mut self.out;
        let what = format!("AG {} block bitmap", l.agno);
        let want = |i: u64, _: bool| expected.get(i);
        self.ags[l.agno as usize].block_map.reconcile(l.blocks, want, |first, n, used| {
            let blocks = blocks_desc(l.start + first, n);
            match (first >= l.blocks, used) {
                (true, _) => out.fixable(format!("{what}: bits past the end of the AG are set")),
                (false, true) => out.fixable(format!("{what}: {blocks} in use by {} but marked free", owner_of(claims, l.start + first))),
                (false, false) => out.fixable(format!("{what}: {blocks} used but not referenced (leaked)")),
            }
            Ok(())
        })
    }

    // ---- repair and report ---------------------------------------------------------------

    /// Write the repaired image in three flushed steps, so that a crash leaves an image this
    /// checker repairs again: first new tree nodes and block copies (nothing on disk points at them yet, so
    /// they are leaked free blocks until step 2 lands), then everything that points (edited
    /// nodes, inodes, AG headers, superblock copies, a reset log), then the allocation maps
    /// and orphan tables, which are derived from the rest.
    fn write_repairs(&mut self) -> Result<()> {
        (self.progress)("repair", 0, 1);
        let dev = self.dev;
        let (fresh, in_place): (Vec<_>, Vec<_>) = self.block_writes.iter().partition(|(b, _)| self.fresh_nodes.contains(b));
        for (&blkno, img) in fresh {
            dev.write_at(&img[..], blkno * BS)?;
        }
        for &(from, to, len) in &self.copies {
            copy_blocks(dev, from, to, len)?;
        }
        dev.flush()?;
        for (&blkno, img) in in_place {
            dev.write_at(&img[..], blkno * BS)?;
        }
        for &ino in &self.cleared {
            dev.write_at(&[0u8; INODE_SIZE], self.geo.inode_offset(ino)?)?;
        }
        for (&ino, fix) in &self.inode_fixes {
            let mut img = [0u8; INODE_SIZE];
            fix.di.encode(ino, fix.lsn, &mut img);
            dev.write_at(&img, self.geo.inode_offset(ino)?)?;
        }
        dev.flush()?;
        for ag in &mut self.ags {
            ag.block_map.write(dev)?;
            ag.inode_map.write(dev)?;
            ag.orphans.write(dev)?;
        }
        dev.flush()?;
        (self.progress)("repair", 1, 1);
        Ok(())
    }

    fn into_report(self) -> FsckReport {
        let mut messages = self.out.messages;
        if self.out.unshown > 0 {
            messages.push(format!("... and {} more messages", self.out.unshown));
        }
        FsckReport {
            errors_found: self.out.errors,
            errors_fixed: if self.out.repair { self.out.fixable } else { 0 },
            messages,
            inodes: self.inodes.len() as u64,
            dirs: self.inodes.values().filter(|t| t.reachable && t.is_dir()).count() as u64,
            blocks_used: self.blocks_used,
            log_records_replayed: self.log_records,
        }
    }
}

/// Who claims block `b`, which some claim holds (claims sorted by start: the nearest one
/// before `b` holds it unless claims overlap).
fn owner_of(claims: &[Claim], b: u64) -> String {
    let before = claims.partition_point(|c| c.start <= b);
    claims[..before].iter().rev().find(|c| c.end() > b).map_or_else(|| "an unknown owner".into(), |c| c.owner.to_string())
}

/// Copy `len` blocks, a bounded piece at a time.
fn copy_blocks(dev: &dyn BlockDevice, from: u64, to: u64, len: u64) -> Result<()> {
    const PIECE_BLOCKS: u64 = 256;
    let mut buf = vec![0u8; (len.min(PIECE_BLOCKS) * BS) as usize];
    for done in (0..len).step_by(PIECE_BLOCKS as usize) {
        let piece = &mut buf[..((len - done).min(PIECE_BLOCKS) * BS) as usize];
        dev.read_at(piece, (from + done) * BS)?;
        dev.write_at(piece, (to + done) * BS)?;
    }
    Ok(())
}

fn describe_extent(e: &Extent) -> String {
    format!("extent at file block {} ({} at block {})", e.lblk, count(e.len.into(), "block", "blocks"), e.pblk)
}

/// What a leaked inode is, for the message.
fn describe_inode(dev: &dyn BlockDevice, geo: &Geometry, ino: u64) -> Result<String> {
    Ok(match read_inode(dev, geo, ino) {
        Ok((di, _)) => format!("{}, nlink {}, {}", kind_name(di.mode), di.nlink, count(di.blocks, "block", "blocks")),
        Err(e) => format!("inode that does not decode: {}", detail(&finding(e)?)),
    })
}

/// What is wrong with an xattr tree record (SPEC §14.2: keyed by its name's hash).
fn xattr_record_problem(key: u64, v: &[u8]) -> Option<String> {
    let Some(r) = xattr::decode_record(v) else {
        return Some(format!("malformed ({} bytes)", v.len()));
    };
    (key >> 16 != dir::name_hash(r.name)).then(|| "key outside its name's hash range".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    #[test]
    fn block_pieces_split_at_block_boundaries() {
        let pieces: Vec<_> = block_pieces(4090, 10_000).collect();
        assert_eq!(pieces, [(0, 4090, 0..6), (1, 0, 6..4102), (2, 0, 4102..8198), (3, 0, 8198..10_000)]);
        assert_eq!(block_pieces(BS, 0).count(), 0);
    }

    #[test]
    fn overlay_shows_its_writes_and_never_writes_through() {
        let dev = MemDevice::new(4 * BS);
        dev.write_at(&[1u8; 100], 5000).unwrap();
        let before = dev.to_bytes();
        let overlay = ReplayOverlay::new(&dev);
        overlay.write_at(&[2u8; 10], 5005).unwrap();
        overlay.write_at(&[3u8; 2], BS - 1).unwrap();
        let mut b = [0u8; 20];
        overlay.read_at(&mut b, 4995).unwrap();
        assert_eq!(b, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]);
        let mut edge = [0u8; 4];
        overlay.read_at(&mut edge, BS - 2).unwrap();
        assert_eq!(edge, [0, 3, 3, 0]);
        assert!(overlay.write_at(&[0; 2], 4 * BS - 1).is_err(), "writes past the end fail");
        assert!(dev.to_bytes() == before, "the device was written");
    }

    /// A bitmap at blocks 10.. whose verified blocks have their header (as loaded from disk).
    fn bitmap(valid: &[bool]) -> Table {
        let block = |i: u64| {
            let mut b = Box::new([0u8; BLOCK_SIZE]);
            format::init_header(&mut b[..], MAGIC_BITMAP, 10 + i, 0);
            b
        };
        let blocks = (0..valid.len() as u64).map(block).collect();
        Table { magic: MAGIC_BITMAP, agno: 0, first: 10, blocks, valid: valid.to_vec(), dirty: vec![false; valid.len()] }
    }

    fn runs(t: &mut Table, len: u64, want: impl Fn(u64) -> bool) -> Vec<(u64, u64, bool)> {
        let mut runs = Vec::new();
        t.reconcile(len, |i, _| want(i), |start, n, set| {
            runs.push((start, n, set));
            Ok(())
        })
        .unwrap();
        runs
    }

    #[test]
    fn reconcile_reports_runs_and_never_spans_the_end() {
        let mut t = bitmap(&[true]);
        for i in [5, 6, 7, 998, 999, 1000, 1001] {
            t.set_bit(i, true);
        }
        let want = |i| (10..13).contains(&i) || i == 999;
        assert_eq!(runs(&mut t, 1000, want), [(5, 3, false), (10, 3, true), (998, 1, false), (1000, 2, false)]);
        assert!((0..BITMAP_BITS).all(|i| t.bit(i) == (i < 1000 && want(i))));
        assert!(t.dirty[0]);
        assert_eq!(runs(&mut t, 1000, want), [], "a reconciled bitmap has nothing left to report");
    }

    #[test]
    fn reconcile_rebuilds_unverified_blocks_silently() {
        let mut t = bitmap(&[true, false]);
        t.set_bit(BITMAP_BITS + 3, true);
        assert_eq!(runs(&mut t, 2 * BITMAP_BITS, |i| i == BITMAP_BITS + 7), []);
        assert!(!t.bit(BITMAP_BITS + 3) && t.bit(BITMAP_BITS + 7));
        assert_eq!(t.dirty, [false, true]);
    }

    #[test]
    fn orphan_slots_read_clear_and_empty_when_unverified() {
        let mut t = Table { magic: MAGIC_ORPHAN, ..bitmap(&[true, false]) };
        for (s, ino) in [(3, 7), (ORPHAN_SLOTS_PER_BLOCK as u32 + 1, 9)] {
            let (b, off) = slot_pos(s);
            format::put_u64(&mut t.blocks[b][..], off, ino);
        }
        assert_eq!(t.occupied_slots(), [(3, 7), (ORPHAN_SLOTS_PER_BLOCK as u32 + 1, 9)]);
        t.empty_invalid();
        assert_eq!(t.occupied_slots(), [(3, 7)]);
        t.clear_slot(3);
        assert_eq!(t.occupied_slots(), []);
        assert_eq!(t.dirty, [true, false]);
    }

    #[test]
    fn table_write_back_seals_and_rebuilds_headers() {
        let dev = MemDevice::new(16 * BS);
        let mut t = bitmap(&[true, false]);
        t.blocks[1][..HDR_SIZE].fill(0xee);
        t.set_bit(1, true);
        t.set_bit(BITMAP_BITS + 1, true);
        t.write(&dev).unwrap();
        for (i, blkno) in [10u64, 11].into_iter().enumerate() {
            let mut b = [0u8; BLOCK_SIZE];
            dev.read_at(&mut b, blkno * BS).unwrap();
            format::verify_block(&b, "bitmap", MAGIC_BITMAP, blkno, Some(0)).unwrap();
            assert_eq!(b[HDR_SIZE], 2, "block {i} keeps its bits");
        }
    }

    #[test]
    fn messages_are_capped_but_every_error_counts() {
        let mut out = Findings { repair: true, ..Findings::default() };
        for i in 0..MAX_MESSAGES + 500 {
            out.error(i % 2 == 0, format!("error {i}"));
        }
        assert_eq!((out.messages.len(), out.unshown, out.errors, out.fixable), (MAX_MESSAGES, 500, 1500, 750));
        assert_eq!(out.messages[..2], ["error 0 [fixed]", "error 1 [not fixed]"]);
    }

    #[test]
    fn exit_codes_follow_e2fsck() {
        let report = |errors_found, errors_fixed| FsckReport { errors_found, errors_fixed, ..FsckReport::default() };
        assert_eq!(report(0, 0).exit_code(), EXIT_CLEAN);
        assert_eq!(report(3, 3).exit_code(), EXIT_FIXED);
        assert_eq!(report(3, 0).exit_code(), EXIT_UNCORRECTED);
        assert_eq!(report(3, 2).exit_code(), EXIT_FIXED | EXIT_UNCORRECTED);
        assert!(report(0, 0).is_clean() && !report(1, 1).is_clean());
    }
}

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
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use crate::btree::NodeStore;
use crate::buf::{Block, Buf, BufRef};
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::inode::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK};
use crate::format::log::LogHeader;
use crate::format::{DiskInode, Extent, Geometry, Superblock, BLOCK_SIZE, INODE_SIZE, MAGIC_BTREE};
use crate::{btree, format};

use self::log::{HomeLsns, ReplayOverlay};
use self::space::Table;
use self::superblock::trusted_superblock;

mod dirs;
mod inodes;
mod log;
mod orphans;
mod repair;
mod space;
mod superblock;
mod xattr;

/// Most messages a report keeps; later ones are counted, not stored.
pub const MAX_MESSAGES: usize = 1000;

// Exit codes, e2fsck's bits: 5 means some errors were fixed and some were left.
/// Exit code: no errors found.
pub const EXIT_CLEAN: i32 = 0;
/// Exit code bit: errors were found and fixed.
pub const EXIT_FIXED: i32 = 1;
/// Exit code bit: errors were found and left (a check without repair, or damage the repair
/// does not fix).
pub const EXIT_UNCORRECTED: i32 = 4;
/// `check` returned an error: the device failed, or no superblock could be read.
pub const EXIT_OPERATIONAL: i32 = 8;

const BS: u64 = BLOCK_SIZE as u64;

/// What [`check`] may do to the image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsckOptions {
    /// Write the repairs. `false` is `-n`: the device is never written, not even by log replay.
    pub repair: bool,
}

/// What [`check`] found and fixed: findings for a person in `messages`, counts for a program,
/// and the exit code a tool should end with ([`FsckReport::exit_code`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// Errors found, fixed or not (notes are not errors).
    pub errors_found: u64,
    /// Errors repaired; always 0 without `repair`.
    pub errors_fixed: u64,
    /// One finding per line: errors ("inode 7: nlink 3 but 2 names", tagged `[fixed]` or
    /// `[not fixed]` when repairing) and notes ("note: ..."). At most [`MAX_MESSAGES`] plus a
    /// last line counting the ones left out.
    pub messages: Vec<String>,
    /// Live inodes: reachable from the root, or pending on an orphan list.
    pub inodes: u64,
    /// Reachable directories, the root included.
    pub dirs: u64,
    /// Blocks in use: AG metadata, the log and everything live inodes own.
    pub blocks_used: u64,
    /// Log records replayed: onto the device when repairing, into memory otherwise.
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

    /// Whether no error was found (the report may still hold notes).
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
    let view = HomeLsns::new(if opts.repair { dev } else { &overlay }, sb.geo);
    let mut c = Checker::new(&view, sb, opts.repair, progress);
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
    c.check_log_sequence(view.highest());
    if opts.repair {
        c.write_repairs()?;
    }
    Ok(c.into_report())
}

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

struct AgTables {
    block_map: Table,
    inode_map: Table,
    orphans: Table,
}

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
            (true, true) => format!(
                "expected {} (2 + {})",
                self.expected_nlink(),
                count(self.subdirs.into(), "subdirectory", "subdirectories")
            ),
            (true, false) => count(self.names.into(), "name", "names"),
        }
    }
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
    /// The newest log header after pass 2 (written, or to be written by the repair).
    log_header: Option<LogHeader>,
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
            log_header: None,
        }
    }

    fn read_block(&self, blkno: u64) -> Result<Box<Block>> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        self.dev.read_at(&mut b[..], blkno * BS)?;
        Ok(b)
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

#[cfg(test)]
mod tests {
    use super::*;

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

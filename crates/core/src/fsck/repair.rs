//! Passes 7 and the write-back: directory edits and extent copies built in memory once every
//! block's owner is known, then written in an order that keeps a crash repairable.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::btree::NodeStore;
use crate::buf::{Buf, BufRef};
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{DiskInode, Extent, Fork, Geometry, BLOCK_SIZE, INODE_SIZE};
use crate::{btree, dir, format};

use super::space::BitSet;
use super::{read_inode, Checker, DevStore, DirEdit, Owner, BS};

/// Suffixes tried when a name the repair adds is taken.
const NAME_TRIES: u32 = 100;

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
    pub(super) fn new(dev: DevStore<'a>, free: &'f mut FreeBlocks) -> Self {
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
    Err(Error::Corrupt {
        what: "directory",
        block: dir,
        detail: format!("no free name like {:?}", String::from_utf8_lossy(base)),
    })
}

/// The name in a directory entry's value (`ino u64 | file type u8 | name`).
fn entry_name(value: &[u8]) -> Option<&[u8]> {
    value.get(9..)
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

impl<'a> Checker<'a> {
    // ---- directory changes -----------------------------------------------------------------

    /// Apply every directory's pending changes and give every cross-linked extent its copy,
    /// now that every block's owner is known: what nothing claims is free.
    pub(super) fn apply_changes(&mut self) -> Result<()> {
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

    // ---- repair and report ---------------------------------------------------------------

    /// Write the repaired image in three flushed steps, so that a crash leaves an image this
    /// checker repairs again: first new tree nodes and block copies (nothing on disk points at them yet, so
    /// they are leaked free blocks until step 2 lands), then everything that points (edited
    /// nodes, inodes, AG headers, superblock copies, a reset log), then the allocation maps
    /// and orphan tables, which are derived from the rest.
    pub(super) fn write_repairs(&mut self) -> Result<()> {
        (self.progress)("repair", 0, 1);
        let dev = self.dev;
        let (fresh, in_place): (Vec<_>, Vec<_>) =
            self.block_writes.iter().partition(|(b, _)| self.fresh_nodes.contains(b));
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
}

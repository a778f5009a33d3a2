//! Files: symlink targets, data maps (extents and extent trees) and the blocks they claim, and
//! clearing a damaged inode.

use crate::btree;
use crate::error::Result;
use crate::format::inode::{MAX_FILE_BLOCKS, SYMLINK_MAX};
use crate::format::{DiskInode, Extent, Fork};

use super::{count, kind_name, Checker, DevStore, Owner, BS};

pub(super) fn describe_extent(e: &Extent) -> String {
    format!("extent at file block {} ({} at block {})", e.lblk, count(e.len.into(), "block", "blocks"), e.pblk)
}

impl<'a> Checker<'a> {
    /// A damaged inode goes: its slot is zeroed and freed. What it owned is claimed by nobody,
    /// so the block map frees it.
    pub(super) fn clear_inode(&mut self, ino: u64) {
        self.inodes.remove(&ino);
        self.inode_fixes.remove(&ino);
        self.cleared.insert(ino);
        self.mark_inode(ino, false);
    }

    // ---- inodes and what they own --------------------------------------------------------

    /// A live inode that is not a directory: parent, symlink target, xattrs, data blocks.
    /// One whose symlink target or data map is damaged is cleared (its claims withdrawn);
    /// returns whether it stays.
    pub(super) fn check_file(&mut self, ino: u64, di: &DiskInode) -> Result<bool> {
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
        let data = claimed
            + self.clones[clones_before..]
                .iter()
                .filter(|(owner, _)| *owner == ino)
                .map(|(_, e)| u64::from(e.len))
                .sum::<u64>();
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
                self.out
                    .fixable(format!("inode {ino}: symlink size {} but its inline target has {len} bytes", di.size));
                self.fix_inode(ino, |d| d.size = u64::from(len))?;
            }
            Fork::Inline { .. } => {}
            _ if di.size == 0 || di.size > SYMLINK_MAX as u64 => {
                return Ok(Some(format!("symlink target of {} bytes", di.size)))
            }
            _ => {}
        }
        Ok(None)
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
                Ok(raw) => {
                    self.claim_extent(ino, regular, &Extent::unpack(lblk, u64::from_le_bytes(raw)), &mut prev_end)
                }
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
    fn claim_extent(
        &mut self,
        ino: u64,
        regular: bool,
        e: &Extent,
        prev_end: &mut u64,
    ) -> std::result::Result<(), String> {
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
                        self.out.fixable(format!(
                            "inode {ino}: {} shares blocks with {other}; given a copy of its own",
                            describe_extent(e)
                        ));
                        self.clones.push((ino, *e));
                    }
                    None => self.claim_as(e.pblk, u64::from(e.len), Owner::Inode(ino), Some(*e)),
                }
                return Ok(());
            }
        };
        Err(format!("{} {problem}", describe_extent(e)))
    }
}

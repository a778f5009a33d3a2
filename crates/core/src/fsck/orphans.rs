//! Pass 5: the orphan tables and the inodes' slot fields.

use crate::error::Result;
use crate::format::{ino_ag, DiskInode};

use super::{detail, finding, read_inode, Checker, Tally};

impl<'a> Checker<'a> {
    // ---- orphans and link counts ---------------------------------------------------------

    pub(super) fn check_orphans(&mut self) -> Result<()> {
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
                    self.out
                        .note(format!("{at}: inode {ino}: unlinked while open; the next read-write mount frees it"));
                    if self.adopt_orphan(ino, di)? {
                        return Ok(());
                    }
                    format!("inode {ino} was cleared")
                }
                Ok((di, _)) => {
                    format!("inode {ino} does not point back at it (its orphan slot field is {})", di.orphan_slot)
                }
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
    pub(super) fn check_orphan_fields(&mut self) -> Result<()> {
        let on_lists: Vec<(u64, u32)> =
            self.inodes.iter().filter(|(_, t)| t.orphan_slot != 0).map(|(&ino, t)| (ino, t.orphan_slot - 1)).collect();
        for (ino, slot) in on_lists {
            let agno = ino_ag(ino);
            if self.ags[agno as usize].orphans.slot(slot) != ino {
                self.out.fixable(format!(
                    "inode {ino}: says it is on AG {agno} orphan slot {slot}, which does not name it"
                ));
                self.fix_inode(ino, |d| d.orphan_slot = 0)?;
            }
        }
        Ok(())
    }
}

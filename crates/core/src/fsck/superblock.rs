//! Passes 1 and 3: the superblock, its copies and the AG headers, and loading each AG's
//! bitmaps and orphan table.

use crate::buf::Block;
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::format::{agh, AgLayout, Superblock, BLOCK_SIZE, HDR_SIZE, MAGIC_AGH, MAGIC_BITMAP, MAGIC_ORPHAN};
use crate::{format, mount};

use super::space::Table;
use super::{detail, AgTables, Checker, Owner, BS};

/// The superblock a mount would use, unless its copies in AG 1 and AG 2 agree with each other
/// and not with it: then the primary's checksum is valid over damaged fields, and the copies
/// win (check_primary_superblock rewrites it).
pub(super) fn trusted_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let sb = mount::read_superblock(dev)?;
    let mut b = Box::new([0u8; BLOCK_SIZE]);
    dev.read_at(&mut b[..], 0)?;
    // A copy the primary grew from is not a rival: a grow writes the primary first.
    let rival = |c: &Superblock| *c != sb && c.geo.ag_count > 2 && !sb.grew_from(c);
    let Some(copy) = mount::backup_superblock(dev, &b[..]).filter(rival) else {
        return Ok(sb);
    };
    let second = 2 * copy.geo.ag_blocks;
    dev.read_at(&mut b[..], second * BS)?;
    Ok(if Superblock::decode(&b[..], second).is_ok_and(|c| c == copy) { copy } else { sb })
}

impl<'a> Checker<'a> {
    // ---- superblock, log, AG metadata ----------------------------------------------------

    pub(super) fn check_primary_superblock(&mut self) -> Result<()> {
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

    pub(super) fn check_ags(&mut self) -> Result<()> {
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
            Ok(copy) if self.sb.grew_from(&copy) => {
                let what =
                    format!("AG {} superblock copy (block {}) of {} blocks", l.agno, l.start, copy.geo.block_count);
                self.note_grow_left(what, l.start, self.sb.encode(l.start));
                return Ok(());
            }
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
            Ok(()) if b[HDR_SIZE..] == want[HDR_SIZE..] => return Ok(()),
            Ok(()) if self.is_header_before_grow(&b[..], l) => {
                format::seal_block(&mut want[..], 0);
                let blocks = format::get_u64(&b[..], agh::BLOCKS);
                let what = format!("AG {} header (block {}) giving it {blocks} blocks", l.agno, l.header);
                self.note_grow_left(what, l.header, want);
                return Ok(());
            }
            Ok(()) => "geometry disagrees with the superblock".into(),
        };
        self.out.fixable(format!("AG {} header (block {}): {problem}", l.agno, l.header));
        format::seal_block(&mut want[..], 0);
        self.block_writes.insert(l.header, want);
        Ok(())
    }

    /// Whether `b` is exactly what mkfs or a grow wrote for this AG when it was shorter: the
    /// header of the last AG of before a grow, which the grow had yet to rewrite.
    fn is_header_before_grow(&self, b: &[u8], l: &AgLayout) -> bool {
        let blocks = format::get_u64(b, agh::BLOCKS);
        let then = agh::build(l.header, l.agno, blocks, self.geo.inodes_per_ag, self.geo.orphan_slots_per_ag);
        blocks != l.blocks && agh::blocks_fit(blocks, l.blocks) && b[HDR_SIZE..] == then[HDR_SIZE..]
    }

    /// A block a grow left as it was before the file system grew (it rewrites them after its
    /// commit point, the primary superblock): not an error, but brought up to date by a repair.
    fn note_grow_left(&mut self, what: String, blkno: u64, now: Box<Block>) {
        let fate = if self.out.repair { "rewritten" } else { "a repair rewrites it" };
        let blocks = self.geo.block_count;
        self.out.note(format!("{what}: from before the file system grew to {blocks} blocks; {fate}"));
        self.block_writes.insert(blkno, now);
    }

    fn load_tables(&mut self, l: &AgLayout) -> Result<AgTables> {
        let block_map = Table::load(
            self.dev,
            "block bitmap",
            MAGIC_BITMAP,
            l,
            (l.block_bitmap, l.block_bitmap_blocks),
            &mut self.out,
        )?;
        let inode_map = Table::load(
            self.dev,
            "inode bitmap",
            MAGIC_BITMAP,
            l,
            (l.inode_bitmap, l.inode_bitmap_blocks),
            &mut self.out,
        )?;
        let mut orphans =
            Table::load(self.dev, "orphan table", MAGIC_ORPHAN, l, (l.orphan_table, l.orphan_blocks), &mut self.out)?;
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
}

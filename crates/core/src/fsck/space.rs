//! Allocation: the AG tables (bitmaps, orphan tables) held in memory, the block claims that
//! find cross-links, and pass 9 and 10's reconciliation of the bitmaps with what is live.

use crate::buf::Block;
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::format;
use crate::format::{
    ino_ag, ino_index, make_ino, AgLayout, Extent, Geometry, BITMAP_BITS, BLOCK_SIZE, HDR_SIZE, ORPHAN_SLOTS_PER_BLOCK,
};

use super::inodes::describe_extent;
use super::{blocks_desc, count, detail, finding, kind_name, read_inode, Checker, Claim, Findings, Owner, BS};

/// A plain set of `0..len`.
pub(super) struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    pub(super) fn new(len: u64) -> BitSet {
        BitSet { words: vec![0; len.div_ceil(64) as usize] }
    }
    pub(super) fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }
    pub(super) fn insert(&mut self, i: u64) {
        self.words[(i / 64) as usize] |= 1 << (i % 64);
    }
    pub(super) fn len(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// One AG's run of header-checked blocks (a bitmap, or the orphan table), held in memory so
/// repairs edit it in place. A block that fails verification is rebuilt: its header is
/// rewritten on write-back and its old contents are never trusted.
pub(super) struct Table {
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
    pub(super) fn load(
        dev: &dyn BlockDevice,
        what: &'static str,
        magic: u32,
        l: &AgLayout,
        (first, count): (u64, u64),
        out: &mut Findings,
    ) -> Result<Table> {
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

    pub(super) fn count_bits(&self, len: u64) -> u64 {
        (0..len).filter(|&i| self.bit(i)).count() as u64
    }

    /// Set every bit to `want(i, currently set)`; bits at and past `len` are cleared. Calls
    /// `changed(start, len, now_set)` for each run of changed bits in verified blocks (a
    /// rebuilt block's old bits mean nothing, so its changes are not findings). A run never
    /// spans `len`.
    fn reconcile(
        &mut self,
        len: u64,
        want: impl Fn(u64, bool) -> bool,
        mut changed: impl FnMut(u64, u64, bool) -> Result<()>,
    ) -> Result<()> {
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

    pub(super) fn slot(&self, s: u32) -> u64 {
        let (b, off) = slot_pos(s);
        format::get_u64(&self.blocks[b][..], off)
    }

    pub(super) fn clear_slot(&mut self, s: u32) {
        let (b, off) = slot_pos(s);
        format::put_u64(&mut self.blocks[b][..], off, 0);
        self.dirty[b] = true;
    }

    /// The occupied slots, in order.
    pub(super) fn occupied_slots(&self) -> Vec<(u32, u64)> {
        let slots = self.blocks.len() as u64 * ORPHAN_SLOTS_PER_BLOCK;
        (0..slots as u32).map(|s| (s, self.slot(s))).filter(|&(_, ino)| ino != 0).collect()
    }

    /// An orphan block that failed verification names no trustworthy inode: start it empty.
    pub(super) fn empty_invalid(&mut self) {
        for (b, valid) in self.blocks.iter_mut().zip(&self.valid) {
            if !valid {
                b[HDR_SIZE..].fill(0);
            }
        }
    }

    /// Write back the changed blocks, sealed (rebuilt ones with a fresh header).
    pub(super) fn write(&mut self, dev: &dyn BlockDevice) -> Result<()> {
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

/// Who claims block `b`, which some claim holds (claims sorted by start: the nearest one
/// before `b` holds it unless claims overlap).
fn owner_of(claims: &[Claim], b: u64) -> String {
    let before = claims.partition_point(|c| c.start <= b);
    claims[..before]
        .iter()
        .rev()
        .find(|c| c.end() > b)
        .map_or_else(|| "an unknown owner".into(), |c| c.owner.to_string())
}

/// What a leaked inode is, for the message.
fn describe_inode(dev: &dyn BlockDevice, geo: &Geometry, ino: u64) -> Result<String> {
    Ok(match read_inode(dev, geo, ino) {
        Ok((di, _)) => format!("{}, nlink {}, {}", kind_name(di.mode), di.nlink, count(di.blocks, "block", "blocks")),
        Err(e) => format!("inode that does not decode: {}", detail(&finding(e)?)),
    })
}

impl<'a> Checker<'a> {
    pub(super) fn claim(&mut self, start: u64, len: u64, owner: Owner) {
        self.claim_as(start, len, owner, None);
    }

    pub(super) fn claim_as(&mut self, start: u64, len: u64, owner: Owner, extent: Option<Extent>) {
        self.claims.push(Claim { start, len, owner });
        self.claimed.insert(start, (start + len, owner, extent));
    }

    /// A verified B+tree node is what it says it is: a data extent that claimed its block
    /// first is the wrong one, and gets a copy of its blocks instead. (Its claim stays in
    /// `claims` with no blocks, so that the positions of later claims do not move.)
    pub(super) fn claim_node(&mut self, blkno: u64, owner: Owner) {
        let first = self
            .claimed
            .range(..=blkno)
            .next_back()
            .filter(|(_, (end, _, _))| *end > blkno)
            .map(|(&start, &c)| (start, c));
        if let Some((start, (_, Owner::Inode(ino), Some(e)))) = first {
            self.out.fixable(format!(
                "inode {ino}: {} shares a block with a B+tree node of {owner}; given a copy of its own",
                describe_extent(&e)
            ));
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
    pub(super) fn claimed_by(&self, start: u64, len: u64) -> Option<Owner> {
        self.claimed
            .range(..start + len)
            .next_back()
            .filter(|(_, (end, _, _))| *end > start)
            .map(|(_, &(_, owner, _))| owner)
    }

    /// Withdraw the claims made since there were `from` (an inode being cleared).
    pub(super) fn retract_claims(&mut self, from: usize) {
        for c in self.claims.drain(from..) {
            if self.claimed.get(&c.start).is_some_and(|&(_, owner, _)| owner == c.owner) {
                self.claimed.remove(&c.start);
            }
        }
    }

    /// Whether the inode bitmap marks a (valid) inode number in use. A bitmap block that failed
    /// verification says nothing, so the answer is then yes: the safe side.
    pub(super) fn inode_allocated(&self, ino: u64) -> bool {
        let map = &self.ags[ino_ag(ino) as usize].inode_map;
        let i = u64::from(ino_index(ino));
        !map.bit_verified(i) || map.bit(i)
    }

    /// Whether a verified inode bitmap block marks the inode in use. Freed inodes keep their
    /// old images, so where the bitmap says nothing, an inode that decodes may be long gone.
    pub(super) fn inode_marked(&self, ino: u64) -> bool {
        let map = &self.ags[ino_ag(ino) as usize].inode_map;
        let i = u64::from(ino_index(ino));
        map.bit_verified(i) && map.bit(i)
    }

    pub(super) fn mark_inode(&mut self, ino: u64, used: bool) {
        self.ags[ino_ag(ino) as usize].inode_map.set_bit(u64::from(ino_index(ino)), used);
    }

    pub(super) fn set_block_bit(&mut self, blkno: u64, used: bool) {
        let l = self.geo.ag_layout(self.geo.block_ag(blkno));
        self.ags[l.agno as usize].block_map.set_bit(blkno - l.start, used);
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

    pub(super) fn check_inode_maps(&mut self) -> Result<()> {
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
                        out.fixable(format!(
                            "{what}: inode {ino} is allocated but neither reachable nor on an orphan list (leaked {})",
                            describe_inode(dev, &geo, ino)?
                        ));
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Cross-links, then each AG's block bitmap against the claims.
    pub(super) fn check_block_maps(&mut self) -> Result<()> {
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
                self.out.unfixable(format!(
                    "{}: claimed by both {} and {}",
                    blocks_desc(c.start, c.end().min(f.end()) - c.start),
                    f.owner,
                    c.owner
                ));
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
                (false, true) => out.fixable(format!(
                    "{what}: {blocks} in use by {} but marked free",
                    owner_of(claims, l.start + first)
                )),
                (false, false) => out.fixable(format!("{what}: {blocks} used but not referenced (leaked)")),
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;
    use crate::format::{MAGIC_BITMAP, MAGIC_ORPHAN};

    /// A bitmap at blocks 10.. whose verified blocks have their header (as loaded from disk).
    fn bitmap(valid: &[bool]) -> Table {
        let block = |i: u64| {
            let mut b = Box::new([0u8; BLOCK_SIZE]);
            format::init_header(&mut b[..], MAGIC_BITMAP, 10 + i, 0);
            b
        };
        let blocks = (0..valid.len() as u64).map(block).collect();
        Table {
            magic: MAGIC_BITMAP,
            agno: 0,
            first: 10,
            blocks,
            valid: valid.to_vec(),
            dirty: vec![false; valid.len()],
        }
    }

    fn runs(t: &mut Table, len: u64, want: impl Fn(u64) -> bool) -> Vec<(u64, u64, bool)> {
        let mut runs = Vec::new();
        t.reconcile(
            len,
            |i, _| want(i),
            |start, n, set| {
                runs.push((start, n, set));
                Ok(())
            },
        )
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
}

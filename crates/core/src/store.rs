//! The two ways a B+tree reaches its nodes: inside a transaction (allocations draw on the
//! transaction's reservation, changed nodes are logged) or read-only (lookups, readdir).

use crate::btree::NodeStore;
use crate::buf::BufRef;
use crate::error::{Error, Result};
use crate::format::MAGIC_BTREE;
use crate::mount::Mount;
use crate::trans::Tx;

fn read_node(m: &Mount, blkno: u64, owner: u64) -> Result<BufRef> {
    if !m.geo.is_data_range(blkno, 1) {
        return Err(Error::corrupt("btree node", blkno, "pointer outside the data area"));
    }
    m.bufs.read(blkno, "btree node", MAGIC_BTREE, Some(owner))
}

/// Tree access inside a transaction. `blocks` counts nodes allocated minus nodes freed, for
/// the owning inode's block count.
pub struct TxStore<'a, 'm> {
    pub tx: &'a mut Tx<'m>,
    owner: u64,
    goal: u64,
    pub blocks: i64,
}

impl<'a, 'm> TxStore<'a, 'm> {
    pub fn new(tx: &'a mut Tx<'m>, owner: u64, goal: u64) -> Self {
        TxStore { tx, owner, goal, blocks: 0 }
    }
}

impl NodeStore for TxStore<'_, '_> {
    fn read_node(&mut self, blkno: u64) -> Result<BufRef> {
        read_node(self.tx.mount(), blkno, self.owner)
    }
    fn new_node(&mut self) -> Result<BufRef> {
        let b = self.tx.alloc_meta_block(self.goal)?;
        self.goal = b.blkno + 1;
        self.blocks += 1;
        Ok(b)
    }
    fn free_node(&mut self, blkno: u64) -> Result<()> {
        self.tx.free_blocks(blkno, 1, true);
        self.blocks -= 1;
        Ok(())
    }
    fn dirty(&mut self, buf: &BufRef) {
        self.tx.log_buf(buf);
    }
    fn owner(&self) -> u64 {
        self.owner
    }
}

/// Read-only tree access; a tree walk that tries to change something is a bug.
pub struct ReadStore<'m> {
    m: &'m Mount,
    owner: u64,
}

impl<'m> ReadStore<'m> {
    pub fn new(m: &'m Mount, owner: u64) -> Self {
        ReadStore { m, owner }
    }
}

impl NodeStore for ReadStore<'_> {
    fn read_node(&mut self, blkno: u64) -> Result<BufRef> {
        read_node(self.m, blkno, self.owner)
    }
    fn new_node(&mut self) -> Result<BufRef> {
        Err(Error::ReadOnly)
    }
    fn free_node(&mut self, _blkno: u64) -> Result<()> {
        Err(Error::ReadOnly)
    }
    fn dirty(&mut self, _buf: &BufRef) {
        debug_assert!(false, "read-only tree walk changed a node");
    }
    fn owner(&self) -> u64 {
        self.owner
    }
}

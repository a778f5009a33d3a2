//! Extended attributes: an inode's xattr tree, its records and their value blocks.

use crate::error::Result;
use crate::format::{DiskInode, BLOCK_SIZE, MAGIC_DATA_META};
use crate::{btree, dir, format, xattr};

use super::{detail, Checker, DevStore, Owner, BS};

/// What is wrong with an xattr tree record (SPEC §14.2: keyed by its name's hash).
fn xattr_record_problem(key: u64, v: &[u8]) -> Option<String> {
    let Some(r) = xattr::decode_record(v) else {
        return Some(format!("malformed ({} bytes)", v.len()));
    };
    (key >> 16 != dir::name_hash(r.name)).then(|| "key outside its name's hash range".into())
}

impl<'a> Checker<'a> {
    /// Verify the xattr tree, its records and their value blocks; returns the blocks it owns.
    /// A damaged tree, record or value block loses the inode's tree-held xattrs (the tree is
    /// dropped and its blocks are freed), not the inode.
    pub(super) fn check_xattrs(&mut self, ino: u64, di: &DiskInode) -> Result<u64> {
        let claims_before = self.claims.len();
        let mut damage = self.check_tree(ino, "xattr", di.xattr_root)?.err();
        let mut value_blocks = Vec::new();
        if damage.is_none() {
            let (dev, geo) = (self.dev, self.geo);
            btree::range(&mut DevStore::new(dev, &geo, ino), di.xattr_root, 0, &mut |key, v| {
                damage = xattr_record_problem(key, v).map(|why| format!("xattr record {key:#x}: {why}"));
                if damage.is_none() {
                    value_blocks
                        .extend(xattr::decode_record(v).into_iter().flat_map(|r| r.value.blocks().collect::<Vec<_>>()));
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
            damage = format::verify_block(&b, "xattr value block", MAGIC_DATA_META, blkno, Some(ino))
                .err()
                .map(|e| format!("xattr value block {blkno}: {}", detail(&e)));
        }
        let Some(why) = damage else {
            return Ok(self.claims[claims_before..].iter().map(|c| c.len).sum());
        };
        self.out.fixable(format!("inode {ino}: {why}; its xattr tree is dropped"));
        self.retract_claims(claims_before);
        self.fix_inode(ino, |d| d.xattr_root = 0)?;
        Ok(0)
    }
}

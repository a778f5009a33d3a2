//! Extended attributes: an inode's xattr tree, its records and their value blocks.

use crate::acl::{Acl, AclKind};
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

/// What is wrong with a stored POSIX ACL (SPEC §14.4), if `name` is one: the engine stores
/// only valid ACLs with entries, and a default ACL only on a directory.
fn acl_problem(name: &[u8], value: &[u8], is_dir: bool) -> Option<String> {
    let kind = AclKind::of(name)?;
    let what = String::from_utf8_lossy(name);
    match Acl::decode(value) {
        _ if kind == AclKind::Default && !is_dir => Some(format!("{what} on a file that is no directory")),
        Ok(Some(_)) => None,
        Ok(None) => Some(format!("{what} with no entries")),
        Err(e) => Some(format!("{what} malformed: {e}")),
    }
}

impl<'a> Checker<'a> {
    /// Verify the xattr tree, its records and their value blocks; returns the blocks it owns.
    /// A damaged tree, record or value block loses the inode's tree-held xattrs (the tree is
    /// dropped and its blocks are freed), not the inode.
    pub(super) fn check_xattrs(&mut self, ino: u64, di: &DiskInode) -> Result<u64> {
        // No valid ACL fits the inline area (its name alone takes 23 of the 48 bytes).
        let inline = xattr::inline_entries(di);
        if let Some(why) = inline.iter().find_map(|(name, value)| acl_problem(name, value, di.is_dir())) {
            self.out.fixable(format!("inode {ino}: inline {why}; its inline xattrs are dropped"));
            self.fix_inode(ino, |d| d.xattr_inline.clear())?;
        }
        let claims_before = self.claims.len();
        let mut damage = self.check_tree(ino, "xattr", di.xattr_root)?.err();
        let mut value_blocks = Vec::new();
        // ACLs whose values live in value blocks: checked once the blocks are.
        let mut remote_acls = Vec::new();
        if damage.is_none() {
            let (dev, geo) = (self.dev, self.geo);
            btree::range(&mut DevStore::new(dev, &geo, ino), di.xattr_root, 0, &mut |key, v| {
                damage = xattr_record_problem(key, v).map(|why| format!("xattr record {key:#x}: {why}"));
                if let (None, Some(r)) = (&damage, xattr::decode_record(v)) {
                    match r.value {
                        xattr::Value::Local(value) => damage = acl_problem(r.name, value, di.is_dir()),
                        remote if AclKind::of(r.name).is_some() => {
                            remote_acls.push((r.name.to_vec(), remote.size(), remote.blocks().collect::<Vec<_>>()))
                        }
                        _ => {}
                    }
                    value_blocks.extend(r.value.blocks());
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
        for (name, len, blocks) in &remote_acls {
            if damage.is_some() {
                break;
            }
            let mut value = Vec::with_capacity(*len);
            let mut b = vec![0u8; BLOCK_SIZE];
            for &blkno in blocks {
                self.dev.read_at(&mut b, blkno * BS)?;
                let take = (len - value.len()).min(xattr::VALUE_BLOCK_BYTES);
                value.extend_from_slice(&b[format::HDR_SIZE..format::HDR_SIZE + take]);
            }
            damage = acl_problem(name, &value, di.is_dir());
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

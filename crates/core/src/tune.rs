//! Change the identity (label, UUID) of an unmounted image: `ferrofs tune`, after tune2fs
//! `-L`/`-U` and xfs_admin. The UUID is in no other structure (block headers carry their own
//! number and owner, not the file system's UUID), so a new one costs one superblock write per
//! AG, like the label; docs/DESIGN.md "Label and UUID" gives the crash cases of the order.

use crate::dev::{BlockDevice, SECTOR_SIZE};
use crate::error::{Error, Result};
use crate::format::sb::{check_label, put_identity, IDENTITY_END};
use crate::format::{Superblock, BLOCK_SIZE};

// The identity must lie in the sector the media write whole (the format cannot name the
// device layer, so the rule is checked here, where both meet).
const _: () = assert!(IDENTITY_END as u64 <= SECTOR_SIZE);

/// What to change; `None` keeps the current value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The new label ("" removes it).
    pub label: Option<String>,
    /// The new UUID.
    pub uuid: Option<[u8; 16]>,
}

/// Rewrite every superblock of the image on `dev` with `new`'s fields, and return the
/// superblock as it now is. The image must not be mounted, and its superblocks must agree
/// (else [`Error::Corrupt`] names the first that does not: fsck makes them agree).
pub fn set_identity(dev: &dyn BlockDevice, new: &Identity) -> Result<Superblock> {
    let old = read_agreeing_superblocks(dev)?;
    let mut sb = old.clone();
    if let Some(label) = &new.label {
        check_label(label).map_err(Error::Invalid)?;
        sb.label = label.clone();
    }
    if let Some(uuid) = new.uuid {
        sb.uuid = uuid;
    }
    if sb == old {
        return Ok(sb);
    }
    for group in write_order(sb.geo.ag_count) {
        for agno in group {
            rewrite(dev, &old, &sb, agno)?;
        }
        dev.flush()?;
    }
    Ok(sb)
}

/// The copies beyond AG 2, then AG 1's, the primary, and AG 2's, each group durable before
/// the next. Mount reads the primary, else AG 1's copy; fsck takes AG 1's and AG 2's copies
/// over a primary they both differ from. So after a crash at any point both see the same
/// identity: the old one until the primary is written, the new one once it is (a torn write
/// of it is one or the other whole: only its first sector changes), and fsck repairs the rest
/// to match.
fn write_order(ag_count: u32) -> impl Iterator<Item = std::ops::Range<u32>> {
    let n = ag_count;
    [3.min(n)..n, 1.min(n)..2.min(n), 0..1, 2.min(n)..3.min(n)].into_iter().filter(|g| !g.is_empty())
}

fn read_agreeing_superblocks(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_at(&mut b, 0)?;
    let sb = Superblock::decode(&b, 0)?;
    for agno in 1..sb.geo.ag_count {
        let start = sb.geo.ag_layout(agno).start;
        dev.read_at(&mut b, start * BLOCK_SIZE as u64)?;
        match Superblock::decode(&b, start) {
            Ok(copy) if copy == sb => {}
            Ok(_) => return Err(Error::corrupt("superblock", start, "this AG's copy differs from the primary")),
            Err(e) => return Err(e),
        }
    }
    Ok(sb)
}

/// Put the new identity into the superblock of AG `agno` as it is on disk: only its first
/// sector changes, which the media write whole, so a torn write leaves the old block or the
/// new one.
fn rewrite(dev: &dyn BlockDevice, old: &Superblock, new: &Superblock, agno: u32) -> Result<()> {
    let blkno = new.geo.ag_layout(agno).start;
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_at(&mut b, blkno * BLOCK_SIZE as u64)?;
    if Superblock::decode(&b, blkno).ok().as_ref() != Some(old) {
        return Err(Error::corrupt("superblock", blkno, "changed while being retuned"));
    }
    let before = b.clone();
    put_identity(&mut b, &new.uuid, &new.label);
    debug_assert_eq!(b[IDENTITY_END..], before[IDENTITY_END..]);
    debug_assert_eq!(Superblock::decode(&b, blkno).ok().as_ref(), Some(new));
    dev.write_at(&b, blkno * BLOCK_SIZE as u64)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{crash_image_torn, crash_points, keep_sets, CrashDevice, MemDevice, Op, Tear};
    use crate::fsck::{check, FsckOptions};
    use crate::mkfs::{mkfs, MkfsOptions};
    use crate::mount::read_superblock;
    use crate::LABEL_MAX;

    fn image(ags: u32, label: &str) -> (MemDevice, Superblock) {
        let dev = MemDevice::new(32 << 20);
        let opts = MkfsOptions { ag_count: Some(ags), label: label.into(), ..MkfsOptions::default() };
        let sb = mkfs(&dev, &opts, &|_, _| {}).unwrap();
        assert_eq!(sb.geo.ag_count, ags);
        (dev, sb)
    }

    fn fsck_repair(dev: &dyn BlockDevice) -> crate::fsck::FsckReport {
        check(dev, &FsckOptions { repair: true }, &|_, _, _| {}).unwrap()
    }

    #[test]
    fn every_copy_gets_the_new_identity_and_nothing_else_changes() {
        let (dev, before) = image(4, "old");
        let uuid = *b"0123456789abcdef";
        let after = set_identity(&dev, &Identity { label: Some("data ünd more".into()), uuid: Some(uuid) }).unwrap();
        assert_eq!((after.label.as_str(), after.uuid), ("data ünd more", uuid));
        assert_eq!((after.geo, after.mkfs_time), (before.geo, before.mkfs_time));
        let mut b = vec![0u8; BLOCK_SIZE];
        for agno in 0..4 {
            let start = after.geo.ag_layout(agno).start;
            dev.read_at(&mut b, start * BLOCK_SIZE as u64).unwrap();
            assert_eq!(Superblock::decode(&b, start).unwrap(), after, "AG {agno}");
        }
        assert!(check(&dev, &FsckOptions::default(), &|_, _, _| {}).unwrap().is_clean());
        // Only the label: the UUID stays; "" removes the label.
        let cleared = set_identity(&dev, &Identity { label: Some(String::new()), uuid: None }).unwrap();
        assert_eq!((cleared.label.as_str(), cleared.uuid), ("", uuid));
        assert_eq!(read_superblock(&dev).unwrap(), cleared);
    }

    #[test]
    fn bad_labels_and_disagreeing_copies_are_refused_untouched() {
        let (dev, sb) = image(3, "");
        let long = "x".repeat(LABEL_MAX + 1);
        for bad in [long.as_str(), "a\0b"] {
            let e = set_identity(&dev, &Identity { label: Some(bad.into()), uuid: None }).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL, "{e}");
        }
        assert!(set_identity(&dev, &Identity { label: Some("x".repeat(LABEL_MAX)), uuid: None }).is_ok());
        // A copy that differs from the primary: fsck's business, not tune's.
        let copy = sb.geo.ag_layout(2).start;
        let stale = Superblock { label: "stale".into(), ..sb };
        dev.write_at(&stale.encode(copy)[..], copy * BLOCK_SIZE as u64).unwrap();
        let e = set_identity(&dev, &Identity { label: Some("new".into()), uuid: None }).unwrap_err();
        assert!(e.to_string().contains("differs from the primary"), "{e}");
        assert_eq!(read_superblock(&dev).unwrap().label, "x".repeat(LABEL_MAX));
    }

    /// After a crash anywhere in a retune (any subset of a flush's writes, any write torn at
    /// sector boundaries), mount and fsck agree on one identity, old or new, and fsck leaves
    /// every copy holding it.
    #[test]
    fn a_crash_leaves_the_old_identity_or_the_new_one_everywhere() {
        for ags in [1, 2, 3, 5] {
            let (base, old) = image(ags, "before");
            let dev = CrashDevice::new(base.snapshot());
            let new = set_identity(&dev, &Identity { label: Some("after".into()), uuid: Some([7; 16]) }).unwrap();
            let ops = dev.ops();
            let mut cases = 0;
            for c in crash_points(&ops) {
                for keep in keep_sets(&ops, c, c as u64, 8) {
                    let writes = crate::dev::unflushed_epoch(&ops, c).filter(|&i| matches!(ops[i], Op::Write { .. }));
                    let tears = writes.flat_map(|op| [0b1, 0b1111_1110].map(|sectors| Some(Tear { op, sectors })));
                    for tear in [None].into_iter().chain(tears) {
                        let image = crash_image_torn(&base, &ops, c, &|i| keep.contains(&i), tear);
                        let mounted = read_superblock(&image).unwrap();
                        assert!(mounted == old || mounted == new, "{ags} AGs, crash at {c} {keep:?} {tear:?}");
                        let report = fsck_repair(&image);
                        assert_eq!(report.errors_found, report.errors_fixed, "{:?}", report.messages);
                        assert_eq!(read_superblock(&image).unwrap(), mounted, "fsck chose another identity");
                        assert!(fsck_repair(&image).is_clean());
                        cases += 1;
                    }
                }
            }
            assert!(cases > ags as usize, "{ags} AGs: only {cases} crash cases");
        }
    }
}

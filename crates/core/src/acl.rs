//! POSIX access control lists, as Linux's local file systems keep them (ext4, XFS with
//! `acl`): the access ACL and a directory's default ACL are the extended attributes
//! `system.posix_acl_access` and `system.posix_acl_default`, each in the kernel's xattr form
//! (`struct posix_acl_xattr_header`, version 2, then 8-byte entries; SPEC §14.4).
//!
//! The rules are the kernel's (fs/posix_acl.c), named after its functions: the access ACL's
//! owner, group-or-mask and other entries are the mode's permission bits
//! ([`Acl::equiv_mode`], [`Acl::chmod`]); a new inode inherits its directory's default ACL
//! ([`Acl::create_masq`]); access is granted by [`Acl::permits`].

use crate::error::{Error, Result};

/// The access ACL's xattr name.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The default ACL's xattr name (directories only).
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`: the only header version there is.
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;
/// Most entries an ACL may have: what fits the kernel's one-page buffer (it refuses a
/// larger ACL with E2BIG, and FUSE reads ACLs into one page).
pub const ENTRIES_MAX: usize = (4096 - HEADER_BYTES) / ENTRY_BYTES;
/// The id the kernel writes in entries that name nobody (`ACL_UNDEFINED_ID`).
const UNDEFINED_ID: u32 = u32::MAX;

/// The entry tags (`ACL_USER_OBJ` ...), in the order a valid ACL lists them.
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

const RWX: u16 = 0o7;

/// One entry: a tag, the permissions (read 4, write 2, execute 1) and, for a named user or
/// group, its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A valid ACL: owner, named users by ascending uid, owning group, named groups by
/// ascending gid, the mask (required when any name is present), other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Which ACL an xattr name is, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclKind {
    /// `system.posix_acl_access`.
    Access,
    /// `system.posix_acl_default`.
    Default,
}

impl AclKind {
    /// The ACL an xattr `name` holds; None for any other name.
    pub fn of(name: &[u8]) -> Option<AclKind> {
        match name {
            ACCESS_XATTR => Some(AclKind::Access),
            DEFAULT_XATTR => Some(AclKind::Default),
            _ => None,
        }
    }
}

impl Acl {
    /// Decode and validate an xattr value (`posix_acl_from_xattr` then `posix_acl_valid`).
    /// None for a header with no entries, which setting takes as removing the ACL. EINVAL
    /// for a length that is no whole number of entries, an unknown tag or permission bit,
    /// entries out of order, a repeated name, or names without a mask; EOPNOTSUPP for
    /// another version, as the kernel answers.
    pub fn decode(value: &[u8]) -> Result<Option<Acl>> {
        let header = value.get(..HEADER_BYTES).ok_or(Error::Invalid("ACL shorter than its header"))?;
        if u32::from_le_bytes(header.try_into().unwrap()) != VERSION {
            return Err(Error::NotSupported);
        }
        let body = &value[HEADER_BYTES..];
        if !body.len().is_multiple_of(ENTRY_BYTES) {
            return Err(Error::Invalid("ACL length not a whole number of entries"));
        }
        if body.is_empty() {
            return Ok(None);
        }
        if body.len() / ENTRY_BYTES > ENTRIES_MAX {
            return Err(Error::TooBig);
        }
        let entries = body
            .chunks_exact(ENTRY_BYTES)
            .map(|e| {
                let tag = u16::from_le_bytes([e[0], e[1]]);
                let named = tag == USER || tag == GROUP;
                let id = if named { u32::from_le_bytes(e[4..8].try_into().unwrap()) } else { UNDEFINED_ID };
                Entry { tag, perm: u16::from_le_bytes([e[2], e[3]]), id }
            })
            .collect();
        let acl = Acl { entries };
        acl.validate()?;
        Ok(Some(acl))
    }

    /// The xattr value (`posix_acl_to_xattr`): ids of unnamed entries as `ACL_UNDEFINED_ID`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        debug_assert!(Acl::decode(&out).is_ok_and(|a| a.as_ref() == Some(self)));
        out
    }

    /// `posix_acl_valid`, stricter in one point: named entries must be sorted and unique
    /// (as libacl always writes them), so that each caller matches at most one.
    fn validate(&self) -> Result<()> {
        let bad = |why| Err(Error::Invalid(why));
        let mut last: Option<Entry> = None;
        let mut named = false;
        for e in &self.entries {
            if e.perm & !RWX != 0 {
                return bad("ACL permission bits");
            }
            if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag) {
                return bad("ACL entry tag");
            }
            let in_order = match last {
                None => e.tag == USER_OBJ,
                Some(prev) => {
                    prev.tag < e.tag || (prev.tag == e.tag && matches!(e.tag, USER | GROUP) && prev.id < e.id)
                }
            };
            if !in_order {
                return bad("ACL entries out of order or repeated");
            }
            named |= matches!(e.tag, USER | GROUP);
            last = Some(*e);
        }
        let has = |tag| self.entries.iter().any(|e| e.tag == tag);
        if !has(GROUP_OBJ) || !has(OTHER) {
            return bad("ACL without its owning group or other entry");
        }
        if named && !has(MASK) {
            return bad("ACL names users or groups but has no mask");
        }
        Ok(())
    }

    /// The minimal ACL a mode stands for (owner, group, other).
    pub fn from_mode(mode: u16) -> Acl {
        let entry = |tag, shift: u16| Entry { tag, perm: (mode >> shift) & RWX, id: UNDEFINED_ID };
        Acl { entries: vec![entry(USER_OBJ, 6), entry(GROUP_OBJ, 3), entry(OTHER, 0)] }
    }

    fn find(&self, tag: u16) -> Option<&Entry> {
        self.entries.iter().find(|e| e.tag == tag)
    }

    fn perm_of(&self, tag: u16) -> u16 {
        self.find(tag).map_or(0, |e| e.perm)
    }

    /// `posix_acl_equiv_mode`: the permission bits this ACL sets in `mode` (the mask stands
    /// for the group class when there is one), and whether the mode alone says as much — a
    /// minimal ACL, which is then stored as the mode only.
    pub fn equiv_mode(&self, mode: u16) -> (u16, bool) {
        let group = self.find(MASK).unwrap_or_else(|| self.find(GROUP_OBJ).expect("valid ACL"));
        let perms = (self.perm_of(USER_OBJ) << 6) | (group.perm << 3) | self.perm_of(OTHER);
        let minimal = self.entries.len() == 3;
        ((mode & !0o777) | perms, minimal)
    }

    /// `posix_acl_chmod`: the mode's permission bits into the owner, mask (else owning group)
    /// and other entries.
    pub fn chmod(&mut self, mode: u16) {
        let group_tag = if self.find(MASK).is_some() { MASK } else { GROUP_OBJ };
        for e in &mut self.entries {
            match e.tag {
                USER_OBJ => e.perm = (mode >> 6) & RWX,
                OTHER => e.perm = mode & RWX,
                t if t == group_tag => e.perm = (mode >> 3) & RWX,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: a directory's default ACL made the access ACL of a new inode
    /// of `mode` — each class limited by the mode, the mode by each class. Returns the new
    /// mode; `self` is the new access ACL (store it unless [`Acl::equiv_mode`] says minimal).
    pub fn create_masq(&mut self, mode: u16) -> u16 {
        let mut perms = mode & 0o777;
        let group_tag = if self.find(MASK).is_some() { MASK } else { GROUP_OBJ };
        for e in &mut self.entries {
            let shift = match e.tag {
                USER_OBJ => 6,
                OTHER => 0,
                t if t == group_tag => 3,
                _ => continue,
            };
            e.perm &= (perms >> shift) & RWX;
            perms &= !(RWX << shift) | (e.perm << shift);
        }
        (mode & !0o777) | perms
    }

    /// `posix_acl_permission`: may a caller who is not the owner (the kernel decides the
    /// owner by the mode first) do `want` (read 4, write 2, execute 1)? A named user gets its
    /// entry under the mask; a member of the owning group or of named groups gets any one of
    /// those entries that grants all of `want`, under the mask, and nothing if none does;
    /// anyone else gets the other entry.
    pub fn permits(&self, uid: u32, in_group: &dyn Fn(u32) -> bool, owner_gid: u32, want: u16) -> bool {
        debug_assert!(want & !RWX == 0);
        let masked = |perm: u16| perm & self.find(MASK).map_or(RWX, |m| m.perm) & want == want;
        if let Some(user) = self.entries.iter().find(|e| e.tag == USER && e.id == uid) {
            return masked(user.perm);
        }
        let mut member = false;
        for e in &self.entries {
            let is_member = match e.tag {
                GROUP_OBJ => in_group(owner_gid),
                GROUP => in_group(e.id),
                _ => false,
            };
            if is_member {
                member = true;
                if e.perm & want == want {
                    return masked(e.perm);
                }
            }
        }
        !member && self.perm_of(OTHER) & want == want
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ACL as getfacl's short form would list it: (tag, id, perm).
    fn acl(entries: &[(u16, u32, u16)]) -> Acl {
        Acl { entries: entries.iter().map(|&(tag, id, perm)| Entry { tag, perm, id }).collect() }
    }

    fn bytes(entries: &[(u16, u32, u16)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(tag, id, perm) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    const U: u32 = UNDEFINED_ID;

    #[test]
    fn decode_round_trips_and_refuses_every_malformed_form() {
        let good = [(USER_OBJ, U, 6), (USER, 1000, 7), (GROUP_OBJ, U, 4), (MASK, U, 6), (OTHER, U, 0)];
        let a = Acl::decode(&bytes(&good)).unwrap().unwrap();
        assert_eq!(a, acl(&good));
        assert_eq!(a.encode(), bytes(&good));
        // Unnamed entries' ids are ignored on input and written as undefined.
        let sloppy = Acl::decode(&bytes(&[(USER_OBJ, 5, 6), (GROUP_OBJ, 9, 4), (OTHER, 0, 4)])).unwrap().unwrap();
        assert_eq!(sloppy.encode(), bytes(&[(USER_OBJ, U, 6), (GROUP_OBJ, U, 4), (OTHER, U, 4)]));
        assert_eq!(Acl::decode(&bytes(&[])).unwrap(), None, "no entries: remove");
        let invalid = |v: &[u8]| matches!(Acl::decode(v), Err(Error::Invalid(_)));
        assert!(invalid(&[2, 0]), "short header");
        assert!(matches!(Acl::decode(&[1, 0, 0, 0]), Err(Error::NotSupported)), "version 1");
        assert!(invalid(&bytes(&good)[..bytes(&good).len() - 1]), "a torn entry");
        assert!(invalid(&bytes(&[(USER_OBJ, U, 8), (GROUP_OBJ, U, 4), (OTHER, U, 4)])), "perm bit 8");
        assert!(invalid(&bytes(&[(USER_OBJ, U, 6), (0x40, U, 4), (GROUP_OBJ, U, 4), (OTHER, U, 4)])), "tag");
        assert!(invalid(&bytes(&[(GROUP_OBJ, U, 4), (USER_OBJ, U, 6), (OTHER, U, 4)])), "order");
        assert!(invalid(&bytes(&[(USER_OBJ, U, 6), (USER_OBJ, U, 6), (GROUP_OBJ, U, 4), (OTHER, U, 4)])));
        assert!(invalid(&bytes(&[(USER_OBJ, U, 6), (GROUP_OBJ, U, 4)])), "no other");
        assert!(invalid(&bytes(&[(USER_OBJ, U, 6), (OTHER, U, 4)])), "no owning group");
        assert!(invalid(&bytes(&[(USER_OBJ, U, 6), (USER, 7, 4), (GROUP_OBJ, U, 4), (OTHER, U, 4)])), "no mask");
        let dup = [(USER_OBJ, U, 6), (USER, 7, 4), (USER, 7, 6), (GROUP_OBJ, U, 4), (MASK, U, 6), (OTHER, U, 4)];
        assert!(invalid(&bytes(&dup)), "a user named twice");
        let mut big = vec![(USER_OBJ, U, 6)];
        big.extend((0..ENTRIES_MAX as u32).map(|id| (USER, id, 4)));
        big.extend([(GROUP_OBJ, U, 4), (MASK, U, 4), (OTHER, U, 4)]);
        assert!(matches!(Acl::decode(&bytes(&big)), Err(Error::TooBig)));
        assert!(Acl::decode(&bytes(
            &big[..ENTRIES_MAX - 3].iter().chain(&big[big.len() - 3..]).copied().collect::<Vec<_>>()
        ))
        .is_ok());
    }

    #[test]
    fn mode_sync() {
        let minimal = Acl::from_mode(0o754);
        assert_eq!(minimal.equiv_mode(0o104000), (0o104754, true));
        let mut a = acl(&[(USER_OBJ, U, 7), (USER, 5, 7), (GROUP_OBJ, U, 5), (MASK, U, 6), (OTHER, U, 1)]);
        // The mask is the group class.
        assert_eq!(a.equiv_mode(0o100000), (0o100761, false));
        a.chmod(0o640);
        assert_eq!(a, acl(&[(USER_OBJ, U, 6), (USER, 5, 7), (GROUP_OBJ, U, 5), (MASK, U, 4), (OTHER, U, 0)]));
        let mut m = Acl::from_mode(0o777);
        m.chmod(0o750);
        assert_eq!(m, Acl::from_mode(0o750));
    }

    #[test]
    fn inheritance_masks_both_ways() {
        // setfacl -d -m u::rwx,u:5:rwx,g::r-x,m::rwx,o::r-x on the parent; creat(0666).
        let mut a = acl(&[(USER_OBJ, U, 7), (USER, 5, 7), (GROUP_OBJ, U, 5), (MASK, U, 7), (OTHER, U, 5)]);
        assert_eq!(a.create_masq(0o100666), 0o100664);
        assert_eq!(a, acl(&[(USER_OBJ, U, 6), (USER, 5, 7), (GROUP_OBJ, U, 5), (MASK, U, 6), (OTHER, U, 4)]));
        let mut d = Acl::from_mode(0o750);
        assert_eq!(d.create_masq(0o40777), 0o40750);
        assert_eq!(d.equiv_mode(0o40750), (0o40750, true));
    }

    #[test]
    fn permission_as_posix_acl_permission() {
        let a = acl(&[(USER_OBJ, U, 7), (USER, 10, 6), (GROUP_OBJ, U, 4), (GROUP, 30, 2), (MASK, U, 4), (OTHER, U, 7)]);
        let none = |_| false;
        // A named user: its entry under the mask.
        assert!(a.permits(10, &none, 20, 4));
        assert!(!a.permits(10, &none, 20, 2), "write masked out");
        // Owning group member: read granted; write by no group entry, and other is not tried.
        let in20 = |g| g == 20;
        assert!(a.permits(11, &in20, 20, 4));
        assert!(!a.permits(11, &in20, 20, 2));
        // Named group 30 grants write, but the mask takes it away.
        let in30 = |g| g == 30;
        assert!(!a.permits(11, &in30, 20, 2));
        // Nobody matched: other.
        assert!(a.permits(12, &none, 20, 7));
        assert!(AclKind::of(b"system.posix_acl_access") == Some(AclKind::Access));
        assert!(AclKind::of(b"user.x").is_none());
    }
}

//! Pass 4's tree walk (directories, entries, names), pass 6's reconnection into /lost+found
//! and pass 8's link counts.

use std::collections::HashSet;
use std::fmt;

use crate::error::{Error, Result};
use crate::format::inode::S_IFDIR;
use crate::format::{make_ino, DiskInode, INODE_SIZE, NAME_MAX, ROOT_INO};
use crate::{btree, dir, format, mkfs};

use super::{count, detail, finding, ftype_of, kind_name, read_inode, Checker, DevStore, DirEdit, InodeFix, Tally};

/// Where disconnected inodes are reconnected, in the root.
const LOST_FOUND: &[u8] = b"lost+found";

/// One directory entry being checked: `ino u64 | file type u8 | name` (see `dir`).
struct DirEntryRef<'v> {
    dir: u64,
    key: u64,
    value: &'v [u8],
    ino: u64,
    ftype: u8,
    name: &'v [u8],
}

impl<'v> DirEntryRef<'v> {
    fn parse(dir: u64, key: u64, value: &'v [u8]) -> Option<Self> {
        (value.len() >= 10 && value.len() <= 9 + NAME_MAX).then(|| DirEntryRef {
            dir,
            key,
            value,
            ino: format::get_u64(value, 0),
            ftype: value[8],
            name: &value[9..],
        })
    }
}

impl fmt::Display for DirEntryRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "directory {} entry {:?}", self.dir, String::from_utf8_lossy(self.name))
    }
}

/// What an entry's inode number leads to.
enum Target {
    /// Nothing: the entry goes. The string says why.
    Nothing(String),
    /// An allocated inode that does not decode.
    Unreadable(Error),
    /// An inode the walk has already seen.
    Live,
    /// An inode seen for the first time.
    New(Box<DiskInode>),
}

/// What scanning one directory's entries found.
#[derive(Default)]
struct DirScan {
    entries: u64,
    /// Keys of the entries the repair removes.
    remove: Vec<u64>,
    /// Entries the repair rewrites with the right file type.
    retype: Vec<(u64, Vec<u8>)>,
    /// The hash bucket being scanned and the names seen in it (entries arrive in key order).
    bucket: u64,
    bucket_names: HashSet<Vec<u8>>,
}

impl<'a> Checker<'a> {
    // ---- the tree walk -------------------------------------------------------------------

    pub(super) fn walk_tree(&mut self) -> Result<()> {
        let root = match read_inode(self.dev, &self.geo, ROOT_INO) {
            Ok((di, _)) if di.is_dir() => di,
            Ok((di, _)) => return self.recreate_root(&format!("is a {}, not a directory", kind_name(di.mode))),
            Err(e) => {
                let e = finding(e)?;
                return self.recreate_root(&detail(&e));
            }
        };
        self.inodes.insert(ROOT_INO, Tally::new(&root, true));
        if root.parent != ROOT_INO {
            self.out.fixable(format!("directory {ROOT_INO} (root): '..' is {}, not itself", root.parent));
            self.fix_inode(ROOT_INO, |d| d.parent = ROOT_INO)?;
        }
        self.pending_dirs.push((ROOT_INO, root));
        self.drain_dirs()
    }

    /// A root that cannot be read is replaced by an empty one, as mkfs makes it. Nothing of
    /// the old one is claimed, so what it owned is freed; what it named is reconnected.
    fn recreate_root(&mut self, why: &str) -> Result<()> {
        self.out.fixable(format!("root inode {ROOT_INO}: {why}; recreated empty (what it named goes to /lost+found)"));
        let mut root = DiskInode::new(S_IFDIR | 0o755, 0, 0, mkfs::now(), 1);
        root.nlink = 2;
        root.parent = ROOT_INO;
        self.new_inode(ROOT_INO, root);
        self.dir_edits.insert(ROOT_INO, DirEdit { rebuild: Some(Vec::new()), ..DirEdit::default() });
        Ok(())
    }

    /// Record an inode the repair creates: live, reachable, written whole.
    fn new_inode(&mut self, ino: u64, di: DiskInode) {
        self.inodes.insert(ino, Tally::new(&di, true));
        self.inode_fixes.insert(ino, InodeFix { di, lsn: 0 });
        self.mark_inode(ino, true);
    }

    pub(super) fn drain_dirs(&mut self) -> Result<()> {
        while let Some((ino, di)) = self.pending_dirs.pop() {
            self.check_dir(ino, &di)?;
            (self.progress)("inodes", self.inodes.len() as u64, self.allocated_inodes);
        }
        Ok(())
    }

    /// Check a directory's tree and entries. A tree that fails its check is rebuilt from the
    /// entries of the leaves still readable; the entries of lost leaves are gone, and the
    /// inodes only they named are reconnected later. All tree changes wait in `dir_edits`
    /// until every block's owner is known (a rebuild needs free blocks).
    fn check_dir(&mut self, ino: u64, di: &DiskInode) -> Result<()> {
        let xattr_nodes = self.check_xattrs(ino, di)?;
        let root = dir::root_of(di);
        let mut edit = DirEdit { xattr_nodes, ..DirEdit::default() };
        let nodes = match self.check_tree(ino, "directory", root)? {
            Ok(nodes) => nodes,
            Err(why) => {
                let mut salvaged = Vec::new();
                let lost = btree::salvage(&mut DevStore::new(self.dev, &self.geo, ino), root, &mut |k, v| {
                    salvaged.push((k, v.to_vec()))
                })?;
                let kept = count(salvaged.len() as u64, "entry", "entries");
                self.out.fixable(format!(
                    "inode {ino}: {why}; rebuilt from its readable leaves ({kept} kept, {} lost)",
                    count(lost, "node", "nodes")
                ));
                edit.rebuild = Some(salvaged);
                0
            }
        };
        if root != 0 && self.inodes.get(&ino).is_some_and(|t| !t.reachable) {
            self.out.fixable(format!(
                "directory {ino}: unlinked, but still has entries (removed; what they name is reconnected)"
            ));
            edit.rebuild = Some(Vec::new());
            self.dir_edits.insert(ino, edit);
            return Ok(());
        }
        let mut scan = DirScan::default();
        match &edit.rebuild {
            Some(entries) => {
                entries.iter().try_for_each(|(key, value)| self.check_entry(ino, *key, value, &mut scan))?
            }
            None => self.scan_entries(ino, root, &mut scan)?,
        }
        if edit.rebuild.is_none() {
            self.check_dir_counts(ino, di, &scan, nodes + xattr_nodes)?;
        }
        edit.remove = scan.remove;
        edit.replace = scan.retype;
        self.dir_edits.insert(ino, edit);
        Ok(())
    }

    /// A directory's size is its entry count and its `blocks` the nodes it owns. With entries
    /// to remove, the edit fixes both once it is applied.
    fn check_dir_counts(&mut self, ino: u64, di: &DiskInode, scan: &DirScan, owned: u64) -> Result<()> {
        if di.size != scan.entries {
            self.out.fixable(format!(
                "directory {ino}: size {} but {}",
                di.size,
                count(scan.entries, "entry", "entries")
            ));
        }
        if owned != di.blocks {
            self.out.fixable(format!("inode {ino}: blocks {} but owns {owned}", di.blocks));
        }
        if scan.remove.is_empty() && scan.retype.is_empty() && (di.size != scan.entries || owned != di.blocks) {
            self.fix_inode(ino, |d| {
                d.size = scan.entries;
                d.blocks = owned;
            })?;
        }
        Ok(())
    }

    fn scan_entries(&mut self, dir: u64, root: u64, scan: &mut DirScan) -> Result<()> {
        let (dev, geo) = (self.dev, self.geo);
        btree::range(&mut DevStore::new(dev, &geo, dir), root, 0, &mut |key, value| {
            self.check_entry(dir, key, value, scan)?;
            Ok(true)
        })
    }

    /// Check one entry; one that is malformed, misnamed or names nothing is removed (the inode
    /// it named, if intact and named nowhere else, is reconnected later).
    fn check_entry(&mut self, dir: u64, key: u64, value: &[u8], scan: &mut DirScan) -> Result<()> {
        scan.entries += 1;
        let Some(e) = DirEntryRef::parse(dir, key, value) else {
            self.out.fixable(format!("directory {dir}: entry {key:#x} is malformed ({} bytes); removed", value.len()));
            scan.remove.push(key);
            return Ok(());
        };
        if let Some(why) = self.entry_name_problem(&e, scan) {
            self.out.fixable(format!("{e}: {why}; removed"));
            scan.remove.push(key);
            return Ok(());
        }
        match self.resolve(e.ino)? {
            Target::Nothing(why) => {
                self.out.fixable(format!("{e}: {why}"));
                scan.remove.push(key);
            }
            Target::Unreadable(err) => {
                self.out.fixable(format!("{e}: inode {}: {}; inode cleared, entry removed", e.ino, detail(&err)));
                self.clear_inode(e.ino);
                scan.remove.push(key);
            }
            Target::Live => self.add_name(&e, scan),
            Target::New(di) => {
                let is_dir = di.is_dir();
                self.inodes.insert(e.ino, Tally::new(&di, true));
                if !self.reach(dir, e.ino, *di)? {
                    scan.remove.push(key);
                    return Ok(());
                }
                if dir == ROOT_INO && is_dir && e.name == LOST_FOUND {
                    self.lost_found = Some(e.ino);
                }
                self.add_name(&e, scan);
            }
        }
        Ok(())
    }

    fn entry_name_problem(&mut self, e: &DirEntryRef, scan: &mut DirScan) -> Option<String> {
        if dir::check_name(e.name).is_err() {
            return Some("invalid name".into());
        }
        let bucket = e.key >> 16;
        if bucket != dir::name_hash(e.name) {
            return Some(format!("key {:#x} is outside its name's hash range (lookups cannot find it)", e.key));
        }
        if bucket != scan.bucket {
            scan.bucket = bucket;
            scan.bucket_names.clear();
        }
        (!scan.bucket_names.insert(e.name.to_vec())).then(|| "duplicate name".into())
    }

    /// What an entry's inode number leads to. An inode that does not decode is only trusted
    /// to exist if the bitmap allocates it and its slot holds something: an all-zero slot was
    /// never written, so dropping the entry loses nothing.
    fn resolve(&self, ino: u64) -> Result<Target> {
        let Ok(offset) = self.geo.inode_offset(ino) else {
            return Ok(Target::Nothing(format!("inode {ino} is outside the image")));
        };
        if self.cleared.contains(&ino) {
            return Ok(Target::Nothing(format!("inode {ino} was cleared")));
        }
        if self.inodes.contains_key(&ino) {
            return Ok(Target::Live);
        }
        let mut img = [0u8; INODE_SIZE];
        self.dev.read_at(&mut img, offset)?;
        Ok(match DiskInode::decode(&img, ino, &self.geo) {
            Ok(di) => Target::New(Box::new(di)),
            Err(_) if img.iter().all(|&b| b == 0) => Target::Nothing(format!("inode {ino} was never written")),
            Err(e) if !self.inode_allocated(ino) => {
                Target::Nothing(format!("inode {ino} is free and does not decode ({})", detail(&e)))
            }
            Err(e) => Target::Unreadable(e),
        })
    }

    /// Count a name of a live inode. A directory keeps only its first: any other is removed.
    fn add_name(&mut self, e: &DirEntryRef, scan: &mut DirScan) {
        let Some(t) = self.inodes.get_mut(&e.ino) else { return };
        if t.is_dir() && (t.names > 0 || e.ino == ROOT_INO) {
            self.out
                .fixable(format!("{e}: directory {} already has a name (a hard-linked directory or a cycle)", e.ino));
            scan.remove.push(e.key);
            return;
        }
        t.names = t.names.saturating_add(1);
        let (want, is_dir, kind) = (ftype_of(t.mode), t.is_dir(), kind_name(t.mode));
        if e.ftype != want {
            self.out.fixable(format!("{e}: file type {} but inode {} is a {kind}", e.ftype, e.ino));
            let mut v = e.value.to_vec();
            v[8] = want;
            scan.retype.push((e.key, v));
        }
        if is_dir {
            self.count_subdir(e.dir);
        }
    }

    fn count_subdir(&mut self, dir: u64) {
        if let Some(parent) = self.inodes.get_mut(&dir) {
            parent.subdirs = parent.subdirs.saturating_add(1);
        }
    }

    /// First sight of a live inode, named in `dir`. Returns false if it was damaged and
    /// cleared (a directory never is: its tree is rebuilt instead).
    fn reach(&mut self, dir: u64, ino: u64, di: DiskInode) -> Result<bool> {
        if !di.is_dir() {
            return self.check_file(ino, &di);
        }
        if di.parent != dir {
            self.out.fixable(format!("directory {ino}: '..' is {}, but it is named in directory {dir}", di.parent));
            self.fix_inode(ino, |d| d.parent = dir)?;
        }
        self.pending_dirs.push((ino, di));
        Ok(true)
    }

    // ---- disconnected inodes and /lost+found -------------------------------------------

    /// Inodes a verified bitmap block allocates that no name and no orphan slot reaches, but
    /// that decode and still count links: they lost their name to damage (a removed entry, a lost leaf, a
    /// cleared or recreated directory). Each is named `#<ino>` in /lost+found, as e2fsck does:
    /// first the roots of detached subtrees (directories whose parent is not detached too), so
    /// that a detached directory keeps what it holds, then the rest.
    pub(super) fn reconnect(&mut self) -> Result<()> {
        let mut detached = Vec::new();
        for agno in 0..self.geo.ag_count {
            for ino in (0..self.geo.inodes_per_ag).map(|i| make_ino(agno, i)) {
                if ino == 0 || !self.inode_marked(ino) || self.inodes.contains_key(&ino) || self.cleared.contains(&ino)
                {
                    continue;
                }
                match read_inode(self.dev, &self.geo, ino) {
                    Ok((di, _)) if di.nlink > 0 => detached.push((ino, di)),
                    Ok(_) => {} // unlinked and on no orphan list: leaked, the inode map frees it
                    Err(e) => drop(finding(e)?),
                }
            }
        }
        let detached_dirs: HashSet<u64> = detached.iter().filter(|(_, di)| di.is_dir()).map(|(ino, _)| *ino).collect();
        let rank = |di: &DiskInode| match (di.is_dir(), detached_dirs.contains(&di.parent)) {
            (true, false) => 0,
            (true, true) => 1,
            (false, _) => 2,
        };
        detached.sort_by_key(|(ino, di)| (rank(di), *ino));
        for (ino, di) in detached {
            // An earlier one's subtree may have reached it, or cleared it.
            if !self.inodes.contains_key(&ino) && !self.cleared.contains(&ino) {
                self.connect_lost(ino, di)?;
            }
        }
        Ok(())
    }

    fn connect_lost(&mut self, ino: u64, di: DiskInode) -> Result<()> {
        let lf = self.lost_found()?;
        self.out.fixable(format!(
            "inode {ino}: a {} (nlink {}) that no name reaches; reconnected as /lost+found/#{ino}",
            kind_name(di.mode),
            di.nlink
        ));
        let (is_dir, ftype) = (di.is_dir(), ftype_of(di.mode));
        let mut tally = Tally::new(&di, true);
        tally.names = 1;
        self.inodes.insert(ino, tally);
        if !self.reach(lf, ino, di)? {
            return Ok(());
        }
        if is_dir {
            self.count_subdir(lf);
        }
        self.dir_edits.entry(lf).or_default().add.push((format!("#{ino}").into_bytes(), ino, ftype));
        self.drain_dirs()
    }

    /// The root's lost+found directory, made (mode 0700, as e2fsck makes it) if there is none.
    fn lost_found(&mut self) -> Result<u64> {
        if let Some(lf) = self.lost_found {
            return Ok(lf);
        }
        let ino = self.free_inode().ok_or(Error::NoSpace)?;
        let mut di = DiskInode::new(S_IFDIR | 0o700, 0, 0, mkfs::now(), 1);
        di.nlink = 2;
        di.parent = ROOT_INO;
        self.new_inode(ino, di);
        if let Some(t) = self.inodes.get_mut(&ino) {
            t.names = 1;
        }
        self.count_subdir(ROOT_INO);
        self.out.note(format!("created /lost+found (inode {ino})"));
        self.dir_edits.insert(ino, DirEdit { rebuild: Some(Vec::new()), ..DirEdit::default() });
        self.dir_edits.entry(ROOT_INO).or_default().add.push((LOST_FOUND.to_vec(), ino, ftype_of(S_IFDIR)));
        self.lost_found = Some(ino);
        Ok(ino)
    }

    /// The first inode number that is free and that no finding has used.
    fn free_inode(&self) -> Option<u64> {
        let geo = &self.geo;
        (0..geo.ag_count).flat_map(|agno| (0..geo.inodes_per_ag).map(move |i| make_ino(agno, i))).find(|&ino| {
            ino > ROOT_INO
                && !self.inode_allocated(ino)
                && !self.inodes.contains_key(&ino)
                && !self.cleared.contains(&ino)
        })
    }

    pub(super) fn check_link_counts(&mut self) -> Result<()> {
        let wrong: Vec<(u64, u32, u32, String)> = self
            .inodes
            .iter()
            .filter(|(_, t)| t.nlink != t.expected_nlink())
            .map(|(&ino, t)| (ino, t.nlink, t.expected_nlink(), t.link_basis()))
            .collect();
        for (ino, have, want, basis) in wrong {
            self.out.fixable(format!("inode {ino}: nlink {have} but {basis}"));
            self.fix_inode(ino, |d| d.nlink = want)?;
        }
        Ok(())
    }
}

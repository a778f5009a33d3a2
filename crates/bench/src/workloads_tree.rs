//! The tree that `bench workloads` unpacks, copies out and removes: a tarball of a directory
//! of this machine (e.g. /usr/share), or of a tree generated with /usr/share's shape (the
//! default: the same on every machine).
//!
//! The generated tree draws its file sizes and directory sizes from histograms measured on a
//! Debian /usr/share (46,687 files, 3,261 directories, 4,069 symlinks, 571 MiB), with a fixed
//! seed: every run with the same `--tree-size` makes the same tree.

use super::shell::run;
use crate::failure::{CliResult, Context, Failure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The size of the generated tree unless `--tree-size` says otherwise: a quarter of
/// /usr/share, so that a run of every target takes minutes (fuse2fs unpacks the whole of
/// /usr/share in minutes on a busy machine) and the tree's entries stay within
/// passthrough_ll's usual open-file limit.
pub const DEFAULT_GENERATED_BYTES: u64 = 128 << 20;
const SEED: u64 = 0x7a_5eed;
/// Files per size class: class `b` holds sizes in [2^(b-1), 2^b), class 0 is empty files.
const FILE_SIZE_CLASSES: [(u32, u32); 27] = [
    (0, 24),
    (1, 1),
    (2, 1),
    (3, 2),
    (4, 10),
    (5, 61),
    (6, 493),
    (7, 420),
    (8, 1756),
    (9, 4799),
    (10, 10321),
    (11, 14023),
    (12, 6226),
    (13, 2712),
    (14, 1998),
    (15, 1618),
    (16, 915),
    (17, 671),
    (18, 368),
    (19, 162),
    (20, 73),
    (21, 18),
    (22, 10),
    (23, 1),
    (24, 1),
    (25, 2),
    (27, 1),
];
/// Directories per entry-count class, as for file sizes (non-empty directories).
const DIR_SIZE_CLASSES: [(u32, u32); 11] =
    [(1, 752), (2, 1137), (3, 447), (4, 241), (5, 144), (6, 99), (7, 43), (8, 35), (9, 11), (10, 5), (12, 1)];
/// Shares of directories that are empty, and of entries that are directories or symlinks.
const EMPTY_DIR_SHARE: f64 = 345.0 / 3261.0;
const SUBDIR_SHARE: f64 = 3260.0 / 54016.0;
const SYMLINK_SHARE: f64 = 4069.0 / 54016.0;
/// File contents are slices of this much random data.
const CONTENT_POOL: usize = 4 << 20;

/// What a tree holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of regular files.
    pub bytes: u64,
}

impl Census {
    /// Entries (what tar, cp and rm each handle once).
    pub fn entries(&self) -> u64 {
        self.files + self.dirs + self.symlinks
    }
}

/// Count what is under `dir` (itself included), without following symlinks; other file types
/// (sockets, devices) count as files.
pub fn census(dir: &Path) -> CliResult<Census> {
    let mut c = Census { dirs: 1, ..Census::default() };
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).context(|| format!("read {}", d.display()))? {
            let e = e.context(|| format!("read {}", d.display()))?;
            let t = e.file_type().context(|| format!("stat {}", e.path().display()))?;
            if t.is_dir() {
                c.dirs += 1;
                todo.push(e.path());
            } else if t.is_symlink() {
                c.symlinks += 1;
            } else {
                c.files += 1;
                c.bytes += e.metadata().context(|| format!("stat {}", e.path().display()))?.len();
            }
        }
    }
    Ok(c)
}

/// The tarball every target unpacks; deleted when dropped.
#[derive(Debug)]
pub struct Tarball {
    pub path: PathBuf,
    /// The one top-level directory in it.
    pub top: String,
    /// What it was made from: a path, or `generated, SIZE`.
    pub source: String,
    pub census: Census,
}

impl Drop for Tarball {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `tar -cf` of `dir` into `into` (a new file).
pub fn tar_of(dir: &Path, into: PathBuf, source: String) -> CliResult<Tarball> {
    let census = census(dir)?;
    let (parent, top) = match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => (p, n.to_string_lossy().into_owned()),
        _ => return Err(Failure::new(dir.display().to_string(), "needs a directory with a name (not /)")),
    };
    let tarball = Tarball { path: into, top, source, census };
    run(Command::new("tar").arg("-cf").arg(&tarball.path).arg("-C").arg(parent).arg(&tarball.top))?;
    Ok(tarball)
}

/// Draw from (class, weight) pairs: a value in [2^(class-1), 2^class), 0 for class 0.
fn draw(rng: &mut StdRng, classes: &[(u32, u32)]) -> u64 {
    let total: u32 = classes.iter().map(|c| c.1).sum();
    let mut pick = rng.gen_range(0..total);
    let class = classes
        .iter()
        .find(|c| {
            let hit = pick < c.1;
            pick = pick.saturating_sub(c.1);
            hit
        })
        .map_or(0, |c| c.0);
    match class {
        0 => 0,
        c => rng.gen_range(1u64 << (c - 1)..1u64 << c),
    }
}

/// Make a tree of about `bytes` of file data at `root` (which must not exist): directories
/// filled breadth-first, each with a drawn number of entries (subdirectories, symlinks to a
/// sibling, files of drawn sizes), until the data is written.
pub fn generate(root: &Path, bytes: u64) -> CliResult<Census> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let pool: Vec<u8> = (0..CONTENT_POOL).map(|_| rng.gen()).collect();
    let mkdir = |d: &Path| std::fs::create_dir(d).context(|| format!("mkdir {}", d.display()));
    mkdir(root)?;
    let mut queue = VecDeque::from([root.to_path_buf()]);
    let (mut written, mut spare) = (0u64, 0u64);
    while written < bytes {
        let dir = match queue.pop_front() {
            Some(d) => d,
            None => {
                // Every directory so far is full: start another under the root.
                spare += 1;
                let d = root.join(format!("more{spare}"));
                mkdir(&d)?;
                d
            }
        };
        if dir != root && rng.gen_bool(EMPTY_DIR_SHARE) {
            continue;
        }
        let mut last_file = None;
        for i in 0..draw(&mut rng, &DIR_SIZE_CLASSES) {
            if written >= bytes {
                break;
            }
            let r: f64 = rng.gen();
            if r < SUBDIR_SHARE {
                let d = dir.join(format!("d{i}"));
                mkdir(&d)?;
                queue.push_back(d);
            } else if let (true, Some(target)) = (r < SUBDIR_SHARE + SYMLINK_SHARE, &last_file) {
                let link = dir.join(format!("l{i}"));
                std::os::unix::fs::symlink(target, &link).context(|| format!("symlink {}", link.display()))?;
            } else {
                let size = draw(&mut rng, &FILE_SIZE_CLASSES);
                let name = format!("f{i}");
                let path = dir.join(&name);
                let start = rng.gen_range(0..CONTENT_POOL);
                let data: Vec<u8> = pool.iter().cycle().skip(start).take(size as usize).copied().collect();
                std::fs::write(&path, data).context(|| format!("write {}", path.display()))?;
                written += size;
                last_file = Some(name);
            }
        }
    }
    census(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_trees_are_the_same_every_time_and_about_the_size_asked() {
        let base = tempfile::tempdir().unwrap();
        let (a, b) = (base.path().join("a"), base.path().join("b"));
        let ca = generate(&a, 2 << 20).unwrap();
        let cb = generate(&b, 2 << 20).unwrap();
        assert_eq!(ca, cb);
        assert!(ca.bytes >= 2 << 20 && ca.bytes < 40 << 20, "{ca:?}");
        assert!(ca.files > 10 && ca.dirs > 1, "{ca:?}");
        assert_eq!(census(&a).unwrap(), ca);
        let t = tar_of(&a, base.path().join("a.tar"), "generated".into()).unwrap();
        assert_eq!((t.top.as_str(), t.census), ("a", ca));
        assert!(t.path.metadata().unwrap().len() > ca.bytes);
        let path = t.path.clone();
        drop(t);
        assert!(!path.exists());
    }

    #[test]
    fn draws_stay_in_their_class() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            let v = draw(&mut rng, &[(0, 1), (3, 1)]);
            assert!(v == 0 || (4..8).contains(&v), "{v}");
        }
    }
}

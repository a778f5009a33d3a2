//! The benchmark's own image: sized for the workload, made fresh, deleted afterwards.

use crate::failure::{CliResult, Context, Failure};
use ferrofs::dev::{BlockDevice, FileDevice, MemDevice};
use ferrofs::{MkfsOptions, BLOCK_SIZE};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Small, so a million empty files fit a modest sparse image.
const BYTES_PER_INODE: u64 = 2048;
/// Free inodes and blocks beyond the workload's need (directory B+trees, other runs).
const HEADROOM_PERCENT: u64 = 50;
/// Large enough for AGs that can hold `LOG_BYTES` (a log is at most half an AG); sparse in
/// /dev/shm, an image costs only what is written.
const MIN_SIZE: u64 = 2 << 30;
/// A large log: checkpoints, not log space, should pace the benchmark.
const LOG_BYTES: u64 = 256 << 20;
const SIZE_ROUNDING: u64 = 64 << 20;

pub struct Scratch {
    pub dev: Arc<dyn BlockDevice>,
    /// The image file, removed on drop; `None` for an in-memory device.
    pub path: Option<PathBuf>,
    pub opts: MkfsOptions,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Image bytes for `inodes` live inodes, with headroom.
pub fn image_size(inodes: u64) -> u64 {
    let want = inodes * BYTES_PER_INODE * (100 + HEADROOM_PERCENT) / 100;
    want.max(MIN_SIZE).div_ceil(SIZE_ROUNDING) * SIZE_ROUNDING
}

/// One AG per thread (4 to 16): the directories of different threads then get AGs of their
/// own, as they would on a file system made for that many writers.
pub fn mkfs_options(threads: usize) -> MkfsOptions {
    MkfsOptions {
        ag_count: Some(threads.clamp(4, 16) as u32),
        bytes_per_inode: BYTES_PER_INODE,
        log_blocks: Some(LOG_BYTES / BLOCK_SIZE as u64),
        ..MkfsOptions::default()
    }
}

/// Make the image: at `path` (which must not exist), in memory, or in /dev/shm (else the
/// temporary directory).
pub fn create(path: Option<&Path>, in_memory: bool, size: u64, opts: MkfsOptions) -> CliResult<Scratch> {
    create_tagged(path, in_memory, "", size, opts)
}

/// As `create`, for a second image of the same benchmark: `tag` goes into the default name.
pub fn create_tagged(
    path: Option<&Path>,
    in_memory: bool,
    tag: &str,
    size: u64,
    opts: MkfsOptions,
) -> CliResult<Scratch> {
    let scratch = if in_memory {
        Scratch { dev: Arc::new(MemDevice::new(size)), path: None, opts }
    } else {
        let path = path.map_or_else(|| default_path(tag), Path::to_path_buf);
        if path.exists() {
            return Err(Failure::new(
                path.display().to_string(),
                "already exists; the benchmark makes (and deletes) its own image: give a new path",
            ));
        }
        let dev = FileDevice::create(&path, size).context(|| format!("create {}", path.display()))?;
        Scratch { dev: Arc::new(dev), path: Some(path), opts }
    };
    ferrofs::mkfs::mkfs(&*scratch.dev, &scratch.opts, &|_, _| {})
        .context(|| "mkfs of the benchmark image".to_string())?;
    Ok(scratch)
}

fn default_path(tag: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let tag = if tag.is_empty() { String::new() } else { format!("-{tag}") };
    dir.join(format!("ferrofs-bench-{}{tag}.img", std::process::id()))
}

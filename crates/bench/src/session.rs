//! One benchmark's mounted scratch image, and what is collected when it is unmounted.

use super::report::{Figures, ImageReport, JournalReport, WorkloadReport};
use super::{scratch, BenchArgs};
use crate::failure::{CliResult, Context};
use ferrofs::{FileSystem, MkfsOptions, MountOptions, BLOCK_SIZE};
use ferrofs_lockstat::{self as lockstat, ClassStats};
use serde::Serialize;
use std::time::Instant;

pub struct Session {
    pub fs: FileSystem,
    /// Declared after `fs`: the image file outlives the mount.
    image: scratch::Scratch,
}

/// The counters of a session, read just before its unmount, and the unmount's duration.
pub struct Closed {
    pub image: ImageReport,
    pub journal: JournalReport,
    pub ag_alloc_retries: u64,
    pub orphan_adds: u64,
    pub locks: Vec<ClassStats>,
    pub unmount_seconds: f64,
}

impl Session {
    /// Make a scratch image (where --image/--mem say) with room for `inodes` live inodes,
    /// mount it, and zero the lock statistics so they cover the workload only.
    pub fn open(args: &BenchArgs, inodes: u64, opts: MkfsOptions) -> CliResult<Session> {
        Session::open_with(args, inodes, opts, &MountOptions::default())
    }

    /// As `open`, mounted with `mount` (e.g. a cache budget of its own).
    pub fn open_with(args: &BenchArgs, inodes: u64, opts: MkfsOptions, mount: &MountOptions) -> CliResult<Session> {
        let image = scratch::create(args.image.as_deref(), args.mem, scratch::image_size(inodes), opts)?;
        let fs =
            FileSystem::mount_device(image.dev.clone(), mount).context(|| "mount the benchmark image".to_string())?;
        lockstat::reset();
        Ok(Session { fs, image })
    }

    /// Orphan-table adds committed so far, over all AGs.
    pub fn orphan_adds(&self) -> u64 {
        self.fs.orphan_adds()
    }

    /// Collect the counters, then unmount (timed: the final checkpoint and write-back).
    pub fn close(self) -> CliResult<Closed> {
        let (geo, stats) = (self.fs.info().superblock.geo, self.fs.stats());
        let image = ImageReport {
            path: self.image.path.as_ref().map(|p| p.display().to_string()),
            size_bytes: geo.block_count * BLOCK_SIZE as u64,
            ag_count: geo.ag_count,
            inodes: geo.total_inodes(),
            log_bytes: geo.log_blocks * BLOCK_SIZE as u64,
        };
        let journal = JournalReport::from(&stats.journal);
        let ag_alloc_retries = stats.ags.iter().map(|ag| ag.alloc_retries).sum();
        let orphan_adds = self.orphan_adds();
        let locks = lockstat::snapshot();
        let started = Instant::now();
        self.fs.unmount().context(|| "unmount the benchmark image".to_string())?;
        Ok(Closed {
            image,
            journal,
            ag_alloc_retries,
            orphan_adds,
            locks,
            unmount_seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Unmount, then print the workload's report and write it as JSON if asked.
    pub fn finish<T: Figures + Serialize>(self, mode: &'static str, args: &BenchArgs, results: T) -> CliResult<()> {
        let end = self.close()?;
        let report = WorkloadReport {
            mode,
            image: end.image,
            runs: args.runs as usize,
            lock_timing: args.lock_timing,
            results,
            journal: end.journal,
            ag_alloc_retries: end.ag_alloc_retries,
            orphan_adds: end.orphan_adds,
            unmount_seconds: end.unmount_seconds,
            locks: end.locks,
        };
        report.print();
        super::write_json(args, &report)
    }
}

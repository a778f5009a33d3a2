//! `ferrofs trim IMAGE|MOUNTPOINT` (fstrim): give the free space of a file system back to the
//! host, punching holes in its image file (or discarding on its block device). An image is
//! trimmed offline: mounted by this process (which replays its log), trimmed, unmounted. A
//! mount point is trimmed by the daemon serving it, through its control socket, under its
//! own locks.

use crate::failure::{CliResult, Context, Failure};
use crate::image;
use crate::units::{grouped, human_bytes, parse_size};
use clap::Args;
use ferrofs::{FileSystem, MountOptions, TrimReport};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct TrimArgs {
    /// An unmounted image file or block device, or the mount point of a running ferrofs mount.
    pub target: PathBuf,
    /// Punch only free runs at least this long (e.g. 1M; default 0: every free block), as
    /// fstrim's --minimum.
    #[arg(short = 'm', long, value_parser = parse_size, default_value = "0")]
    pub minimum: u64,
    /// Print how much was trimmed.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

pub fn run(args: &TrimArgs) -> CliResult<()> {
    let target = &args.target;
    let meta = std::fs::metadata(target).context(|| format!("trim {}", target.display()))?;
    let report = if meta.is_dir() { trim_mounted(target, args.minimum)? } else { trim_image(target, args.minimum)? };
    if report.unsupported {
        let why = "the device cannot punch holes (no discard support, or a host file system without hole punching)";
        return Err(Failure::new(format!("trim {}", target.display()), why));
    }
    if args.verbose {
        println!(
            "{}: {} ({} bytes) trimmed in {} runs",
            target.display(),
            human_bytes(report.bytes),
            grouped(report.bytes),
            grouped(report.extents)
        );
    }
    Ok(())
}

/// Offline: take the image lock (a mounted image is refused, naming its mount point), replay
/// the log, trim, unmount cleanly.
fn trim_image(path: &Path, minimum: u64) -> CliResult<TrimReport> {
    let what = || format!("trim {}", path.display());
    let dev = image::open_unmounted(path, "trim the mount point instead")?;
    image::require_ferrofs(path)?;
    let fs = FileSystem::mount_device(dev, &MountOptions::default()).context(what)?;
    let report = fs.trim(minimum).context(what)?;
    fs.unmount().context(what)?;
    Ok(report)
}

/// Online: the daemon serving the mount point trims.
fn trim_mounted(dir: &Path, minimum: u64) -> CliResult<TrimReport> {
    let what = || format!("trim {}", dir.display());
    let answer = ferrofs_fuse::control_request(dir, &format!("trim {minimum}")).context(what)?;
    let r: serde_json::Value = serde_json::from_str(&answer).context(what)?;
    let field = |name: &str| r[name].as_u64().ok_or_else(|| Failure::new(what(), format!("bad answer: {answer}")));
    Ok(TrimReport { bytes: field("bytes")?, extents: field("extents")?, unsupported: r["unsupported"] == true })
}

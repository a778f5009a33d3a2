//! `ferrofs mkfs`: create (or size) an image file and write a new file system on it.

use crate::failure::{CliResult, Context, Failure};
use crate::geometry;
use crate::image;
use crate::progress;
use crate::signature::{self, Contents};
use crate::tune;
use crate::units::{human_bytes, parse_size};
use clap::Args;
use ferrofs::dev::{BlockDevice, FileDevice};
use ferrofs::mkfs::MIN_AG_BLOCKS;
use ferrofs::{MkfsOptions, BLOCK_SIZE};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uuid::Uuid;

/// Images with at least this many AGs get a progress bar (smaller ones finish at once).
const PROGRESS_MIN_AGS: u32 = 16;
const DEFAULT_SIZE: u64 = 1 << 30;
/// One minimal allocation group.
const MIN_SIZE: u64 = MIN_AG_BLOCKS * BLOCK_SIZE as u64;

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// Image file to create, or an existing image file or block device to overwrite.
    pub image: PathBuf,
    /// Image size, e.g. 512M, 1G, 2T. Default: the size of an existing file, else 1G.
    /// A new or resized file is sparse: it takes space only as it is written.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Number of allocation groups: independent allocators, so creators working in
    /// different directories do not contend. Default: one per GiB, at least 4.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub ags: Option<u32>,
    /// One inode per this many bytes of space (e.g. 2048 or 8K). Smaller values allow
    /// more files; each inode takes 256 bytes of the image.
    #[arg(long, value_parser = parse_size, default_value = "8K")]
    pub bytes_per_inode: u64,
    /// Size of the journal, e.g. 64M. Default: 1/32 of the image, 2 MiB to 256 MiB.
    /// Capped at half an allocation group.
    #[arg(long, value_parser = parse_size)]
    pub log_size: Option<u64>,
    /// Label of the new file system: up to 32 bytes of UTF-8.
    #[arg(short = 'L', long, value_parser = tune::parse_label, default_value = "")]
    pub label: String,
    /// UUID of the new file system: 8-4-4-4-12 hexadecimal digits, `random` (the default,
    /// version 4) or `time` (version 7).
    #[arg(short = 'U', long, value_parser = tune::parse_uuid)]
    pub uuid: Option<Uuid>,
    /// Overwrite an image or device that holds a file system (ferrofs or another), an
    /// encrypted volume, swap or a partition table.
    #[arg(long)]
    pub force: bool,
}

impl MkfsArgs {
    /// The defaults, for a new image of `size` bytes (`ferrofs mount --mkfs`).
    pub fn for_new_image(image: PathBuf, size: u64) -> MkfsArgs {
        MkfsArgs {
            image,
            size: Some(size),
            ags: None,
            bytes_per_inode: 8 << 10,
            log_size: None,
            label: String::new(),
            uuid: None,
            force: false,
        }
    }
}

/// What is at the image path before mkfs runs.
enum Target {
    NewFile,
    File { len: u64 },
    BlockDevice { len: u64 },
}

pub fn run(args: &MkfsArgs) -> CliResult<()> {
    let path = &args.image;
    let what = || format!("mkfs {}", path.display());
    let target = inspect(path, args.force)?;
    let size = image_size(&target, args.size).map_err(|why| Failure::new(what(), why))?;
    if size < MIN_SIZE {
        return Err(Failure::new(
            what(),
            format!("{} is too small: a ferrofs image needs at least {}", human_bytes(size), human_bytes(MIN_SIZE)),
        ));
    }
    let opts = mkfs_options(args);
    let geo = ferrofs::mkfs::plan(size, &opts).context(what)?;
    warn_if_adjusted(args, &geo);
    let dev = prepare_device(path, &target, size).context(what)?;
    let bar = progress::counter(geo.ag_count >= PROGRESS_MIN_AGS, geo.ag_count as u64, "writing allocation groups");
    let sb = ferrofs::mkfs::mkfs(&*dev, &opts, &|done, _| bar.set_position(done)).context(what)?;
    bar.finish_and_clear();
    println!("ferrofs: made {} ({})", path.display(), human_bytes(size));
    print!("{}", geometry::summary(&sb));
    Ok(())
}

/// Look at the path; refuse to overwrite a file system, volume or partition table unless
/// forced.
fn inspect(path: &Path, force: bool) -> CliResult<Target> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::NewFile),
        Err(e) => return Err(Failure::new(path.display().to_string(), e)),
    };
    let is_block = meta.file_type().is_block_device();
    if !is_block && !meta.is_file() {
        return Err(Failure::new(path.display().to_string(), "not a regular file or block device"));
    }
    let dev = image::open(path, true)?;
    if !force {
        refuse_to_overwrite(path)?;
    }
    let len = dev.size();
    Ok(if is_block { Target::BlockDevice { len } } else { Target::File { len } })
}

fn refuse_to_overwrite(path: &Path) -> CliResult<()> {
    let found = signature::contents(path).context(|| format!("mkfs: look at {}", path.display()))?;
    let what = match &found {
        Contents::Zeros | Contents::Unknown => return Ok(()),
        Contents::Ferrofs(sb) => format!(
            "{found} ({}, uuid {})",
            human_bytes(sb.geo.block_count * BLOCK_SIZE as u64),
            geometry::uuid_string(&sb.uuid)
        ),
        _ => found.to_string(),
    };
    Err(Failure::new("mkfs", format!("{} contains {what}; use --force to overwrite it", path.display())))
}

fn image_size(target: &Target, requested: Option<u64>) -> Result<u64, String> {
    match (target, requested) {
        (Target::BlockDevice { len }, Some(size)) if size != *len => {
            Err(format!("--size {size} given, but a block device keeps its own size ({len} bytes)"))
        }
        (Target::BlockDevice { len }, _) => Ok(*len),
        (_, Some(size)) => Ok(size),
        (Target::File { len }, None) if *len > 0 => Ok(*len),
        _ => Ok(DEFAULT_SIZE),
    }
}

fn mkfs_options(args: &MkfsArgs) -> MkfsOptions {
    MkfsOptions {
        ag_count: args.ags,
        bytes_per_inode: args.bytes_per_inode,
        log_blocks: args.log_size.map(|b| b.div_ceil(BLOCK_SIZE as u64)),
        label: args.label.clone(),
        uuid: args.uuid.map(Uuid::into_bytes),
        ..MkfsOptions::default()
    }
}

/// The geometry may differ from what was asked (AG count and log size are bounded by the
/// image size): say so rather than silently.
fn warn_if_adjusted(args: &MkfsArgs, geo: &ferrofs::Geometry) {
    if let Some(ags) = args.ags.filter(|&a| a != geo.ag_count) {
        eprintln!(
            "ferrofs: note: {} allocation groups instead of {} (each needs room for its metadata)",
            geo.ag_count, ags
        );
    }
    if let Some(log) = args.log_size.filter(|&l| l.div_ceil(BLOCK_SIZE as u64) != geo.log_blocks) {
        let got = geo.log_blocks * BLOCK_SIZE as u64;
        eprintln!(
            "ferrofs: note: log is {} instead of {} (between 256 KiB and half an allocation group)",
            human_bytes(got),
            human_bytes(log)
        );
    }
}

/// A file is recreated sparse at the new size (old contents dropped); a block device is
/// opened as it is.
fn prepare_device(path: &Path, target: &Target, size: u64) -> std::io::Result<Arc<FileDevice>> {
    match target {
        Target::BlockDevice { .. } => FileDevice::open(path, false).map(Arc::new),
        _ => FileDevice::create(path, size).map(Arc::new),
    }
}

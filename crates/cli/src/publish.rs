//! `ferrofs publish SOURCE s3://bucket/prefix`: publish an image, or the image of a live
//! mount, as the next generation of a published image (docs/DESIGN.md, "Publishing to
//! object storage"). Readers get no log to replay: an image's log is replayed in memory
//! (the image is only read), and a mount is frozen at a checkpoint while its image is read.

use crate::failure::{CliResult, Context, Failure};
use crate::image;
use crate::mount_config;
use crate::units::{grouped, human_bytes, parse_size};
use clap::Args;
use ferrofs::dev::{BlockDevice, FileDevice};
use ferrofs_remote::publish::{publish, PublishReport, CHUNK_SIZE_DEFAULT};
use ferrofs_remote::{Remote, RemoteOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct PublishArgs {
    /// What to publish: an unmounted image file or block device (only read, even a
    /// read-only one), or the mount point of a mounted ferrofs file system (frozen while its
    /// image is read: changes wait meanwhile, reads go on).
    pub source: PathBuf,
    /// Where: s3://bucket/prefix.
    pub url: String,
    /// The S3 endpoint of an S3-compatible server (default: AWS_ENDPOINT_URL, else AWS).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Bytes per chunk object: a power of two from 4K to 64M (default 1M). Only the first
    /// publish under a prefix chooses; later ones must use the same to share chunks.
    #[arg(long, value_parser = parse_size)]
    pub chunk_size: Option<u64>,
}

pub fn run(args: &PublishArgs) -> CliResult<()> {
    let source = &args.source;
    let what = || format!("publish {}", source.display());
    let is_mount_point = std::fs::metadata(source).context(what)?.is_dir();
    let chunk_size = match args.chunk_size {
        None => CHUNK_SIZE_DEFAULT,
        Some(size) => {
            u32::try_from(size).map_err(|_| Failure::new(what(), format!("--chunk-size {size} is too large")))?
        }
    };
    let remote = Remote::open(&args.url, &RemoteOptions { endpoint: args.endpoint.clone() }).context(what)?;
    let report = if is_mount_point {
        publish_mount(source, &remote, chunk_size)?
    } else {
        publish_image(source, &remote, chunk_size)?
    };
    println!(
        "{}: generation {} (over {}): {} chunks, {} uploaded ({}), {} all zeros, {} metadata",
        args.url,
        report.generation,
        report.parent,
        grouped(report.chunks),
        grouped(report.uploaded_chunks),
        human_bytes(report.uploaded_bytes),
        grouped(report.zero_chunks),
        grouped(report.metadata_chunks)
    );
    Ok(())
}

/// An unmounted image, under a shared lock (no read-write mount can start meanwhile).
fn publish_image(source: &Path, remote: &Remote, chunk_size: u32) -> CliResult<PublishReport> {
    let dev = image::open(source, true).map_err(|f| match f.why.strip_prefix("in use: mounted on ") {
        Some(dir) => Failure::new(f.what, format!("{}: publish its mount point {dir} instead", f.why)),
        None => f,
    })?;
    image::require_ferrofs(source)?;
    publish_replayed(source, dev, remote, chunk_size)
}

/// A mounted image: frozen at a checkpoint for as long as it is read, and read without its
/// lock, which the mount holds. The freeze ends when this returns, or if this process dies.
fn publish_mount(dir: &Path, remote: &Remote, chunk_size: u32) -> CliResult<PublishReport> {
    let what = || format!("publish {}", dir.display());
    let Some(image) = mount_config::image_of_mount(dir) else {
        return Err(Failure::new(what(), "a directory, not a mount point: give an image or a ferrofs mount point"));
    };
    let frozen = ferrofs_fuse::freeze(dir).context(what)?;
    let dev =
        FileDevice::open_unlocked(&image).context(|| format!("{}: open its image {}", what(), image.display()))?;
    let report = publish_replayed(dir, Arc::new(dev), remote, chunk_size)?;
    frozen.thaw().context(what)?;
    Ok(report)
}

/// Publish the image on `dev` with its log replayed in memory (none is left in a frozen
/// mount's), so that readers have none to replay and `dev` is never written.
fn publish_replayed(
    source: &Path,
    dev: Arc<dyn BlockDevice>,
    remote: &Remote,
    chunk_size: u32,
) -> CliResult<PublishReport> {
    let what = || format!("publish {}", source.display());
    let (view, _) = ferrofs::replayed_in_memory(dev).context(what)?;
    publish(remote, &*view, chunk_size).context(what)
}

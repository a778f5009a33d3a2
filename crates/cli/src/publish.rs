//! `ferrofs publish IMAGE s3://bucket/prefix`: publish an image as the next generation of a
//! published image (docs/DESIGN.md, "Publishing to object storage"). The image is taken
//! offline under its lock, its log replayed and written home first (as `ferrofs trim` does),
//! so that readers have no log to replay.

use crate::failure::{CliResult, Context, Failure};
use crate::image;
use crate::units::{grouped, human_bytes, parse_size};
use clap::Args;
use ferrofs::{FileSystem, MountOptions};
use ferrofs_remote::publish::{publish, CHUNK_SIZE_DEFAULT};
use ferrofs_remote::{Remote, RemoteOptions};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PublishArgs {
    /// The unmounted image file or block device to publish.
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
    if std::fs::metadata(source).context(what)?.is_dir() {
        return Err(Failure::new(
            what(),
            "publishing a mounted file system is not supported yet: unmount it and publish its image",
        ));
    }
    let chunk_size = match args.chunk_size {
        None => CHUNK_SIZE_DEFAULT,
        Some(size) => {
            u32::try_from(size).map_err(|_| Failure::new(what(), format!("--chunk-size {size} is too large")))?
        }
    };
    let remote = Remote::open(&args.url, &RemoteOptions { endpoint: args.endpoint.clone() }).context(what)?;
    let dev = image::open_unmounted(source, "unmount it first")?;
    image::require_ferrofs(source)?;
    // Replay and write the log home, so that the published image has an empty log; the
    // device (and its lock) stays ours while the chunks are read.
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).context(what)?;
    fs.unmount().context(what)?;
    drop(fs);
    let report = publish(&remote, &*dev, chunk_size).context(what)?;
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

//! `ferrofs grow`: grow an unmounted file system onto a larger image file or block device
//! (resize2fs and xfs_growfs for ferrofs; the engine's `grow` module does the work).

use crate::failure::{CliResult, Context, Failure};
use crate::geometry;
use crate::image;
use crate::progress;
use crate::units::{human_bytes, parse_size};
use clap::Args;
use ferrofs::dev::BlockDevice;
use ferrofs::BLOCK_SIZE;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Grows adding at least this many AGs get a progress bar (smaller ones finish at once).
const PROGRESS_MIN_AGS: u32 = 16;
const BS: u64 = BLOCK_SIZE as u64;

#[derive(Args, Debug)]
pub struct GrowArgs {
    /// Image file or block device holding an unmounted ferrofs file system.
    pub image: PathBuf,
    /// New size, e.g. 2G, or +512M for that much more than now (whole 4 KiB blocks). An
    /// image file is lengthened to it (sparse). Default: the size of the image file or block
    /// device (grow the file first, e.g. with `truncate -s`).
    #[arg(value_parser = parse_new_size)]
    pub size: Option<NewSize>,
}

/// A size as given: the new size, or how much to add.
#[derive(Clone, Copy, Debug)]
pub enum NewSize {
    To(u64),
    By(u64),
}

fn parse_new_size(text: &str) -> Result<NewSize, String> {
    let (bytes, size) = match text.strip_prefix('+') {
        Some(more) => parse_size(more).map(|b| (b, NewSize::By(b)))?,
        None => parse_size(text).map(|b| (b, NewSize::To(b)))?,
    };
    if !bytes.is_multiple_of(BS) {
        return Err(format!("'{text}' is not a whole number of {BS}-byte blocks"));
    }
    Ok(size)
}

pub fn run(args: &GrowArgs) -> CliResult<()> {
    let path = &args.image;
    let what = || format!("grow {}", path.display());
    if path.is_dir() {
        return Err(Failure::new(
            what(),
            "a directory (a mount point?): ferrofs grows only unmounted file systems; unmount it, \
             then run `ferrofs grow IMAGE [SIZE]`",
        ));
    }
    let mut dev = open_unmounted(path)?;
    image::require_ferrofs(path)?;
    let sb = ferrofs::read_superblock(&*dev).context(what)?;
    let size = match args.size {
        Some(NewSize::To(bytes)) => bytes,
        Some(NewSize::By(bytes)) => (sb.geo.block_count * BS).saturating_add(bytes),
        None => dev.size(),
    };
    // Everything that refuses does so before the image file is touched.
    let (old, geo) = ferrofs::grow::check(&*dev, size).context(what)?;
    Arc::get_mut(&mut dev).expect("the device was opened here").extend(size).context(what)?;
    let added = geo.ag_count - old.geo.ag_count;
    let bar = progress::counter(added >= PROGRESS_MIN_AGS, added as u64, "writing allocation groups");
    let new = ferrofs::grow::grow(&*dev, size, &|done, _| bar.set_position(done)).context(what)?;
    bar.finish_and_clear();
    println!(
        "ferrofs: grew {} from {} to {} ({} new allocation groups)",
        path.display(),
        human_bytes(old.geo.block_count * BS),
        human_bytes(new.geo.block_count * BS),
        added
    );
    if new.geo.block_count * BS < size {
        println!(
            "ferrofs: note: the last {} are less than an allocation group needs, and stay unused",
            human_bytes(size - new.geo.block_count * BS)
        );
    }
    print!("{}", geometry::summary(&new));
    Ok(())
}

/// The image, locked for writing: a mounted one is refused, saying to unmount it first.
fn open_unmounted(path: &Path) -> CliResult<Arc<ferrofs::dev::FileDevice>> {
    image::open(path, false).map_err(|f| match f.why.starts_with("in use") {
        true => Failure::new(f.what, format!("{}: ferrofs grows only unmounted file systems; unmount it first", f.why)),
        false => f,
    })
}

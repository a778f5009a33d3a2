//! `ferrofs tune`: change the label or UUID of an unmounted image (tune2fs `-L`/`-U`,
//! xfs_admin), and the parsers `mkfs -L/-U` share with it.

use crate::failure::{CliResult, Failure};
use crate::geometry;
use crate::image;
use clap::Args;
use ferrofs::tune::{set_identity, Identity};
use ferrofs::Error;
use std::path::PathBuf;
use uuid::Uuid;

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("change").required(true).multiple(true).args(["label", "uuid"])))]
pub struct TuneArgs {
    /// Image file or block device holding a ferrofs file system; it must not be mounted.
    pub image: PathBuf,
    /// New label: up to 32 bytes of UTF-8; "" removes it.
    #[arg(short = 'L', long, value_parser = parse_label)]
    pub label: Option<String>,
    /// New UUID: 8-4-4-4-12 hexadecimal digits, `random` (version 4) or `time` (version 7,
    /// ordered by creation time).
    #[arg(short = 'U', long, value_parser = parse_uuid)]
    pub uuid: Option<Uuid>,
}

/// A label as `-L` takes it: the engine's rule, said at parse time.
pub fn parse_label(s: &str) -> Result<String, &'static str> {
    ferrofs::check_label(s).map(|()| s.to_string())
}

/// A UUID as `-U` takes it: `random`, `time`, or the standard 8-4-4-4-12 form.
pub fn parse_uuid(s: &str) -> Result<Uuid, String> {
    match s {
        "random" => Ok(Uuid::new_v4()),
        "time" => Ok(Uuid::now_v7()),
        _ if s.len() == 36 => Uuid::try_parse(s).map_err(|e| format!("{e}")),
        _ => Err(format!("\"{s}\" is not `random`, `time` nor a UUID like 0b5e6c1a-8f3d-4e2b-9a47-1c2d3e4f5a6b")),
    }
}

pub fn run(args: &TuneArgs) -> CliResult<()> {
    let path = &args.image;
    let what = || format!("tune {}", path.display());
    let dev = image::open(path, false)?;
    image::require_ferrofs(path)?;
    let change = Identity { label: args.label.clone(), uuid: args.uuid.map(Uuid::into_bytes) };
    let sb = set_identity(&*dev, &change).map_err(|e| match e {
        Error::Corrupt { .. } => Failure::new(what(), format!("{e} (`ferrofs fsck -y` repairs the superblocks)")),
        e => Failure::new(what(), e),
    })?;
    println!(
        "ferrofs: {}: label {}, uuid {}",
        path.display(),
        geometry::label_text(&sb.label),
        geometry::uuid_string(&sb.uuid)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_parse_in_the_standard_form_or_by_kind() {
        let u = parse_uuid("0B5E6C1A-8f3d-4e2b-9a47-1c2d3e4f5a6b").unwrap();
        assert_eq!(u.hyphenated().to_string(), "0b5e6c1a-8f3d-4e2b-9a47-1c2d3e4f5a6b");
        assert_eq!(parse_uuid("random").unwrap().get_version_num(), 4);
        assert_eq!(parse_uuid("time").unwrap().get_version_num(), 7);
        assert_ne!(parse_uuid("random").unwrap(), parse_uuid("random").unwrap());
        for bad in ["", "0b5e6c1a8f3d4e2b9a471c2d3e4f5a6b", "0b5e6c1a-8f3d-4e2b-9a47-1c2d3e4f5a6g", "nil"] {
            assert!(parse_uuid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn labels_longer_than_32_bytes_are_refused() {
        assert_eq!(parse_label("home").unwrap(), "home");
        assert_eq!(parse_label(&"é".repeat(16)).unwrap().len(), 32);
        assert!(parse_label(&"é".repeat(17)).unwrap_err().contains("longer than 32 bytes"));
    }
}

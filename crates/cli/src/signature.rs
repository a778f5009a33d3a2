//! What an image file or device holds before a command touches it: a ferrofs file system,
//! another file system's or a partition table's signature, or nothing. `mkfs` refuses to
//! overwrite what it finds unless forced; `mount`, `fsck` and `info` name what they found
//! instead of reporting a foreign image as a corrupt ferrofs superblock.
//!
//! Foreign signatures are found by libblkid, the library mkfs.xfs, mkfs.ext4 and wipefs ask
//! (DESIGN, "What mkfs overwrites"). It only reads a bounded set of offsets per signature
//! type, and udev runs it on every block device that appears, so hostile bytes are its daily
//! input.

use ferrofs::dev::BlockDevice;
use ferrofs::Superblock;
use libblkid_rs::{BlkidProbe, BlkidProbeRet, BlkidSublks, BlkidSublksFlags};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

/// An image with no signature whose first this many bytes are zeros is reported as zeros.
const ZERO_PROBE_BYTES: u64 = 1 << 20;
/// libblkid reports one signature per probe step; a device with more than this many is
/// described by the first ones.
const SIGNATURES_MAX: usize = 8;

/// What a path holds.
pub enum Contents {
    /// A ferrofs superblock verifies (the primary or a backup, as a mount finds it).
    Ferrofs(Box<Superblock>),
    /// Block 0 carries the ferrofs magic, but no superblock verifies.
    DamagedFerrofs,
    /// Signatures of other file systems, volumes or partition tables, as libblkid found them.
    Foreign(Vec<Signature>),
    /// No signature, and the first MiB (or the whole of a smaller image) is zeros.
    Zeros,
    /// No signature known here.
    Unknown,
}

/// One signature libblkid found.
pub struct Signature {
    /// libblkid's name for it: `ext4`, `xfs`, `swap`, `crypto_LUKS`, `gpt`, `dos`, ...
    name: String,
    /// What kind of thing carries it: "file system", "partition table", ...
    kind: &'static str,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let article = if self.name.starts_with(['a', 'e', 'i', 'o', 'u', 'x']) { "an" } else { "a" };
        write!(f, "{article} {} {}", self.name, self.kind)
    }
}

/// The noun for libblkid's `USAGE` value of a superblock.
fn usage_kind(usage: &str) -> &'static str {
    match usage {
        "filesystem" => "file system",
        "crypto" => "encrypted volume",
        "raid" => "RAID member",
        _ => "signature",
    }
}

impl fmt::Display for Contents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Contents::Ferrofs(_) => f.write_str("a ferrofs file system"),
            Contents::DamagedFerrofs => f.write_str("a ferrofs file system whose superblock does not verify"),
            Contents::Foreign(found) => {
                let names: Vec<String> = found.iter().map(Signature::to_string).collect();
                f.write_str(&names.join(" and "))
            }
            Contents::Zeros => f.write_str("nothing but zeros"),
            Contents::Unknown => f.write_str("no known signature"),
        }
    }
}

/// Look at what `path` holds. Only regular files and block devices are read (a FIFO's open
/// would wait for a writer); no lock is taken, so a mounted image can be looked at too.
pub fn contents(path: &Path) -> io::Result<Contents> {
    let kind = std::fs::metadata(path)?.file_type();
    if !kind.is_file() && !kind.is_block_device() {
        return Err(io::Error::other("not a regular file or block device"));
    }
    let image = Image::new(File::open(path)?)?;
    if let Ok(sb) = ferrofs::read_superblock(&image) {
        return Ok(Contents::Ferrofs(Box::new(sb)));
    }
    if image.has_ferrofs_magic() {
        return Ok(Contents::DamagedFerrofs);
    }
    let found = foreign_signatures(path)?;
    if !found.is_empty() {
        return Ok(Contents::Foreign(found));
    }
    Ok(if image.starts_with_zeros()? { Contents::Zeros } else { Contents::Unknown })
}

/// Every signature libblkid finds, file systems and partition tables alike (as wipefs lists
/// them), at most [`SIGNATURES_MAX`].
fn foreign_signatures(path: &Path) -> io::Result<Vec<Signature>> {
    let blkid = |e: libblkid_rs::BlkidErr| io::Error::other(format!("libblkid: {e}"));
    let mut probe = BlkidProbe::new_from_filename(path).map_err(blkid)?;
    probe.enable_superblocks(true).map_err(blkid)?;
    probe.set_superblock_flags(BlkidSublksFlags::new(vec![BlkidSublks::Type, BlkidSublks::Usage])).map_err(blkid)?;
    probe.enable_partitions(true).map_err(blkid)?;
    let mut found = Vec::new();
    while found.len() < SIGNATURES_MAX {
        if let BlkidProbeRet::Done = probe.do_probe().map_err(blkid)? {
            break;
        }
        let signature = match (probe.lookup_value("TYPE"), probe.lookup_value("PTTYPE")) {
            (Ok(name), _) => Signature { name, kind: usage_kind(&probe.lookup_value("USAGE").unwrap_or_default()) },
            (_, Ok(name)) => Signature { name, kind: "partition table" },
            _ => continue,
        };
        found.push(signature);
    }
    Ok(found)
}

/// An image opened for a look: reads only, no lock.
struct Image {
    file: File,
    size: u64,
}

impl Image {
    fn new(file: File) -> io::Result<Image> {
        let size = ferrofs::dev::device_size(&file)?;
        Ok(Image { file, size })
    }

    fn has_ferrofs_magic(&self) -> bool {
        let mut magic = [0u8; 4];
        self.file.read_exact_at(&mut magic, 0).is_ok() && ferrofs::has_superblock_magic(&magic)
    }

    fn starts_with_zeros(&self) -> io::Result<bool> {
        let mut head = vec![0u8; self.size.min(ZERO_PROBE_BYTES) as usize];
        self.file.read_exact_at(&mut head, 0)?;
        Ok(head.iter().all(|&b| b == 0))
    }
}

impl BlockDevice for Image {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, _buf: &[u8], _off: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
}

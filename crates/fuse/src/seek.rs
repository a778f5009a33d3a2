//! `lseek(SEEK_DATA / SEEK_HOLE)` through the engine's `FileSystem::seek`, in the terms
//! of the kernel's request: only regular files, and `None` for ENXIO.

use ferrofs::{Error, FileSystem, FileType, Result};

#[cfg(test)]
const BS: u64 = ferrofs::BLOCK_SIZE as u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}

/// The offset `lseek(fd, off, whence)` returns, or `None` for ENXIO (no data at or after
/// `off`, or `off` at or past the end of the file).
pub fn seek(fs: &FileSystem, ino: u64, off: u64, whence: Whence) -> Result<Option<u64>> {
    if fs.getattr(ino)?.kind != FileType::RegularFile {
        return Err(Error::Invalid("SEEK_DATA/SEEK_HOLE on a non-regular file"));
    }
    match fs.seek(ino, off, whence == Whence::Hole) {
        Ok(found) => Ok(Some(found)),
        Err(Error::NoData) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrofs::dev::MemDevice;
    use ferrofs::{Cred, MkfsOptions, MountOptions};
    use std::sync::Arc;

    const GIB: u64 = 1 << 30;

    fn fs() -> FileSystem {
        let dev = Arc::new(MemDevice::new(256 << 20));
        FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
        FileSystem::mount_device(dev, &MountOptions::default()).unwrap()
    }

    #[test]
    fn data_and_holes() {
        let fs = fs();
        let f = fs.create(1, b"f", 0o644, Cred::default()).unwrap().ino;
        // Data in blocks 0, 2..4 and at 5 GiB; holes between and a hole at the end.
        fs.write(f, 0, b"a").unwrap();
        fs.write(f, 2 * BS, &[1u8; 2 * BS as usize]).unwrap();
        fs.write(f, 5 * GIB, b"z").unwrap();
        fs.setattr(f, &ferrofs::SetAttr { size: Some(6 * GIB), ..Default::default() }).unwrap();
        let s = |off, w| seek(&fs, f, off, w).unwrap();
        assert_eq!(s(0, Whence::Data), Some(0));
        assert_eq!(s(0, Whence::Hole), Some(BS));
        assert_eq!(s(100, Whence::Hole), Some(BS));
        assert_eq!(s(BS, Whence::Hole), Some(BS));
        assert_eq!(s(BS + 5, Whence::Data), Some(2 * BS));
        assert_eq!(s(2 * BS + 7, Whence::Data), Some(2 * BS + 7));
        assert_eq!(s(2 * BS, Whence::Hole), Some(4 * BS));
        assert_eq!(s(4 * BS, Whence::Data), Some(5 * GIB));
        assert_eq!(s(5 * GIB, Whence::Hole), Some(5 * GIB + BS));
        assert_eq!(s(5 * GIB + BS, Whence::Data), None);
        assert_eq!(s(6 * GIB - 1, Whence::Hole), Some(6 * GIB - 1));
        assert_eq!(s(6 * GIB, Whence::Data), None);
        assert_eq!(s(6 * GIB, Whence::Hole), None);
    }

    #[test]
    fn file_ending_in_data_and_many_extents() {
        let fs = fs();
        let f = fs.create(1, b"f", 0o644, Cred::default()).unwrap().ino;
        // Every other block written: more extents than fit inline (a B+tree map).
        for b in (0..200u64).step_by(2) {
            fs.write(f, b * BS, &[7u8; BS as usize]).unwrap();
        }
        for b in (0..199u64).step_by(2) {
            assert_eq!(seek(&fs, f, b * BS, Whence::Hole).unwrap(), Some((b + 1) * BS), "block {b}");
            assert_eq!(seek(&fs, f, (b + 1) * BS, Whence::Data).unwrap(), if b < 198 { Some((b + 2) * BS) } else { None });
        }
        // The size ends inside the last data block: its hole is the end of the file.
        assert_eq!(seek(&fs, f, 198 * BS, Whence::Hole).unwrap(), Some(199 * BS));
        let d = fs.mkdir(1, b"d", 0o755, Cred::default()).unwrap().ino;
        assert!(seek(&fs, d, 0, Whence::Data).is_err());
    }
}

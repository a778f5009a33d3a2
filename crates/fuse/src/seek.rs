//! `lseek(SEEK_DATA / SEEK_HOLE)` from the file's block map.
//!
//! The engine has no API for this yet, so this reads the map the way `FileSystem::read` does:
//! the inode's read lock, then `file::read_extents`. It belongs in the engine as
//! `FileSystem::seek_data(ino, offset, whence) -> Result<Option<u64>>` (see the crate's
//! report); until then this is the only place the adapter touches engine internals.
//! Unwritten (preallocated) extents read as zeros, so they count as holes.

use ferrofs::error::{Error, Result};
use ferrofs::file::read_extents;
use ferrofs::format::BLOCK_SIZE;
use ferrofs::FileSystem;

const BS: u64 = BLOCK_SIZE as u64;
/// First window of blocks asked of the block map; it doubles up to `WINDOW_MAX`, so a
/// search over a huge sparse file takes few lookups and no single answer is large.
const WINDOW_MIN: u64 = 1 << 10;
const WINDOW_MAX: u64 = 1 << 18;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}

/// The offset `lseek(fd, off, whence)` returns, or `None` for ENXIO (no data at or after
/// `off`, or `off` at or past the end of the file).
pub fn seek(fs: &FileSystem, ino: u64, off: u64, whence: Whence) -> Result<Option<u64>> {
    let m = fs.mount();
    let i = m.iget(ino)?;
    let g = i.core.read();
    if !g.is_reg() {
        return Err(Error::Invalid("SEEK_DATA/SEEK_HOLE on a non-regular file"));
    }
    let size = g.size;
    if off >= size {
        return Ok(None);
    }
    let end = size.div_ceil(BS);
    let mut blk = off / BS;
    let mut window = WINDOW_MIN;
    while blk < end {
        let to = blk.saturating_add(window).min(end);
        let mut found = None;
        for e in read_extents(m, ino, &g, blk, to)? {
            if e.unwritten || e.end() <= blk {
                continue;
            }
            match whence {
                Whence::Data => {
                    found = Some(e.lblk.max(blk));
                    break;
                }
                Whence::Hole if e.lblk > blk => break,
                Whence::Hole => blk = e.end(),
            }
        }
        match whence {
            Whence::Data if found.is_some() => return Ok(found.map(|b| (b * BS).max(off))),
            Whence::Data => blk = to,
            // No written extent covers `blk`: the hole starts there.
            Whence::Hole if blk < to => return Ok(Some((blk * BS).max(off).min(size))),
            Whence::Hole => {}
        }
        window = (window * 2).min(WINDOW_MAX);
    }
    Ok(match whence {
        Whence::Data => None,
        Whence::Hole => Some(size),
    })
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

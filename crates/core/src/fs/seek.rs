//! lseek(2) SEEK_DATA and SEEK_HOLE from a file's block map, asked for in windows so that a
//! search through a huge sparse file neither reads its whole map at once nor takes a lookup
//! per block.

use super::{FileSystem, BS};
use crate::error::{Error, Result};
use crate::file;

/// First window of blocks asked of the block map; it doubles up to `WINDOW_MAX_BLOCKS`, so a
/// search over a huge sparse file takes few lookups and no single answer is large.
const WINDOW_MIN_BLOCKS: u64 = 1 << 10;
const WINDOW_MAX_BLOCKS: u64 = 1 << 18;

impl FileSystem {
    /// lseek(2) SEEK_DATA (`hole == false`) or SEEK_HOLE (`hole == true`) from byte `off`:
    /// the offset of the next data or hole at or after `off`. The end of the file counts as a
    /// hole; unwritten (preallocated) extents read as zeros, so they count as holes too.
    /// `Error::NoData` (ENXIO) when `off` is at or past the end of the file, or no data
    /// follows it; `Error::Invalid` (EINVAL) for a file that is not regular.
    pub fn seek(&self, ino: u64, off: u64, hole: bool) -> Result<u64> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        if !g.is_reg() {
            return Err(Error::Invalid("SEEK_DATA/SEEK_HOLE on a non-regular file"));
        }
        let size = g.size;
        if off >= size {
            return Err(Error::NoData);
        }
        let end = size.div_ceil(BS);
        let mut blk = off / BS;
        let mut window = WINDOW_MIN_BLOCKS;
        // Every pass returns or moves `blk` to at least the window's end, so the loop ends
        // after at most log2(WINDOW_MAX_BLOCKS / WINDOW_MIN_BLOCKS) + end / WINDOW_MAX_BLOCKS
        // + 1 passes.
        while blk < end {
            let to = blk.saturating_add(window).min(end);
            for e in file::read_extents(&self.m, ino, &g, blk, to)? {
                if e.unwritten || e.end() <= blk {
                    continue;
                }
                if !hole {
                    return Ok((e.lblk.max(blk) * BS).max(off));
                }
                if e.lblk > blk {
                    break;
                }
                blk = e.end();
            }
            if hole && blk < to {
                // No written extent covers `blk`: the hole starts there.
                return Ok((blk * BS).max(off).min(size));
            }
            blk = blk.max(to);
            window = (window * 2).min(WINDOW_MAX_BLOCKS);
        }
        if hole {
            Ok(size)
        } else {
            Err(Error::NoData)
        }
    }
}

//! copy_file_range(2) inside the engine: the data goes from the source's blocks to the
//! destination's without leaving the engine.

use super::*;

/// Most bytes copied per step: each step is one read and one write of the kind the FUSE
/// adapter serves every day (its largest write is 1 MiB).
const COPY_STEP: u64 = 1 << 20;

impl FileSystem {
    /// Copy up to `len` bytes of `ino_in` at `off_in` to `ino_out` at `off_out`. Returns how
    /// many were copied: `len`, or fewer at the source's end (0 at or past it). The
    /// destination grows to cover the copy. Holes of the source read as zeros in the
    /// destination: a hole is punched where it had blocks and none are allocated past its
    /// end. Two ranges of one file must not overlap (EINVAL, as Linux's check). Not atomic:
    /// a crash may leave part of the range copied, as after a series of writes.
    ///
    /// The copy reads and writes blocks now; with reference-counted extents this is where
    /// the destination would share the source's instead (reflink).
    pub fn copy_file_range(&self, ino_in: u64, off_in: u64, ino_out: u64, off_out: u64, len: u64) -> Result<u64> {
        let size_in = self.regular_file(ino_in)?.size;
        self.regular_file(ino_out)?;
        let count = len.min(size_in.saturating_sub(off_in));
        if count == 0 {
            return Ok(0);
        }
        if ino_in == ino_out && off_out < off_in + count && off_in < off_out + count {
            return Err(Error::Invalid("copy_file_range of overlapping ranges in one file"));
        }
        off_out.checked_add(count).filter(|&end| end <= MAX_FILE_BLOCKS * BS).ok_or(Error::FileTooBig)?;
        let end_in = off_in + count;
        let out_at = |pos: u64| off_out + (pos - off_in);
        let mut pos = off_in;
        while pos < end_in {
            // The source may shrink meanwhile: its end (NoData) then ends the copy.
            let data_at = match self.seek(ino_in, pos, false) {
                Ok(found) => found.min(end_in),
                Err(Error::NoData) => end_in,
                Err(error) => return Err(error),
            };
            if data_at > pos {
                self.zero_below_eof(ino_out, out_at(pos), data_at - pos)?;
                pos = data_at;
                continue;
            }
            let hole_at = match self.seek(ino_in, pos, true) {
                Ok(found) => found.min(end_in),
                Err(Error::NoData) => break,
                Err(error) => return Err(error),
            };
            while pos < hole_at {
                let data = self.read(ino_in, pos, (hole_at - pos).min(COPY_STEP) as usize)?;
                if data.is_empty() {
                    break;
                }
                self.write(ino_out, out_at(pos), &data)?;
                pos += data.len() as u64;
            }
            if pos < hole_at {
                break;
            }
        }
        // A hole at the end of the range extends the destination too.
        let end_out = out_at(pos);
        if self.getattr(ino_out)?.size < end_out {
            self.setattr(ino_out, &SetAttr { size: Some(end_out), ..Default::default() })?;
        }
        Ok(pos - off_in)
    }

    /// The attributes of `ino`, a regular file (EISDIR for a directory, EINVAL otherwise).
    fn regular_file(&self, ino: u64) -> Result<Attr> {
        let a = self.getattr(ino)?;
        match a.kind {
            FileType::RegularFile => Ok(a),
            FileType::Directory => Err(Error::IsDir),
            _ => Err(Error::Invalid("copy_file_range of a non-regular file")),
        }
    }

    /// Make `[off, off + len)` of `ino` read as zeros where the file has blocks: punch the
    /// part below its end (past it, a later size change leaves a hole).
    fn zero_below_eof(&self, ino: u64, off: u64, len: u64) -> Result<()> {
        let size = self.getattr(ino)?.size;
        if off >= size {
            return Ok(());
        }
        self.fallocate(ino, off, len.min(size - off), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
    }
}

//! The baseline of `ferrofs bench published`: the same tree as a squashfs image in an
//! s3backer-backed file on the same server, each of the 4 readers with its own s3backer mount
//! (as on 4 machines; its block cache in a file, so that a warm case keeps it across mounts)
//! and squashfuse on top. s3backer's blocks are 1 MiB, as the published image's chunks are.
//! The data is random, so mksquashfs stores data and fragments uncompressed (`-noD -noF`):
//! compressing would gain nothing and cost the build and every read CPU time.

use super::published::{remove_caches, Ctx, MOUNTS};
use super::published_report::{Case, Sample};
use super::shell::{self, run};
use super::undo::{Stack, Undo};
use crate::failure::{CliResult, Failure};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The baseline's name in the report.
pub(super) const NAME: &str = "s3backer + squashfuse";
/// s3backer's block: an object of the store.
const BLOCK_BYTES: u64 = 1 << 20;
/// Where its blocks go in the bucket.
const PREFIX: &str = "squashfs/";
const PROGRAMS: [(&str, &str); 3] =
    [("s3backer", "s3backer"), ("squashfuse", "squashfuse"), ("mksquashfs", "squashfs-tools")];

/// Why the baseline cannot run here, if it cannot: the programs missing and their packages.
pub(super) fn unavailable() -> Option<String> {
    let missing: Vec<String> = PROGRAMS
        .iter()
        .filter(|(program, _)| !shell::have(program))
        .map(|(program, package)| format!("{program} (Debian package {package})"))
        .collect();
    (!missing.is_empty()).then(|| format!("{} not installed", missing.join(", ")))
}

/// The squashfs image in the store.
pub(super) struct Squashfs {
    /// Its size, a whole number of blocks (s3backer's file size).
    pub bytes: u64,
}

/// mksquashfs of the tree (from the image mounted read-only) into a local file, copied into
/// an s3backer-backed file; the local copy is deleted once stored.
pub(super) fn build(cx: &Ctx, stack: &mut Stack) -> CliResult<Squashfs> {
    let local = cx.work.join("tree.sqfs");
    stack.push(Undo::File(local.clone()));
    {
        let mut source = Stack::default();
        let dir = cx.work.join("squashfs-source");
        cx.mount_ferrofs(&mut source, &cx.image, "ro", &dir)?;
        run(Command::new("mksquashfs").arg(&dir).arg(&local).args(["-noappend", "-no-progress", "-noD", "-noF"]))?;
        source.close()?;
    }
    let bytes = std::fs::metadata(&local)
        .map_err(|e| Failure::new(format!("stat {}", local.display()), e))?
        .len()
        .div_ceil(BLOCK_BYTES)
        * BLOCK_BYTES;
    let squashfs = Squashfs { bytes };
    {
        let mut writer = Stack::default();
        let dir = cx.work.join("s3backer-writer");
        let mut cmd = s3backer(cx, &squashfs, 0);
        cmd.arg("--blockCacheSize=64").arg(&cx.server.bucket).arg(&dir);
        cx.start_mount(&mut writer, cmd, &dir, "s3backer-writer")?;
        run(Command::new("dd")
            .arg(format!("if={}", local.display()))
            .arg(format!("of={}", dir.join("file").display()))
            .args(["bs=1M", "conv=notrunc,fsync", "status=none"]))?;
        writer.close()?;
    }
    Undo::File(local).undo()?;
    Ok(squashfs)
}

/// s3backer in the foreground on the server through the endpoint for `delay_ms`, path-style
/// (its `--region` would switch to virtual-host names, which a localhost server lacks; the
/// server's region is s3backer's default).
fn s3backer(cx: &Ctx, squashfs: &Squashfs, delay_ms: u64) -> Command {
    let s = &cx.server;
    let mut cmd = Command::new("s3backer");
    cmd.arg("-f")
        .arg(format!("--blockSize={BLOCK_BYTES}"))
        .arg(format!("--size={}", squashfs.bytes))
        .arg(format!("--accessId={}", s.access_key))
        .arg(format!("--accessKey={}", s.secret_key))
        .arg(format!("--baseURL={}/", cx.endpoint(delay_ms)))
        .arg(format!("--prefix={PREFIX}"));
    cmd
}

fn cache_file(cx: &Ctx, m: usize) -> PathBuf {
    cx.work.join(format!("s3backer-cache{m}"))
}

/// One case: 4 s3backer mounts (read-only, a block cache file each, emptied when cold, able
/// to hold the whole image) with squashfuse on each.
pub(super) fn measure(cx: &Ctx, squashfs: &Squashfs, case: &Case) -> CliResult<Sample> {
    let caches: Vec<PathBuf> = (0..MOUNTS).map(|m| cache_file(cx, m)).collect();
    if !case.warm {
        remove_caches(&caches)?;
    }
    let mut stack = Stack::default();
    let mut roots = Vec::new();
    let mut blocks = Vec::new();
    for (m, cache) in caches.iter().enumerate() {
        let block_dir = cx.work.join(format!("s3backer{m}"));
        let mut cmd = s3backer(cx, squashfs, case.delay_ms);
        cmd.arg("--readOnly")
            .arg(format!("--blockCacheSize={}", squashfs.bytes / BLOCK_BYTES + 1))
            .arg(format!("--blockCacheFile={}", cache.display()))
            .arg(&cx.server.bucket)
            .arg(&block_dir);
        cx.start_mount(&mut stack, cmd, &block_dir, &format!("s3backer{m}"))?;
        let dir = cx.mount_dir(m);
        let mut squashfuse = Command::new("squashfuse");
        squashfuse.arg("-f").arg(block_dir.join("file")).arg(&dir);
        cx.start_mount(&mut stack, squashfuse, &dir, &format!("squashfuse{m}"))?;
        roots.push(dir);
        blocks.push(block_dir);
    }
    cx.finish_case(stack, &roots, &caches, case.warm, || {
        blocks.iter().map(|b| blocks_fetched(b).map(|n| n * BLOCK_BYTES)).sum()
    })
}

/// Blocks an s3backer mount fetched from the store, from its `stats` file.
fn blocks_fetched(block_dir: &Path) -> CliResult<u64> {
    let path = block_dir.join("stats");
    let text = std::fs::read_to_string(&path).map_err(|e| Failure::new(format!("read {}", path.display()), e))?;
    text.lines()
        .find_map(|l| l.strip_prefix("http_normal_blocks_read"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Failure::new(path.display().to_string(), "no http_normal_blocks_read count"))
}

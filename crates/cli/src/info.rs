//! `ferrofs info`: the superblock and a per-AG summary of an image.

use crate::failure::{CliResult, Context};
use crate::geometry;
use crate::image;
use crate::units::{grouped, human_bytes, utc_time};
use clap::Args;
use ferrofs::{AgInfo, FileSystem, Superblock, BLOCK_SIZE};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Image file or block device holding a ferrofs file system (it is only read; a log
    /// left by a crash is replayed in memory). It may be mounted: then the figures are the
    /// image's as written so far, and the mount may be ahead of them.
    pub image: PathBuf,
    /// Print everything as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Info {
    image: String,
    /// Where the image is mounted, if it is: the figures are then what the mount has
    /// written to the image so far (its last checkpoint, and the log written since).
    mounted_on: Option<String>,
    uuid: String,
    label: String,
    mkfs_time: i64,
    block_size: u64,
    blocks: u64,
    ag_count: u32,
    ag_blocks: u64,
    inodes_per_ag: u32,
    bytes_per_inode: u64,
    orphan_slots_per_ag: u32,
    log_blocks: u64,
    /// Log records a read-write mount would replay (0: cleanly unmounted).
    log_records_pending: u64,
    free_blocks: u64,
    total_inodes: u64,
    free_inodes: u64,
    ags: Vec<AgInfo>,
    #[serde(skip)]
    superblock: Superblock,
}

pub fn run(args: &InfoArgs) -> CliResult<()> {
    let (fs, mounted_on) = image::mount_read_only_even_if_mounted(&args.image)?;
    let mut info = collect(&args.image.display().to_string(), &fs);
    info.mounted_on = mounted_on;
    if args.json {
        let text = serde_json::to_string_pretty(&info).context(|| "info: JSON".to_string())?;
        println!("{text}");
    } else {
        print_table(&info);
    }
    Ok(())
}

fn collect(image: &str, fs: &FileSystem) -> Info {
    let (engine, st) = (fs.info(), fs.statfs());
    let (sb, g) = (&engine.superblock, &engine.superblock.geo);
    Info {
        image: image.to_string(),
        mounted_on: None,
        uuid: geometry::uuid_string(&sb.uuid),
        label: sb.label.clone(),
        mkfs_time: sb.mkfs_time,
        block_size: BLOCK_SIZE as u64,
        blocks: g.block_count,
        ag_count: g.ag_count,
        ag_blocks: g.ag_blocks,
        inodes_per_ag: g.inodes_per_ag,
        bytes_per_inode: geometry::bytes_per_inode(g),
        orphan_slots_per_ag: g.orphan_slots_per_ag,
        log_blocks: g.log_blocks,
        log_records_pending: engine.log_records_replayed,
        free_blocks: st.bfree,
        total_inodes: st.files,
        free_inodes: st.ffree,
        superblock: engine.superblock,
        ags: engine.ags,
    }
}

fn print_table(info: &Info) {
    let bs = info.block_size;
    println!("{}: ferrofs file system", info.image);
    if let Some(dir) = &info.mounted_on {
        println!("  mounted on {dir}: figures as of its last checkpoint; the mount may be ahead");
    }
    print!("{}", geometry::summary(&info.superblock));
    println!("  {:<18} {}", "created", utc_time(info.mkfs_time));
    println!(
        "  {:<18} {} of {} ({} blocks)",
        "free space",
        human_bytes(info.free_blocks * bs),
        human_bytes(info.blocks * bs),
        grouped(info.free_blocks)
    );
    println!("  {:<18} {} of {}", "free inodes", grouped(info.free_inodes), grouped(info.total_inodes));
    println!("  {:<18} {}", "log", log_state(info.log_records_pending));
    println!();
    println!("AG layout (block numbers) and free counts:");
    println!(
        "{:>5} {:>11} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8}",
        "AG",
        "start",
        "blocks",
        "block-bmap",
        "inode-bmap",
        "orphan-tbl",
        "inode-tbl",
        "data-start",
        "free-blks",
        "free-inos",
        "orphans"
    );
    for a in &info.ags {
        println!(
            "{:>5} {:>11} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8}",
            a.agno,
            a.start,
            a.blocks,
            a.block_bitmap,
            a.inode_bitmap,
            a.orphan_table,
            a.inode_table,
            a.data_start,
            a.free_blocks,
            a.free_inodes,
            a.orphans
        );
    }
    if let Some((agno, log)) = info.ags.iter().find_map(|a| a.log.map(|l| (a.agno, l))) {
        println!("log: blocks {}..{} in AG {}", log, log + info.log_blocks, agno);
    }
}

fn log_state(records: u64) -> String {
    match records {
        0 => "clean".to_string(),
        n => format!("{n} records not yet written home (a read-write mount replays them)"),
    }
}

//! The geometry summary printed by `mkfs` and `info`.

use crate::units::{grouped, human_bytes};
use ferrofs::{Geometry, Superblock, BLOCK_SIZE, INODE_SIZE};

const BS: u64 = BLOCK_SIZE as u64;

pub fn uuid_string(uuid: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*uuid).hyphenated().to_string()
}

/// A label as the listings show it: quoted, or `(none)`.
pub fn label_text(label: &str) -> String {
    if label.is_empty() {
        "(none)".to_string()
    } else {
        format!("{label:?}")
    }
}

/// The bytes-per-inode ratio mkfs was given, recovered from the geometry.
pub fn bytes_per_inode(geo: &Geometry) -> u64 {
    geo.ag_blocks * BS / geo.inodes_per_ag as u64
}

/// Indented `name  value` lines describing the whole file system.
pub fn summary(sb: &Superblock) -> String {
    let g = &sb.geo;
    let lines = [
        ("size", format!("{} ({} blocks of {} bytes)", human_bytes(g.block_count * BS), grouped(g.block_count), BS)),
        (
            "allocation groups",
            format!("{} x {} blocks ({})", g.ag_count, grouped(g.ag_blocks), human_bytes(g.ag_blocks * BS)),
        ),
        (
            "inodes",
            format!(
                "{} ({} per AG, {} bytes each, one per {} of space)",
                grouped(g.total_inodes()),
                grouped(g.inodes_per_ag as u64),
                INODE_SIZE,
                human_bytes(bytes_per_inode(g))
            ),
        ),
        ("log", format!("{} blocks ({}) in AG 0", grouped(g.log_blocks), human_bytes(g.log_blocks * BS))),
        ("orphan slots", format!("{} per AG", grouped(g.orphan_slots_per_ag as u64))),
        ("uuid", uuid_string(&sb.uuid)),
        ("label", label_text(&sb.label)),
    ];
    lines.iter().map(|(name, value)| format!("  {name:<18} {value}\n")).collect()
}

//! Collecting what no kept generation needs (docs/DESIGN.md, "Publishing to object storage").
//!
//! Kept: the `keep` newest generations up to `HEAD` (so `HEAD` always), and every manifest
//! above `HEAD` younger than the grace period (a publish in progress wrote it and is about to
//! move `HEAD`). Deleted: manifests below the kept ones and stale ones above `HEAD`, first;
//! then chunks no kept manifest names, but only those older than the grace period, because a
//! publish in progress may have uploaded a chunk that no manifest names yet. A publish gives
//! up rather than move `HEAD` once [`crate::publish::PUBLISH_WINDOW`] (less than the grace)
//! has passed since its first upload, so no chunk it relies on can be old enough to go.

use crate::publish::{manifest_generations, stored_hashes};
use crate::store::{parse_hex, Remote, RemoteError};
use object_store::ObjectStoreExt;
use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The shortest grace period gc allows: longer than a publish may take
/// ([`crate::publish::PUBLISH_WINDOW`]) with room for clocks that disagree by minutes.
pub const GRACE_MIN: Duration = Duration::from_secs(60 * 60);
/// Deletions in flight at once.
const DELETES_IN_FLIGHT: usize = 32;

/// What gc did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The generations kept, oldest first.
    pub kept: Vec<u64>,
    /// Manifests deleted.
    pub manifests_deleted: u64,
    /// Chunks deleted.
    pub chunks_deleted: u64,
    /// Their bytes.
    pub bytes_deleted: u64,
    /// Chunks no kept manifest names but younger than the grace period, left for a later gc.
    pub chunks_spared: u64,
}

/// Deletes the manifests and chunks that neither the `keep` newest generations up to `HEAD`
/// nor a publish in progress need; objects younger than `grace` stay. Any manifest that must be
/// read and cannot be stops gc before it deletes anything.
pub fn gc(remote: &Remote, keep: usize, grace: Duration) -> Result<GcReport, RemoteError> {
    assert!(keep >= 1, "gc keeps at least HEAD");
    let Some(head) = remote.head()? else {
        return Ok(GcReport::default());
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let manifests = remote.list(&remote.manifests_dir())?;
    let young = |last_modified: i64| now.as_secs() < last_modified.max(0) as u64 + grace.as_secs();
    let generations = manifest_generations(remote)?;
    let kept: Vec<u64> = {
        let below_head: Vec<u64> = generations.iter().copied().filter(|&g| g <= head).collect();
        below_head[below_head.len().saturating_sub(keep)..].to_vec()
    };
    if kept.last() != Some(&head) {
        return Err(RemoteError::NotFound(remote.manifest_key(head).to_string()));
    }
    let lowest_kept = kept.first().copied().unwrap_or(head);
    let mut live = HashSet::new();
    let mut doomed_manifests = Vec::new();
    for object in &manifests {
        let Some(generation) =
            object.location.filename().and_then(|name| crate::store::parse_generation(name.as_bytes()))
        else {
            continue;
        };
        let in_progress = generation > head && young(object.last_modified.timestamp());
        if kept.contains(&generation) || in_progress {
            live.extend(stored_hashes(&remote.manifest(generation)?));
        } else if generation < lowest_kept || generation > head {
            doomed_manifests.push(object.location.clone());
        }
    }
    let mut report = GcReport { kept: kept.clone(), ..Default::default() };
    // Manifests before chunks: a gc that stops half way leaves chunks no manifest names (the
    // next gc takes them), never a manifest whose chunks are gone.
    report.manifests_deleted = delete_all(remote, doomed_manifests)?;
    let mut doomed_chunks = Vec::new();
    for object in remote.list(&remote.chunks_dir())? {
        let Some(hash) = object.location.filename().and_then(parse_hex) else { continue };
        if live.contains(&hash) {
            continue;
        }
        if young(object.last_modified.timestamp()) {
            report.chunks_spared += 1;
        } else {
            report.bytes_deleted += object.size;
            doomed_chunks.push(object.location);
        }
    }
    report.chunks_deleted = delete_all(remote, doomed_chunks)?;
    Ok(report)
}

/// Deletes every key, many at once; how many.
fn delete_all(remote: &Remote, keys: Vec<object_store::path::Path>) -> Result<u64, RemoteError> {
    let count = keys.len() as u64;
    remote.for_each_concurrent(keys, DELETES_IN_FLIGHT, |key| async move {
        match remote.object_store().delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(remote.error("delete", &key, error)),
        }
    })?;
    Ok(count)
}

//! `ferrofs mount s3://bucket/prefix DIR -o ro[,cache=DIR,cache_size=SIZE,generation=N,
//! endpoint=URL,fetch_tries=N,fetch_timeout=SECONDS]`: serve one generation of a published image, read-only, its chunks fetched
//! on demand into a local chunk cache (`ferrofs_remote::device`). The generation is pinned when
//! the mount starts (HEAD's, or `generation=N`) and kept for the mount's life: a reader never
//! sees two generations mixed, and a new one is picked up by mounting again.

use crate::failure::{CliResult, Context, Failure};
use crate::mount_config::{config, MountArgs};
use crate::units::{human_bytes, parse_size};
use ferrofs::{CacheBudget, DEFAULT_CACHE_BYTES};
use ferrofs_fuse::{DeviceSource, OpenedDevice};
use ferrofs_remote::cache::ChunkCache;
use ferrofs_remote::device::{ChunkDevice, DeviceOptions, StoreChunks};
use ferrofs_remote::{Remote, RemoteOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The chunk cache's bound when `cache_size` is not given.
const DEFAULT_CHUNK_CACHE_BYTES: u64 = 4 << 30;

/// Most tries of one chunk fetch `fetch_tries` allows: the waits between them double from
/// 0.2 s, so 10 tries already wait 102 s besides the tries themselves.
const FETCH_TRIES_MAX: u32 = 10;
/// Longest bound on one try `fetch_timeout` allows, in seconds.
const FETCH_TIMEOUT_MAX_SECS: f64 = 3600.0;

/// Whether `image` names a published image rather than a file.
pub fn is_remote(image: &Path) -> bool {
    image.to_str().is_some_and(|s| s.starts_with("s3://"))
}

/// What a published image's mount takes beyond an image file's options.
#[derive(Clone, Debug, PartialEq)]
struct RemoteMount {
    url: String,
    cache_dir: PathBuf,
    cache_bytes: u64,
    generation: Option<u64>,
    endpoint: Option<String>,
    /// How hard the chunk device tries a fetch (`fetch_tries`, `fetch_timeout`).
    device: DeviceOptions,
}

/// Take this mount's own options out of `options`; the rest are the usual mount options.
fn parse(url: &str, options: &[String]) -> Result<(RemoteMount, Vec<String>), String> {
    let mut mount = RemoteMount {
        url: url.to_string(),
        cache_dir: default_cache_dir(),
        cache_bytes: DEFAULT_CHUNK_CACHE_BYTES,
        generation: None,
        endpoint: None,
        device: DeviceOptions::default(),
    };
    let mut rest = Vec::new();
    let mut read_only = false;
    for o in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let (key, value) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        let needs = |what: &str| value.filter(|v| !v.is_empty()).ok_or(format!("bad option '{o}': {key} takes {what}"));
        match key {
            "ro" => read_only = true,
            "rw" => read_only = false,
            "cache" => mount.cache_dir = PathBuf::from(needs("a directory")?),
            "cache_size" => {
                mount.cache_bytes =
                    parse_size(needs("a size (e.g. 10G)")?).map_err(|e| format!("bad option '{o}': {e}"))?
            }
            "generation" => {
                mount.generation = Some(
                    needs("a number")?.parse().map_err(|_| format!("bad option '{o}': generation takes a number"))?,
                )
            }
            "endpoint" => mount.endpoint = Some(needs("a URL (http://host:port)")?.to_string()),
            "fetch_tries" => {
                mount.device.attempts = needs("a number")?
                    .parse()
                    .ok()
                    .filter(|n| (1..=FETCH_TRIES_MAX).contains(n))
                    .ok_or(format!("bad option '{o}': fetch_tries takes a number from 1 to {FETCH_TRIES_MAX}"))?
            }
            "fetch_timeout" => {
                let secs: f64 = needs("seconds")?
                    .parse()
                    .ok()
                    .filter(|s| *s > 0.0 && *s <= FETCH_TIMEOUT_MAX_SECS)
                    .ok_or(format!("bad option '{o}': fetch_timeout takes seconds, above 0 and at most 3600"))?;
                mount.device.attempt_timeout = Duration::from_secs_f64(secs);
            }
            "shared" | "writeback_cache" | "discard" => {
                return Err(format!("option '{o}' does not apply to a published image"))
            }
            _ => rest.push(o.to_string()),
        }
    }
    if !read_only {
        return Err("a published image can only be mounted read-only: add -o ro".into());
    }
    Ok((mount, rest))
}

/// `/var/cache/ferrofs` for root, else `$XDG_CACHE_HOME/ferrofs` (`~/.cache/ferrofs`).
fn default_cache_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/ferrofs");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("ferrofs")
}

pub fn run(args: &MountArgs) -> CliResult<()> {
    let url = args.image.to_string_lossy().into_owned();
    let what = || format!("mount {url} on {}", args.mountpoint.display());
    let (remote, options) = parse(&url, &args.options).map_err(|why| Failure::new(what(), why))?;
    if args.shared || args.mkfs.is_some() {
        return Err(Failure::new(what(), "--shared and --mkfs do not apply to a published image"));
    }
    let mut cfg = config(&MountArgs { options, ..args.clone() }).map_err(|why| Failure::new(what(), why))?;
    cfg.read_only = true;
    let opener = remote.clone();
    cfg.device = Some(DeviceSource { open: Arc::new(move || open_device(&opener)) });
    ferrofs_fuse::check(&cfg).context(what)?;
    let log_file = crate::logging::open_log_file(&args.options).map_err(|why| Failure::new(what(), why))?;
    crate::logging::init(Some(&url), log_file);
    cfg.cache = Some(CacheBudget::for_process(DEFAULT_CACHE_BYTES));
    if args.daemon {
        return crate::mount::daemonize(&cfg).context(what);
    }
    ferrofs_fuse::mount(&cfg, || {
        eprintln!(
            "ferrofs: {url} mounted on {}; unmount with umount, fusermount3 -u or Ctrl-C",
            cfg.mountpoint.display()
        )
    })
    .context(what)
}

/// Open the store, pin the generation, read its manifest and open the chunk device: in the
/// process that serves the mount. Each failure a user meets is one line.
fn open_device(mount: &RemoteMount) -> io::Result<OpenedDevice> {
    let store =
        Remote::open(&mount.url, &RemoteOptions { endpoint: mount.endpoint.clone() }).map_err(io::Error::other)?;
    let generation = match mount.generation {
        Some(g) => g,
        None => store
            .head()
            .map_err(io::Error::other)?
            .ok_or_else(|| io::Error::other(format!("nothing is published at {} (no HEAD)", mount.url)))?,
    };
    let manifest = store.manifest(generation).map_err(io::Error::other)?;
    let cache = ChunkCache::open(&mount.cache_dir, mount.cache_bytes)
        .map_err(|e| io::Error::new(e.kind(), format!("chunk cache {}: {e}", mount.cache_dir.display())))?;
    let device = ChunkDevice::open(&manifest, Arc::new(StoreChunks(store)), Some(cache), mount.device.clone())?;
    let device = Arc::new(device);
    log::info!("serving generation {generation} of {} (chunk cache {})", mount.url, mount.cache_dir.display());
    let counters = device.clone();
    let status = Box::new(move || {
        let s = counters.stats();
        serde_json::json!({
            "generation": generation,
            "hits": s.hits,
            "misses": s.misses,
            "bytes_fetched": s.bytes_fetched,
            "bytes_read": s.bytes_read,
            "cache_bytes": counters.cache_bytes().unwrap_or(0),
        })
        .to_string()
    });
    Ok(OpenedDevice { device, status })
}

/// One published-image mount as `ferrofs mounts` shows it.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct RemoteStatus {
    pub source: String,
    pub mountpoint: PathBuf,
    pub generation: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes_fetched: u64,
    pub bytes_read: u64,
    pub cache_bytes: u64,
    /// How requests reach its daemon: "io_uring" or "/dev/fuse".
    pub transport: String,
}

impl RemoteStatus {
    /// Chunk reads served locally, in percent.
    fn hit_percent(&self) -> f64 {
        100.0 * self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// The published-image mounts of this machine that answer on their control sockets.
pub fn statuses() -> Vec<RemoteStatus> {
    crate::shared::ferrofs_mounts()
        .into_iter()
        .filter(|(source, _)| source.starts_with("s3://"))
        .filter_map(|(source, mountpoint)| {
            let answer = ferrofs_fuse::control_request(&mountpoint, "source").ok()?;
            let v: serde_json::Value = serde_json::from_str(&answer).ok()?;
            let field = |name: &str| v[name].as_u64().unwrap_or(0);
            Some(RemoteStatus {
                transport: crate::shared::transport_of(&mountpoint),
                source,
                mountpoint,
                generation: field("generation"),
                hits: field("hits"),
                misses: field("misses"),
                bytes_fetched: field("bytes_fetched"),
                bytes_read: field("bytes_read"),
                cache_bytes: field("cache_bytes"),
            })
        })
        .collect()
}

/// Print the published-image mounts as a table (after the shared daemon's, in `ferrofs
/// mounts`).
pub fn print(mounts: &[RemoteStatus]) {
    if mounts.is_empty() {
        return;
    }
    println!("published images:");
    println!(
        "{:40}  {:30}  {:>10}  {:>8}  {:>10}  {:>10}  {:9}  CACHE",
        "SOURCE", "MOUNT POINT", "GENERATION", "HITS", "FETCHED", "READ", "TRANSPORT"
    );
    for m in mounts {
        println!(
            "{:40}  {:30}  {:>10}  {:>7.1}%  {:>10}  {:>10}  {:9}  {}",
            m.source,
            m.mountpoint.display().to_string(),
            m.generation,
            m.hit_percent(),
            human_bytes(m.bytes_fetched),
            human_bytes(m.bytes_read),
            m.transport,
            human_bytes(m.cache_bytes)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_of_a_published_image() {
        let (m, rest) = parse(
            "s3://b/p",
            &opts(&["ro", "cache=/c", "cache_size=1G", "generation=7", "endpoint=http://h:1", "noatime"]),
        )
        .unwrap();
        assert_eq!(m.cache_dir, PathBuf::from("/c"));
        assert_eq!(m.cache_bytes, 1 << 30);
        assert_eq!(m.generation, Some(7));
        assert_eq!(m.endpoint.as_deref(), Some("http://h:1"));
        assert_eq!(rest, opts(&["noatime"]));
        assert_eq!(m.device, DeviceOptions::default());
        let (m, _) = parse("s3://b/p", &opts(&["ro", "fetch_tries=2", "fetch_timeout=1.5"])).unwrap();
        assert_eq!((m.device.attempts, m.device.attempt_timeout), (2, Duration::from_millis(1500)));
        for bad in [
            "fetch_tries=0",
            "fetch_tries=11",
            "fetch_tries=x",
            "fetch_timeout=0",
            "fetch_timeout=-1",
            "fetch_timeout=NaN",
        ] {
            assert!(parse("s3://b/p", &opts(&["ro", bad])).unwrap_err().contains(bad), "{bad}");
        }
        assert!(parse("s3://b/p", &opts(&["cache=/c"])).unwrap_err().contains("-o ro"));
        assert!(parse("s3://b/p", &opts(&["ro", "rw"])).unwrap_err().contains("read-only"));
        assert!(parse("s3://b/p", &opts(&["ro", "generation=x"])).unwrap_err().contains("generation=x"));
        assert!(parse("s3://b/p", &opts(&["ro", "cache_size=lots"])).unwrap_err().contains("cache_size=lots"));
        assert!(parse("s3://b/p", &opts(&["ro", "writeback_cache"])).unwrap_err().contains("writeback_cache"));
        assert!(is_remote(Path::new("s3://b/p")));
        assert!(!is_remote(Path::new("/s3:/b")));
    }
}

//! What a mount asks for: the arguments and `-o` options of `ferrofs mount` (and of a mount
//! request to the shared daemon) as a FUSE mount configuration, and where an image is
//! mounted already. Both the command (`mount.rs`) and the shared daemon (`shared.rs`) build
//! their mounts from here.

use crate::units::parse_size;
use clap::Args;
use ferrofs_fuse::MountConfig;
use std::path::PathBuf;
use std::time::Duration;

/// How long a mount waits for the image lock of a daemon that is still finishing the
/// previous unmount of the same image (the kernel lets `umount` return before it has).
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(30);

#[derive(Args, Clone, Debug)]
pub struct MountArgs {
    /// The image file or block device, or LABEL=label or UUID=uuid: the block device holding
    /// the ferrofs file system with that label or UUID.
    pub image: PathBuf,
    /// An existing directory to mount on.
    pub mountpoint: PathBuf,
    /// Mount options, comma separated: ro, rw, allow_other, allow_root, default_permissions
    /// (the kernel checks permissions: the default), daemon_permissions (ferrofs checks them
    /// itself: faster removal, but FIFOs, sockets and device nodes open unchecked),
    /// acl (POSIX ACLs honoured: the default), noacl,
    /// threads=N, cache_size=SIZE, writeback_cache, uring (FUSE over io_uring when the kernel
    /// offers it; uring=force first switches the fuse module's enable_uring on, system-wide),
    /// entry_timeout=SECS, attr_timeout=SECS (default 3600), fsname=NAME, relatime (default), strictatime, noatime, nodiratime,
    /// discard (punch freed blocks in the image once durable), nodiscard (the default),
    /// and the generic ones (nosuid, nodev, noexec, ...), which go to the kernel.
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// FUSE worker threads at most, each with its own /dev/fuse descriptor (default: 4 per
    /// CPU). One per CPU always reads; the others only while many clients are active. fsyncs
    /// run on a separate pool and do not occupy them.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Make a file system of this size first if the image does not exist (e.g. 1G).
    #[arg(long, value_parser = parse_size)]
    pub mkfs: Option<u64>,
    /// Detach once the file system is mounted; the daemon serves until unmounted.
    #[arg(long, short = 'd')]
    pub daemon: bool,
    /// Serve this mount from the shared daemon (started if none runs), which serves several
    /// images in one process, all sharing the cache budget set by the mount that started it.
    /// Implies --daemon.
    #[arg(long)]
    pub shared: bool,
}

/// Build the mount configuration from the arguments and `-o` options.
pub(crate) fn config(args: &MountArgs) -> Result<MountConfig, String> {
    // The canonical image path is the mount's source, as `mount` and `df` show it, and how
    // a second mount of the same image is recognised.
    let image = match crate::mount_remote::is_remote(&args.image) {
        true => args.image.clone(),
        false => args.image.canonicalize().map_err(|e| format!("image {}: {e}", args.image.display()))?,
    };
    let mut cfg = MountConfig::new(&image, &args.mountpoint);
    cfg.fs_name = Some(image.display().to_string());
    cfg.lock_timeout = LOCK_WAIT;
    for o in args.options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let (key, value) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        let number = |v: Option<&str>| v.and_then(|v| v.parse::<f64>().ok()).filter(|n| n.is_finite() && *n >= 0.0);
        match key {
            "ro" => cfg.read_only = true,
            "rw" => cfg.read_only = false,
            "allow_other" => cfg.allow_other = true,
            "default_permissions" => cfg.default_permissions = true,
            "daemon_permissions" => cfg.default_permissions = false,
            "writeback_cache" => cfg.writeback_cache = true,
            "discard" => cfg.discard = true,
            "nodiscard" => cfg.discard = false,
            "uring" => {
                cfg.uring = match value {
                    None => ferrofs_fuse::Uring::On,
                    Some("force") => ferrofs_fuse::Uring::Force,
                    Some(_) => return Err(format!("bad option '{o}': uring or uring=force")),
                }
            }
            "threads" => {
                cfg.threads = value
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or(format!("bad option '{o}': threads takes a whole number above 0"))?
            }
            "entry_timeout" => {
                cfg.entry_timeout =
                    Duration::from_secs_f64(number(value).ok_or(format!("bad option '{o}': a number of seconds"))?)
            }
            "attr_timeout" => {
                cfg.attr_timeout =
                    Duration::from_secs_f64(number(value).ok_or(format!("bad option '{o}': a number of seconds"))?)
            }
            "fsname" => cfg.fs_name = value.map(str::to_string),
            "cache_size" => {
                cfg.cache_bytes = Some(
                    value
                        .ok_or(format!("bad option '{o}': cache_size takes a size (e.g. 512M)"))
                        .and_then(parse_size)
                        .map_err(|e| format!("bad option '{o}': {e}"))?,
                )
            }
            // Options for mount(8) and fstab only, not for the file system.
            // Handled by `run`: which daemon serves the mount, and where it logs.
            "shared" | "log" => {}
            "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "_netdev" | "nofail" | "owner" | "group"
            | "comment" => {}
            _ if key.starts_with("x-") => {}
            _ => cfg.options.push(o.to_string()),
        }
    }
    if let Some(t) = args.threads {
        cfg.threads = t;
    }
    if cfg.threads > ferrofs_fuse::THREADS_MAX {
        return Err(format!("{} threads requested, at most {} allowed", cfg.threads, ferrofs_fuse::THREADS_MAX));
    }
    Ok(cfg)
}

/// Where `image` is mounted through FUSE now, if it is: by whatever name (the image file, a
/// loop device of it) it was mounted, the same image ([`ferrofs::dev::identity`]). A mount of
/// an image that is merely locked (its daemon is finishing an unmount) waits for the lock
/// instead.
pub(crate) fn mounted_on(image: &std::path::Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let identity = ferrofs::dev::identity_of_path(image).ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, r.next()?);
        let same = |source: &str| {
            std::path::Path::new(source) == image || ferrofs::dev::identity_of_path(source).is_ok_and(|i| i == identity)
        };
        (fstype.starts_with("fuse") && same(source)).then(|| left.split(' ').nth(4).unwrap_or("?").to_string())
    })
}

/// The image file or device that the FUSE mount on `dir` serves (the mount's source in
/// /proc/self/mountinfo), if `dir` is a mount point.
pub(crate) fn image_of_mount(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = dir.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // The last line is the mount on top, should several be stacked on `dir`.
    let mut on_dir = info.lines().filter_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, r.next()?);
        let on = left.split(' ').nth(4)?;
        (std::path::Path::new(on) == dir).then_some((fstype, source))
    });
    on_dir.next_back().filter(|(fstype, _)| fstype.starts_with("fuse")).map(|(_, source)| source.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: MountArgs,
    }

    fn parse(line: &[&str]) -> Result<MountConfig, String> {
        let cli =
            Cli::try_parse_from(std::iter::once("mount").chain(line.iter().copied())).map_err(|e| e.to_string())?;
        config(&cli.mount)
    }

    #[test]
    fn options_set_the_config_and_pass_generic_ones_through() {
        let c =
            parse(&["/", "dir", "-o", "ro,noatime,threads=4,x-systemd.automount,defaults,allow_other,cache_size=64M"])
                .unwrap();
        assert!(c.read_only && c.allow_other);
        assert_eq!(c.cache_bytes, Some(64 << 20));
        assert_eq!(c.threads, 4);
        assert_eq!(c.options, vec!["noatime".to_string()]);
        assert_eq!(c.fs_name.as_deref(), Some("/"));
    }

    #[test]
    fn bad_options_are_named() {
        assert!(parse(&["/", "dir", "-o", "threads=lots"]).unwrap_err().contains("threads=lots"));
        assert!(parse(&["/", "dir", "-o", "cache_size=big"]).unwrap_err().contains("cache_size=big"));
        assert!(parse(&["/", "dir", "-o", "entry_timeout=-1"]).unwrap_err().contains("entry_timeout=-1"));
        assert!(parse(&["/", "dir", "--threads", "100000"]).unwrap_err().contains("at most"));
    }
}

//! `ferrofs mount`: serve an image through FUSE, in the foreground or as a daemon, and the
//! mount helper that `mount -t fuse.ferrofs IMAGE DIR` and `/etc/fstab` run.
//!
//! mount(8) runs `/sbin/mount.fuse.ferrofs IMAGE DIR [-sfnv] [-o OPTS]` for type
//! `fuse.ferrofs`; that name is a link to this binary, which then behaves as
//! `ferrofs mount --daemon`: it returns once the file system is ready to use (or failed, with
//! the reason on stderr and a non-zero exit), and the daemon serves until unmounted.
//!
//! `--shared` hands the mount to the user's shared daemon instead (see `shared.rs`), which
//! serves several images in one process with one cache budget.

use crate::daemon::{become_daemon, cap_malloc_arenas, detach_stdio, pipe};
use crate::failure::{CliResult, Context, Failure};
use crate::mkfs::{self, MkfsArgs};
use crate::mount_config::{config, mounted_on, MountArgs};
use ferrofs::{CacheBudget, DEFAULT_CACHE_BYTES};
use ferrofs_fuse::MountConfig;
use std::cell::RefCell;
use std::ffi::OsString;
use std::io::{Read, Write};

/// The names this binary answers to as a mount helper.
pub const HELPER_NAMES: [&str; 2] = ["mount.fuse.ferrofs", "mount.ferrofs"];

pub fn run(args: &MountArgs) -> CliResult<()> {
    cap_malloc_arenas();
    if crate::mount_remote::is_remote(&args.image) {
        return crate::mount_remote::run(args);
    }
    let resolved;
    let args = match crate::image::resolve_tag(&args.image)? {
        Some(device) => {
            resolved = MountArgs { image: device, ..args.clone() };
            &resolved
        }
        None => args,
    };
    let what = || format!("mount {} on {}", args.image.display(), args.mountpoint.display());
    if args.options.iter().any(|o| o.trim() == "remount") {
        return remount(args);
    }
    if let (Some(size), false) = (args.mkfs, args.image.exists()) {
        mkfs::run(&MkfsArgs::for_new_image(args.image.clone(), size))?;
    }
    crate::image::require_ferrofs(&args.image)?;
    let mut cfg = config(args).map_err(|why| Failure::new(what(), why))?;
    // Before forking: a bad mount point or option is reported by this command, not lost.
    ferrofs_fuse::check(&cfg).context(what)?;
    if let Some(dir) = mounted_on(&cfg.image) {
        return Err(Failure::new(what(), format!("the image is already mounted on {dir}")));
    }
    // `-o shared` is how mount(8) and fstab ask for it.
    if args.shared || args.options.iter().any(|o| o.trim() == "shared") {
        return crate::shared::mount(args, &cfg).map_err(|why| Failure::new(what(), why));
    }
    let log_file = crate::logging::open_log_file(&args.options).map_err(|why| Failure::new(what(), why))?;
    crate::logging::init(Some(&cfg.image.display().to_string()), log_file);
    // The daemon serves this one image: its cache size bounds all of its memory.
    cfg.cache = Some(CacheBudget::for_process(cfg.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES)));
    if args.daemon {
        return daemonize(&cfg).context(what);
    }
    ferrofs_fuse::mount(&cfg, || {
        eprintln!(
            "ferrofs: {} mounted on {}; unmount with umount, fusermount3 -u or Ctrl-C",
            cfg.image.display(),
            cfg.mountpoint.display()
        )
    })
    .context(what)
}

/// `-o remount,ro` or `-o remount,rw` (the last of the two counts; without either nothing
/// changes): switch the mount on the mount point. The other options are those mount(8) passes
/// along from fstab; a FUSE mount cannot change them on a remount, so they are ignored.
fn remount(args: &MountArgs) -> CliResult<()> {
    let what = || format!("remount {}", args.mountpoint.display());
    let read_only = args.options.iter().rev().find_map(|o| match o.trim() {
        "ro" => Some(true),
        "rw" => Some(false),
        _ => None,
    });
    match read_only {
        Some(read_only) => ferrofs_fuse::remount(&args.mountpoint, read_only).context(what),
        None => Ok(()),
    }
}

/// Fork a daemon that mounts and serves; return once it says the mount is ready, or fail
/// with the reason it gives. Called while this process is still single-threaded.
pub(crate) fn daemonize(cfg: &MountConfig) -> std::io::Result<()> {
    let (mut from_daemon, to_parent) = pipe()?;
    // SAFETY: the process is single-threaded here (nothing has spawned a thread yet), so the
    // child may go on running arbitrary code after fork.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(from_daemon);
            std::process::exit(daemon_main(cfg, std::fs::File::from(to_parent)))
        }
        _ => {
            drop(to_parent);
            let mut said = String::new();
            from_daemon.read_to_string(&mut said)?;
            match said.strip_prefix("ok") {
                Some(_) => Ok(()),
                None if said.is_empty() => Err(std::io::Error::other("the daemon exited before mounting")),
                None => Err(std::io::Error::other(said)),
            }
        }
    }
}

/// The daemon: a new session, no terminal; report to the parent through `report`: "ok" once
/// the mount is ready, else why it failed.
fn daemon_main(cfg: &MountConfig, report: std::fs::File) -> i32 {
    become_daemon();
    let report = RefCell::new(Some(report));
    let res = ferrofs_fuse::mount(cfg, || {
        if let Some(mut r) = report.borrow_mut().take() {
            let _ = r.write_all(b"ok");
        }
        detach_stdio();
        crate::logging::detached();
    });
    let Err(e) = res else { return 0 };
    match report.borrow_mut().take() {
        Some(mut r) => drop(write!(r, "{e}")),
        None => log::error!("{e}"),
    }
    1
}

/// Translate a mount helper's command line (`IMAGE DIR [-sfnv] [-o OPTS]`, as mount(8) runs
/// it) into `ferrofs mount --daemon IMAGE DIR -o OPTS`.
///
/// mount(8) passes `nosuid` and `nodev` on when they are given, but never `suid` or `dev`:
/// their absence is its default, suid and dev, as ext4 gets. So for `root`, as mount.fuse3
/// does for every FUSE file system, the helper adds `suid` and `dev` unless `nosuid` or
/// `nodev` was given; `ferrofs mount` run directly keeps FUSE's `nosuid,nodev` default.
pub fn helper_argv(args: Vec<OsString>, root: bool) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = vec!["ferrofs".into(), "mount".into(), "--daemon".into()];
    let mut positional = Vec::new();
    let mut it = args.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => {
                out.push("-o".into());
                out.push(it.next().ok_or("-o needs a value")?);
            }
            Some(flags) if flags.starts_with("-o") => {
                out.push("-o".into());
                out.push(flags[2..].into());
            }
            // -s (sloppy), -f (fake), -n (no mtab), -v (verbose): nothing to do for FUSE.
            Some(flags) if flags.starts_with('-') && flags[1..].chars().all(|c| "sfnv".contains(c)) => {}
            Some(flag) if flag.starts_with('-') => return Err(format!("unknown flag '{flag}'")),
            _ => positional.push(a),
        }
    }
    if positional.len() != 2 {
        return Err("usage: mount.fuse.ferrofs IMAGE MOUNTPOINT [-o OPTIONS]".into());
    }
    if root {
        let given = |flag: &str| out.iter().filter_map(|a| a.to_str()).any(|a| a.split(',').any(|o| o == flag));
        let implied: Vec<&str> = [("nosuid", "suid"), ("nodev", "dev")]
            .into_iter()
            .filter(|(no, _)| !given(no))
            .map(|(_, yes)| yes)
            .collect();
        if !implied.is_empty() {
            out.extend(["-o".into(), implied.join(",").into()]);
        }
    }
    out.extend(positional);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_command_lines() {
        let argv = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-n", "-o", "rw,noatime"]), false).unwrap(),
            argv(&["ferrofs", "mount", "--daemon", "-o", "rw,noatime", "/i.img", "/mnt"])
        );
        assert_eq!(
            helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-o", "rw"]), true).unwrap(),
            argv(&["ferrofs", "mount", "--daemon", "-o", "rw", "-o", "suid,dev", "/i.img", "/mnt"])
        );
        assert_eq!(
            helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-o", "rw,nosuid"]), true).unwrap(),
            argv(&["ferrofs", "mount", "--daemon", "-o", "rw,nosuid", "-o", "dev", "/i.img", "/mnt"])
        );
        assert!(helper_argv(argv(&["mount.fuse.ferrofs", "/i.img"]), false).is_err());
        assert!(helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-x"]), false).unwrap_err().contains("-x"));
    }
}

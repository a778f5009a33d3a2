//! Generic `-o` mount options, as `mount.fuse3(8)` spells them.

use ferrofs::AtimeMode;
use fuser::MountOption;

/// The access time mode and `nodiratime` that options give, with the kernel's meaning
/// (mount(8)): relatime unless `noatime` or `strictatime`, a later option overriding an
/// earlier one; `atime`, `norelatime` and `nostrictatime` fall back to the default.
pub fn atime_options<'a>(options: impl IntoIterator<Item = &'a str>) -> (AtimeMode, bool) {
    let (mut mode, mut nodiratime) = (AtimeMode::default(), false);
    for o in options {
        match o {
            "noatime" => mode = AtimeMode::Never,
            "strictatime" => mode = AtimeMode::Strict,
            "relatime" => mode = AtimeMode::Relative,
            "atime" if mode == AtimeMode::Never => mode = AtimeMode::Relative,
            "nostrictatime" if mode == AtimeMode::Strict => mode = AtimeMode::Relative,
            "nodiratime" => nodiratime = true,
            "diratime" => nodiratime = false,
            _ => {}
        }
    }
    (mode, nodiratime)
}

/// Whether POSIX ACLs are honoured: `acl` (the default, as ext4's) unless `noacl`, the last
/// one given winning. Neither goes to the kernel, which knows neither.
pub fn acl_option<'a>(options: impl IntoIterator<Item = &'a str>) -> bool {
    options.into_iter().fold(true, |acl, o| match o {
        "acl" => true,
        "noacl" => false,
        _ => acl,
    })
}

/// One option (no commas) as fuser's [`MountOption`]. Names fuser knows become flags or
/// helper options; anything else is handed to the kernel's FUSE option string unchanged
/// (e.g. `max_read=131072`, `blksize=4096`).
pub fn parse_option(o: &str) -> MountOption {
    match o {
        "auto_unmount" => MountOption::AutoUnmount,
        "default_permissions" => MountOption::DefaultPermissions,
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "ro" => MountOption::RO,
        "rw" => MountOption::RW,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "dirsync" => MountOption::DirSync,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        // `subtype=` stays a kernel option: fuser's own mount(2) path leaves its Subtype to
        // fusermount and mounts plain `fuse`, while the kernel's FUSE takes `subtype=` itself
        // (the mount then shows as `fuse.NAME`), and so does fusermount3.
        _ => match o.split_once('=') {
            Some(("fsname", v)) => MountOption::FSName(v.to_string()),
            _ => MountOption::CUSTOM(o.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_custom() {
        assert_eq!(parse_option("noatime"), MountOption::NoAtime);
        assert_eq!(parse_option("fsname=img"), MountOption::FSName("img".into()));
        assert_eq!(parse_option("max_read=4096"), MountOption::CUSTOM("max_read=4096".into()));
        assert_eq!(parse_option("subtype=x"), MountOption::CUSTOM("subtype=x".into()));
    }

    #[test]
    fn acl_by_default() {
        assert!(acl_option([]));
        assert!(!acl_option(["rw", "noacl"]));
        assert!(acl_option(["noacl", "acl"]));
    }

    #[test]
    fn atime_modes() {
        assert_eq!(atime_options([]), (AtimeMode::Relative, false));
        assert_eq!(atime_options(["rw", "noatime"]), (AtimeMode::Never, false));
        assert_eq!(atime_options(["strictatime", "nodiratime"]), (AtimeMode::Strict, true));
        assert_eq!(atime_options(["noatime", "relatime"]), (AtimeMode::Relative, false));
        assert_eq!(atime_options(["noatime", "atime"]), (AtimeMode::Relative, false));
        assert_eq!(atime_options(["strictatime", "atime"]), (AtimeMode::Strict, false));
        assert_eq!(atime_options(["strictatime", "nostrictatime"]), (AtimeMode::Relative, false));
        assert_eq!(atime_options(["nodiratime", "diratime", "norelatime"]), (AtimeMode::Relative, false));
    }
}

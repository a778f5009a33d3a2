//! Making the kernel's FUSE mount and detaching it again: done here, not by fuser, so that a
//! daemon only ever detaches its own mount.
//!
//! fuser's `Session::new` mounts and, once the session has ended, unmounts *the mount point
//! path*. By then the user may have unmounted ours and mounted something else there (a tmpfs,
//! or a second ferrofs stacked on the same directory), and the daemon would detach that. So
//! the mount is made here (`mount(2)` as root, `fusermount3` otherwise, as libfuse does), its
//! `/dev/fuse` descriptor goes to `Session::from_fd` (a session that owns no mount), and the
//! mount is known by the device number the kernel gave its superblock (`st_dev` of its root,
//! unique while the connection lives). To detach it, the mount point is opened `O_PATH`, what
//! the path shows now is checked to be the root of a mount with that device, and exactly that
//! mount is detached through `/proc/self/fd/N`: the check and the unmount name the same mount,
//! with no second path lookup between them. Anything else at the path is left alone; when the
//! user has already unmounted ours, there is nothing to do.

use fuser::{MountOption, SessionACL};
use nix::mount::{MntFlags, MsFlags};
use std::ffi::CString;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const FUSERMOUNT: &str = "fusermount3";

/// The generic mount flags, as mount(8) spells them: (name, flag, whether the name sets it).
const VFS_FLAGS: [(&str, MsFlags, bool); 21] = [
    ("ro", MsFlags::MS_RDONLY, true),
    ("rw", MsFlags::MS_RDONLY, false),
    ("nosuid", MsFlags::MS_NOSUID, true),
    ("suid", MsFlags::MS_NOSUID, false),
    ("nodev", MsFlags::MS_NODEV, true),
    ("dev", MsFlags::MS_NODEV, false),
    ("noexec", MsFlags::MS_NOEXEC, true),
    ("exec", MsFlags::MS_NOEXEC, false),
    ("sync", MsFlags::MS_SYNCHRONOUS, true),
    ("async", MsFlags::MS_SYNCHRONOUS, false),
    ("dirsync", MsFlags::MS_DIRSYNC, true),
    ("noatime", MsFlags::MS_NOATIME, true),
    ("atime", MsFlags::MS_NOATIME, false),
    ("nodiratime", MsFlags::MS_NODIRATIME, true),
    ("diratime", MsFlags::MS_NODIRATIME, false),
    ("relatime", MsFlags::MS_RELATIME, true),
    ("norelatime", MsFlags::MS_RELATIME, false),
    ("strictatime", MsFlags::MS_STRICTATIME, true),
    ("nostrictatime", MsFlags::MS_STRICTATIME, false),
    ("lazytime", MsFlags::MS_LAZYTIME, true),
    ("nolazytime", MsFlags::MS_LAZYTIME, false),
];

/// Options the kernel takes in a FUSE mount's option string that a user may give: FUSE's own
/// (the others, `fd=`, `rootmode=`, `user_id=`, `group_id=`, are the mount's) and the security
/// modules' contexts.
const FUSE_OPTIONS: [&str; 8] =
    ["default_permissions", "allow_other", "max_read", "subtype", "context", "fscontext", "defcontext", "rootcontext"];

/// A mount's options as mount(2) takes them, and as fusermount3 does.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct KernelOptions {
    /// The source shown in /proc/mounts.
    source: String,
    flags: MsFlags,
    /// FUSE's own options (`default_permissions`, `max_read=`, `subtype=`, ...).
    fuse: Vec<String>,
    /// Every option as given, for fusermount3 (which parses them itself).
    all: Vec<String>,
}

impl KernelOptions {
    /// Sort `options` into flags and FUSE options. Unknown options are refused by name here,
    /// before anything is mounted. Without `suid` and `dev` the mount is `nosuid,nodev`.
    pub(crate) fn new(options: &[MountOption], acl: SessionACL) -> Result<KernelOptions, String> {
        let mut k = KernelOptions {
            source: "ferrofs".into(),
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            fuse: Vec::new(),
            all: Vec::new(),
        };
        for o in options {
            let name = match o {
                MountOption::FSName(name) => {
                    k.source.clone_from(name);
                    continue;
                }
                MountOption::Subtype(t) => format!("subtype={t}"),
                MountOption::CUSTOM(o) => o.clone(),
                MountOption::AutoUnmount => return Err("mount option 'auto_unmount' is not supported".into()),
                MountOption::DefaultPermissions => "default_permissions".into(),
                MountOption::Dev => "dev".into(),
                MountOption::NoDev => "nodev".into(),
                MountOption::Suid => "suid".into(),
                MountOption::NoSuid => "nosuid".into(),
                MountOption::RO => "ro".into(),
                MountOption::RW => "rw".into(),
                MountOption::Exec => "exec".into(),
                MountOption::NoExec => "noexec".into(),
                MountOption::Atime => "atime".into(),
                MountOption::NoAtime => "noatime".into(),
                MountOption::DirSync => "dirsync".into(),
                MountOption::Sync => "sync".into(),
                MountOption::Async => "async".into(),
            };
            k.add(name)?;
        }
        if acl != SessionACL::Owner {
            k.add("allow_other".into())?;
        }
        Ok(k)
    }

    fn add(&mut self, option: String) -> Result<(), String> {
        if let Some(&(_, flag, set)) = VFS_FLAGS.iter().find(|(n, ..)| *n == option) {
            self.flags.set(flag, set);
        } else {
            let key = option.split_once('=').map_or(option.as_str(), |(k, _)| k);
            if !FUSE_OPTIONS.contains(&key) {
                return Err(format!("unknown mount option '{option}'"));
            }
            if key == "max_read" && option.split_once('=').is_none_or(|(_, v)| v.parse::<u32>().is_err()) {
                return Err(format!("bad mount option '{option}': max_read takes a number of bytes"));
            }
            if !self.fuse.contains(&option) {
                self.fuse.push(option.clone());
            }
        }
        self.all.push(option);
        Ok(())
    }
}

/// Where a mount point fails mount(8)'s rules, if it does: it must exist and be a directory.
pub(crate) fn check_mountpoint(mountpoint: &Path) -> Result<(), String> {
    match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("mount point {} is not a directory", mountpoint.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("mount point {} does not exist", mountpoint.display()))
        }
        Err(e) => Err(format!("mount point {}: {e}", mountpoint.display())),
    }
}

/// What [`KernelMount::detach`] found at the mount point.
#[derive(Debug, PartialEq)]
pub(crate) enum Detach {
    /// Our mount was there and is detached now.
    Detached,
    /// Our mount is gone already (unmounted, or detached lazily): nothing to do.
    Gone,
    /// Our mount is still mounted but another one covers it: detaching would mean unmounting
    /// that one, which is not ours.
    Covered,
}

/// A FUSE mount made by [`KernelMount::mount`], known by its superblock's device number.
#[derive(Debug)]
pub(crate) struct KernelMount {
    mountpoint: PathBuf,
    dev: u64,
}

impl KernelMount {
    /// Mount FUSE on `mountpoint`; returns the connection's `/dev/fuse` descriptor, on which
    /// the kernel has already queued its INIT request.
    pub(crate) fn mount(mountpoint: &Path, opts: &KernelOptions) -> io::Result<(OwnedFd, KernelMount)> {
        let mountpoint = mountpoint.canonicalize()?;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let fuse = match root {
            true => match mount_syscall(&mountpoint, opts) {
                // Root without CAP_SYS_ADMIN in this namespace: fusermount3 may still do it.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => mount_fusermount(&mountpoint, opts)?,
                r => r?,
            },
            false => mount_fusermount(&mountpoint, opts)?,
        };
        // Neither the walk to the new root nor a stat that does not sync sends a request, so
        // this cannot wait for the INIT that nobody answers yet.
        let (_, dev, mount_root) = look_at(&mountpoint)?;
        let mount = KernelMount { mountpoint, dev };
        if !mount_root {
            return Err(io::Error::other(format!("{} is not the root of the new mount", mount.mountpoint.display())));
        }
        Ok((fuse, mount))
    }

    /// The canonical path it was mounted on.
    pub(crate) fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Detach this mount, lazily (the kernel ends the connection once no file is open on it);
    /// leave whatever else the mount point shows alone.
    pub(crate) fn detach(&self) -> io::Result<Detach> {
        let (path, dev, mount_root) = match look_at(&self.mountpoint) {
            Ok(found) => found,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(self.gone_or_covered()),
            Err(e) => return Err(e),
        };
        if dev != self.dev || !mount_root {
            return Ok(self.gone_or_covered());
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let by_fd = format!("/proc/self/fd/{}", path.as_raw_fd());
            match nix::mount::umount2(by_fd.as_str(), MntFlags::MNT_DETACH) {
                Ok(()) => return Ok(Detach::Detached),
                Err(nix::errno::Errno::EPERM) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // fusermount3 takes only a path: between the check above and its own lookup another
        // mount could be stacked here. It refuses to unmount what is not a FUSE mount of ours,
        // which narrows this to our own user's mounts.
        drop(path);
        let out =
            Command::new(FUSERMOUNT).args(["-u", "-z", "--"]).arg(&self.mountpoint).stdin(Stdio::null()).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{FUSERMOUNT} -u -z {}: {}",
                self.mountpoint.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Detach::Detached)
    }

    /// Our device still in this namespace's mount table (under another mount) or not.
    fn gone_or_covered(&self) -> Detach {
        let (major, minor) = (libc::major(self.dev), libc::minor(self.dev));
        let ours = format!(" {major}:{minor} ");
        let listed =
            std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| info.lines().any(|l| l.contains(&ours)));
        if listed {
            Detach::Covered
        } else {
            Detach::Gone
        }
    }
}

/// Remount the mount on `mountpoint` read-only or read-write (`MS_REMOUNT`, root only). The
/// mount's other flags are given again as it has them now, since a remount sets them all.
pub(crate) fn remount_kernel(mountpoint: &Path, read_only: bool) -> io::Result<()> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let now = statvfs(mountpoint)?.flags();
    let kept = [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_SYNCHRONOUS, MsFlags::MS_SYNCHRONOUS),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ];
    let mut flags = MsFlags::MS_REMOUNT;
    for (has, flag) in kept {
        flags.set(flag, now.contains(has));
    }
    flags.set(MsFlags::MS_RDONLY, read_only);
    nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>)?;
    Ok(())
}

/// How many mounts `/proc/self/mountinfo` lists on `mountpoint` (stacked ones count each).
pub(crate) fn mounts_on(mountpoint: &Path) -> io::Result<usize> {
    let canon = mountpoint.canonicalize()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == canon)).count())
}

/// `mount(2)` as root: our own `/dev/fuse` descriptor, the mount point's file type as the
/// root's, our ids as the mount's owner.
fn mount_syscall(mountpoint: &Path, opts: &KernelOptions) -> io::Result<OwnedFd> {
    let fuse: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?.into();
    let rootmode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!("fd={},rootmode={rootmode:o},user_id={uid},group_id={gid}", fuse.as_raw_fd());
    for o in &opts.fuse {
        data.push(',');
        data.push_str(o);
    }
    nix::mount::mount(Some(opts.source.as_str()), mountpoint, Some("fuse"), opts.flags, Some(data.as_str()))?;
    Ok(fuse)
}

/// Mount through the setuid helper: it mounts and passes the `/dev/fuse` descriptor back over
/// the socket named by `_FUSE_COMMFD`, as libfuse's `fuse_mount_fusermount` does.
fn mount_fusermount(mountpoint: &Path, opts: &KernelOptions) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_fd = theirs.as_raw_fd();
    // fusermount3 splits options at commas and takes a backslash as an escape.
    let fsname = format!("fsname={}", opts.source.replace('\\', "\\\\").replace(',', "\\,"));
    let options = std::iter::once(fsname).chain(opts.all.iter().cloned()).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-o").arg(options).arg("--").arg(mountpoint).env("_FUSE_COMMFD", theirs_fd.to_string());
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: the closure only calls fcntl on a descriptor it names by number, which is
    // async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(move || match libc::fcntl(theirs_fd, libc::F_SETFD, 0) {
            -1 => Err(io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    let received = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    match received {
        Ok(fd) => Ok(fd),
        Err(_) if !out.status.success() => {
            Err(io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()))
        }
        Err(e) => Err(e),
    }
}

/// The one descriptor fusermount3 sends (`SCM_RIGHTS`).
fn receive_fd(socket: &UnixStream) -> io::Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(libc::c_int);
    let msg = loop {
        match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r?,
        }
    };
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel just installed this descriptor in our table for us; nothing
                // else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{FUSERMOUNT} sent no /dev/fuse descriptor")))
}

/// Open what `path` shows now (`O_PATH`, not following a final symlink) and report its device
/// and whether it is the root of a mount, without asking a FUSE daemon anything (a stat that
/// does not sync answers from the kernel's cache).
fn look_at(path: &Path) -> io::Result<(OwnedFd, u64, bool)> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: statx is plain old data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: `fd` is open, the empty path is NUL-terminated and `stx` is writable for the call.
    if unsafe { libc::statx(fd.as_fd().as_raw_fd(), c"".as_ptr(), flags, libc::STATX_BASIC_STATS, &mut stx) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    // Kernels before 5.8 do not say; the device alone then names the mount.
    let root_bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    let mount_root = stx.stx_attributes_mask & root_bit == 0 || stx.stx_attributes & root_bit != 0;
    Ok((fd, dev, mount_root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Result<KernelOptions, String> {
        let options: Vec<MountOption> = list.iter().map(|o| crate::parse_option(o)).collect();
        KernelOptions::new(&options, SessionACL::Owner)
    }

    #[test]
    fn flags_default_to_nosuid_nodev_and_the_last_word_wins() {
        assert_eq!(opts(&[]).unwrap().flags, MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
        assert_eq!(opts(&["suid", "dev"]).unwrap().flags, MsFlags::empty());
        assert_eq!(
            opts(&["ro", "noatime", "rw"]).unwrap().flags,
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME
        );
        let k = opts(&["fsname=/i.img", "subtype=ferrofs", "max_read=131072", "default_permissions"]).unwrap();
        assert_eq!(k.source, "/i.img");
        assert_eq!(k.fuse, ["subtype=ferrofs", "max_read=131072", "default_permissions"]);
    }

    /// The path a user's mount takes, run as root: fusermount3 mounts and sends the
    /// descriptor back; the mount is then known and detached by its device.
    #[test]
    fn fusermount3_sends_the_descriptor_back() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root || std::fs::File::open("/dev/fuse").is_err() || Command::new(FUSERMOUNT).arg("-V").output().is_err() {
            return eprintln!("SKIPPED fusermount3_sends_the_descriptor_back: needs root, /dev/fuse and {FUSERMOUNT}");
        }
        let dir = std::env::temp_dir().join(format!("ferrofs-fusermount-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut k = opts(&["subtype=ferrofs", "noatime"]).unwrap();
        k.source = "/odd,name\\.img".into();
        let fuse = mount_fusermount(&dir, &k).unwrap();
        let (_, dev, mount_root) = look_at(&dir).unwrap();
        assert!(mount_root && fuse.as_raw_fd() > 2);
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = info
            .lines()
            .find(|l| l.contains(&format!(" {}:{} ", libc::major(dev), libc::minor(dev))))
            .unwrap()
            .to_string();
        let mount = KernelMount { mountpoint: dir.canonicalize().unwrap(), dev };
        assert_eq!(mount.detach().unwrap(), Detach::Detached);
        drop(fuse);
        assert_eq!(mount.detach().unwrap(), Detach::Gone);
        std::fs::remove_dir(&dir).unwrap();
        assert!(line.contains(" - fuse.ferrofs /odd,name") && line.contains("noatime"), "{line}");
    }

    #[test]
    fn unknown_options_are_named() {
        assert_eq!(opts(&["noatime", "bogus"]).unwrap_err(), "unknown mount option 'bogus'");
        assert_eq!(opts(&["rootmode=40000"]).unwrap_err(), "unknown mount option 'rootmode=40000'");
        assert!(opts(&["max_read=lots"]).unwrap_err().contains("max_read=lots"));
    }
}

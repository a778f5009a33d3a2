//! What every daemon process does, the mount's and the shared one's: its allocator setting,
//! the pipe it reports readiness through, a session of its own and no terminal.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// glibc gives threads that meet in malloc arenas of their own (up to 8 per CPU), and memory
/// freed into one arena is not reused by threads of another. A daemon's FUSE workers grow with
/// its clients (`ferrofs_fuse::MountConfig::threads`), so the daemon keeps one arena per two
/// CPUs. On 2 CPUs, in a 400,000-file, 8-client fs_mark under the default 256 MiB cache
/// budget, its peak RSS was 268-272 MiB with glibc's default, 250-262 with 2 arenas per CPU and
/// 235-249 with one arena, which created files as fast but removed them at 0.88-0.96x minifuse
/// against 0.96-0.98x (DESIGN, "A daemon's budget bounds its process"). Set before any thread
/// starts; a forked daemon inherits it. `ferrofs bench unmount`, which measures the shared
/// daemon's case (several file systems in one process), runs under it too.
pub fn cap_malloc_arenas() {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    // SAFETY: mallopt only sets a tunable of the allocator; it reads and writes no memory of
    // ours.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, cpus.div_ceil(2).min(i32::MAX as usize) as i32) };
}

/// What every daemon does first after the fork: a session of its own (no controlling
/// terminal), and SIGPIPE ignored — `main` restores its default for the command-line tools,
/// but a control-socket client that hangs up before reading its answer must not kill the
/// daemon and every mount it serves.
pub fn become_daemon() {
    // SAFETY: setsid has no preconditions (in a freshly forked child it cannot fail with
    // EPERM), and ignoring a signal involves no handler code.
    unsafe {
        libc::setsid();
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// A pipe whose ends close on exec: (read end, write end).
pub fn pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (std::fs::File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Point stdin, stdout and stderr at /dev/null: the daemon outlives the terminal.
pub fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: dup2 onto a standard descriptor; `null` stays open for the call.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

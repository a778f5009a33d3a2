//! `ferrofs`: make, check, inspect, mount and benchmark ferrofs images.

mod bench;
mod fsck;
mod gc;
mod geometry;
mod grow;
mod image;
mod info;
mod lockstat;
mod manual;
mod mkfs;
mod mount;
mod mount_config;
mod mount_remote;
mod publish;
mod shared;
mod signature;
mod trim;
mod tune;

// The modules the benchmarks share live in the library; imported here, the commands name
// them as before (`crate::failure`, `crate::units`, ...).
use ferrofs_cli::{daemon, failure, logging, progress, units};

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "ferrofs", version, about = "ferrofs: a crash-safe journaling POSIX file system", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Make a new file system on an image file or block device.
    Mkfs(mkfs::MkfsArgs),
    /// Check an image for consistency and optionally repair it.
    ///
    /// Exit status: 0 clean, 1 errors found and fixed, 4 errors left uncorrected,
    /// 8 the check could not run.
    Fsck(fsck::FsckArgs),
    /// Show the superblock, free space and per-allocation-group layout of an image.
    Info(info::InfoArgs),
    /// Grow an unmounted file system onto a larger image file or block device.
    Grow(grow::GrowArgs),
    /// Change the label or UUID of an unmounted image.
    Tune(tune::TuneArgs),
    /// Mount an image through FUSE (foreground unless --daemon or --shared).
    Mount(mount_config::MountArgs),
    /// List ferrofs mounts: what the shared daemon (`ferrofs mount --shared`) serves, then
    /// mounts with a daemon of their own, each with its transport.
    Mounts(shared::MountsArgs),
    /// Give a file system's free space back to the host (like fstrim): punch holes in an
    /// unmounted image, or ask the daemon serving a mount point to.
    Trim(trim::TrimArgs),
    /// Publish an image to S3-compatible object storage as its next generation.
    Publish(publish::PublishArgs),
    /// Delete what the kept generations of a published image do not need.
    Gc(gc::GcArgs),
    /// Show the lock statistics of a running mount.
    Lockstat(lockstat::LockstatArgs),
    /// Run the benchmarks: `ferrofs-bench`, a program of its own (`ferrofs bench --help`
    /// lists its workloads and options).
    #[command(disable_help_flag = true)]
    Bench(bench::BenchArgs),
    /// Write the man pages (ferrofs.8, ferrofs-SUBCOMMAND.8) into a directory.
    #[command(hide = true)]
    Manpages(manual::ManpagesArgs),
    /// Print the completion script for a shell (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions(manual::CompletionsArgs),
}

fn main() -> ExitCode {
    failure::install_panic_report();
    failure::die_quietly_on_closed_pipe();
    let cli = match mount_helper_argv() {
        Some(Ok(argv)) => Cli::parse_from(argv),
        Some(Err(why)) => {
            eprintln!("ferrofs: {why}");
            return ExitCode::from(1);
        }
        None => Cli::parse(),
    };
    // A mount sets up its own logger: it knows its image, and where a daemon's lines go.
    if !matches!(cli.command, Command::Mount(_)) {
        logging::init(None, None);
    }
    let (result, failure_code) = match &cli.command {
        Command::Mkfs(a) => (mkfs::run(a).map(|()| 0), 1),
        Command::Fsck(a) => (fsck::run(a), fsck::EXIT_OPERATIONAL),
        Command::Info(a) => (info::run(a).map(|()| 0), 1),
        Command::Grow(a) => (grow::run(a).map(|()| 0), 1),
        Command::Tune(a) => (tune::run(a).map(|()| 0), 1),
        Command::Lockstat(a) => (lockstat::run(a).map(|()| 0), 1),
        Command::Trim(a) => (trim::run(a).map(|()| 0), 1),
        Command::Publish(a) => (publish::run(a).map(|()| 0), 1),
        Command::Gc(a) => (gc::run(a).map(|()| 0), 1),
        Command::Mount(a) => (mount::run(a).map(|()| 0), 1),
        Command::Mounts(a) => (shared::list(a).map(|()| 0), 1),
        Command::Bench(a) => (bench::run(a).map(|()| 0), 1),
        Command::Manpages(a) => (manual::manpages(a).map(|()| 0), 1),
        Command::Completions(a) => (manual::completions(a).map(|()| 0), 1),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("ferrofs: {f}");
            ExitCode::from(failure_code)
        }
    }
}

/// Invoked as a mount helper (`mount.fuse.ferrofs`), the command line mount(8) gave us as
/// `ferrofs mount --daemon ...`.
fn mount_helper_argv() -> Option<Result<Vec<std::ffi::OsString>, String>> {
    let argv: Vec<_> = std::env::args_os().collect();
    let name = std::path::Path::new(argv.first()?).file_name()?.to_str()?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    mount::HELPER_NAMES.contains(&name).then(|| mount::helper_argv(argv, root))
}

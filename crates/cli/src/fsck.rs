//! `ferrofs fsck`: check an image offline and optionally repair it. Exit codes follow
//! e2fsck: 0 clean, 1 errors fixed, 4 errors left uncorrected, 8 operational error.

use crate::failure::{CliResult, Context};
use crate::image;
use crate::progress;
use crate::units::grouped;
use clap::Args;
use ferrofs::fsck::{FsckOptions, FsckReport};
use std::cell::RefCell;
use std::path::PathBuf;

/// The exit status of a check that could not run (e2fsck's "operational error").
pub const EXIT_OPERATIONAL: u8 = ferrofs::fsck::EXIT_OPERATIONAL as u8;

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Image file or block device to check. It must not be mounted.
    pub image: PathBuf,
    /// Check only: open the image read-only and change nothing (the default).
    #[arg(short = 'n', conflicts_with = "yes")]
    pub no: bool,
    /// Repair every error found without asking (opens the image read-write).
    #[arg(short = 'y')]
    pub yes: bool,
    /// Print the check's statistics as well as its findings.
    #[arg(short = 'v')]
    pub verbose: bool,
}

/// Runs the check; the result is the process exit code.
pub fn run(args: &FsckArgs) -> CliResult<u8> {
    let repair = args.yes;
    let dev = image::open(&args.image, !repair)?;
    image::require_ferrofs(&args.image)?;
    let bar = progress::counter(true, 0, "checking");
    let shown_phase = RefCell::new(String::new());
    let show = |phase: &str, done: u64, total: u64| {
        if *shown_phase.borrow() != phase {
            phase.clone_into(&mut shown_phase.borrow_mut());
            bar.set_message(phase.to_string());
        }
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = ferrofs::fsck::check(&*dev, &FsckOptions { repair }, &show)
        .context(|| format!("fsck {}", args.image.display()))?;
    bar.finish_and_clear();
    print_report(&args.image.display().to_string(), &report, args.verbose, repair);
    Ok(u8::try_from(report.exit_code()).unwrap_or(EXIT_OPERATIONAL))
}

fn print_report(image: &str, r: &FsckReport, verbose: bool, repair: bool) {
    for m in &r.messages {
        println!("{m}");
    }
    if verbose {
        println!("  {:<22} {}", "log records replayed", grouped(r.log_records_replayed));
        println!("  {:<22} {}", "inodes in use", grouped(r.inodes));
        println!("  {:<22} {}", "directories", grouped(r.dirs));
        println!("  {:<22} {}", "blocks in use", grouped(r.blocks_used));
    }
    println!("{image}: {}", verdict(r, repair));
}

fn verdict(r: &FsckReport, repair: bool) -> String {
    let left = r.errors_found.saturating_sub(r.errors_fixed);
    let hint = if repair { "" } else { " (run with -y to repair)" };
    match (r.errors_found, left) {
        (0, _) => format!("clean, {} inodes, {} blocks", grouped(r.inodes), grouped(r.blocks_used)),
        (found, 0) => format!("{} found, all fixed", errors(found)),
        (found, left) => format!("{} found, {left} NOT fixed{hint}", errors(found)),
    }
}

fn errors(n: u64) -> String {
    format!("{n} error{}", if n == 1 { "" } else { "s" })
}

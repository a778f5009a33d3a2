//! `ferrofs lockstat MOUNTPOINT`: the lock statistics of a running mount, read through its
//! control socket (see ferrofs_fuse's control module).

use crate::failure::{CliResult, Context};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct LockstatArgs {
    /// The mount point of a running `ferrofs mount`.
    pub mountpoint: PathBuf,
    /// Print every class's counters as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Rows of the table: the classes with the most wait time.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Zero the counters afterwards (to measure the next workload alone).
    #[arg(long)]
    pub reset: bool,
    /// Switch hold-time measurement on or off in the daemon (wait times are always measured).
    #[arg(long, value_parser = ["on", "off"])]
    pub timing: Option<String>,
}

pub fn run(args: &LockstatArgs) -> CliResult<()> {
    let what = || format!("lockstat {}", args.mountpoint.display());
    let ask = |command: &str| ferrofs_fuse::control_request(&args.mountpoint, command).context(what);
    if let Some(on) = &args.timing {
        ask(&format!("timing {on}"))?;
    }
    print!("{}", ask(&if args.json { "json".to_string() } else { format!("table {}", args.top) })?);
    if args.reset {
        ask("reset")?;
    }
    Ok(())
}

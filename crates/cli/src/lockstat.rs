//! `ferrofs lockstat MOUNTPOINT`: the lock statistics (or, with `--journal`, the journal
//! counters, with `--memory` its memory against its cache budget) of a running mount, read
//! through its control socket (see ferrofs_fuse's control module).

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
    /// Print this mount's journal counters instead (commits, checkpoints, bytes logged, items
    /// written home, fsyncs that found their change durable, ...), its cache budget's
    /// (reclaim, stalls, transactions throttled to write home) and its transport (io_uring or
    /// /dev/fuse; `transport_uring` is 1 on the rings), as JSON with --json.
    #[arg(long)]
    pub journal: bool,
    /// Print the daemon's memory instead: its cache budget's limit and estimated use beside
    /// the heap in use (and of it, mapped on its own) and held free, RSS and peak RSS, in
    /// bytes (as JSON with --json).
    #[arg(long, conflicts_with = "journal")]
    pub memory: bool,
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
    if args.journal || args.memory {
        let answer = ask(if args.memory { "memory" } else { "journal" })?;
        if args.json {
            print!("{answer}");
        } else {
            // The journal's `transport_uring` counter, named: which transport serves the mount.
            let transport = if args.journal { Some(ask("transport")?) } else { None };
            print_counters(&answer, transport.as_deref().map(str::trim)).context(what)?;
        }
    } else {
        print!("{}", ask(&if args.json { "json".to_string() } else { format!("table {}", args.top) })?);
    }
    if args.reset {
        ask("reset")?;
    }
    Ok(())
}

/// Named counters (a JSON object of numbers), one per line, grouped by thousands, after the
/// transport's line if it is given.
fn print_counters(json: &str, transport: Option<&str>) -> std::io::Result<()> {
    let counters: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(json).map_err(std::io::Error::other)?;
    let width = counters.keys().map(String::len).chain(transport.map(|_| "transport".len())).max().unwrap_or(0);
    if let Some(transport) = transport {
        println!("{:<width$}  {transport}", "transport");
    }
    for (name, value) in &counters {
        let n =
            value.as_u64().ok_or_else(|| std::io::Error::other(format!("counter {name} is not a number: {value}")))?;
        println!("{name:<width$}  {}", crate::units::grouped(n));
    }
    Ok(())
}

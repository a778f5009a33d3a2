//! `ferrofs bench ...`: runs `ferrofs-bench ...` in this process's place. The benchmarks are a
//! program of their own (crates/bench), so that the `ferrofs` users install links neither
//! their plotting nor their peers; this keeps the command users know.

use crate::failure::{CliResult, Failure};
use clap::Args;
use ferrofs_cli::programs::FERROFS_BENCH;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The workload and options, passed to `ferrofs-bench` as they are.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// Replace this process with `ferrofs-bench` (its exit status, output and signals are then
/// the command's); returns only if it cannot be run.
pub fn run(args: &BenchArgs) -> CliResult<()> {
    let program = FERROFS_BENCH.find().map_err(|why| Failure::new("bench", why))?;
    let error = std::process::Command::new(&program).args(&args.args).exec();
    Err(Failure::new(format!("bench: run {}", program.display()), error))
}

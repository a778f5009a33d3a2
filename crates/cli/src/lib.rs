//! What the `ferrofs` command line shares with the benchmarks (`ferrofs-bench`, crates/bench):
//! how a failure reads, units, progress bars, the logger, what a daemon process does first,
//! and how one ferrofs program finds another. The commands themselves live in the binary.

pub mod daemon;
pub mod failure;
pub mod logging;
pub mod programs;
pub mod progress;
pub mod units;

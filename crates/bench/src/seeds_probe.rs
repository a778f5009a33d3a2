//! What `bench seeds` reads from outside itself: the machine's load and memory for the
//! report, and the closing lines of dbench's and mdtest's output.

use super::seeds_results::Machine;
use super::shell;
use crate::failure::CliResult;
use std::process::Command;

pub(super) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

impl Machine {
    /// This machine now; `loadavg_start` was read when the run began.
    pub(super) fn now(loadavg_start: String) -> CliResult<Machine> {
        Ok(Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: mem_total(),
            kernel: shell::run(Command::new("uname").arg("-srm"))?.trim().to_string(),
            loadavg_start,
            loadavg_end: loadavg(),
        })
    }
}

fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

#[derive(Debug, PartialEq)]
pub(super) struct Dbench {
    pub(super) mb_per_s: f64,
    pub(super) max_latency_ms: f64,
    /// Flush (fsync) average and maximum latency, ms.
    pub(super) flush_ms: Option<(f64, f64)>,
    /// Operations done, all kinds: the sum of the table's Count column.
    pub(super) operations: u64,
}

/// dbench's closing lines: ` Flush  687  5.446  27.214` and
/// `Throughput 126.232 MB/sec  2 clients  2 procs  max_latency=29.404 ms`.
pub(super) fn parse_dbench(out: &str) -> Option<Dbench> {
    let tp = out.lines().rev().find(|l| l.starts_with("Throughput "))?;
    let f: Vec<&str> = tp.split_whitespace().collect();
    let mb_per_s = f.get(1)?.parse().ok()?;
    let max_latency_ms = f.iter().find_map(|w| w.strip_prefix("max_latency="))?.parse().ok()?;
    let flush_ms = out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 4 && f[0] == "Flush" {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        } else {
            None
        }
    });
    let operations = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 4 && f[2].parse::<f64>().is_ok() {
                f[1].parse::<u64>().ok()
            } else {
                None
            }
        })
        .sum();
    Some(Dbench { mb_per_s, max_latency_ms, flush_ms, operations })
}

/// mdtest's SUMMARY lines: `   File creation  :  1234.5  1200.0  1220.1  3.2` -> (op, max).
pub(super) fn parse_mdtest(out: &str) -> Vec<(String, f64)> {
    out.lines()
        .filter_map(|l| {
            let (op, rest) = l.split_once(':')?;
            let op = op.trim();
            if !op.starts_with("File ") {
                return None;
            }
            let v: f64 = rest.split_whitespace().next()?.parse().ok()?;
            Some((op.to_string(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dbench_output() {
        let out = "\n Operation      Count    AvgLat    MaxLat\n ----------------------------------------\n NTCreateX       9781     0.042    20.075\n Flush            687     5.446    27.214\n\nThroughput 126.232 MB/sec  2 clients  2 procs  max_latency=29.404 ms\n";
        assert_eq!(
            parse_dbench(out),
            Some(Dbench {
                mb_per_s: 126.232,
                max_latency_ms: 29.404,
                flush_ms: Some((5.446, 27.214)),
                operations: 10_468
            })
        );
        assert_eq!(parse_dbench("nothing"), None);
    }

    #[test]
    fn parses_mdtest_summary() {
        let out = "   Operation  Max  Min  Mean  Std Dev\n   File creation     :      12345.678      12345.678      12345.678          0.000\n   File removal      :       2000.000       2000.000       2000.000          0.000\n   Tree creation     :        10.000 \n";
        assert_eq!(
            parse_mdtest(out),
            vec![("File creation".to_string(), 12345.678), ("File removal".to_string(), 2000.0)]
        );
    }
}

//! The report of `bench workloads`: Markdown tables (a row per workload and figure, a column
//! per target, each cell median [min-max] over the repetitions) and the bar charts.

use super::plot::Bars;
use super::seeds_report::skipped_list;
use super::seeds_results::stats;
use super::workloads::Results;
use crate::units::{grouped, human_bytes};
use std::fmt::Write;

/// Charts: (file, metric drawn, title, axis label).
const CHARTS: [(&str, &str, &str, &str); 3] = [
    ("workloads-time.png", "seconds", "Real workloads: wall time, lower is better", "seconds (log scale)"),
    ("workloads-dbench.png", "mb_per_s", "dbench throughput, higher is better", "MB/s (log scale)"),
    ("workloads-latency.png", "p99_us", "4 KiB write latency p99, lower is better", "microseconds (log scale)"),
];

/// How a metric is shown: its column label.
fn label(metric: &str) -> &str {
    match metric {
        "seconds" => "s",
        "mb_per_s" => "MB/s",
        "max_latency_ms" => "max latency ms",
        "p50_us" => "p50 us",
        "p99_us" => "p99 us",
        "daemon_cpu_us_per_op" => "daemon CPU us/op",
        "daemon_peak_rss_mib" => "daemon peak RSS MiB",
        other => other,
    }
}

fn number(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// A workload's row name: dbench's carries its client count.
fn workload_name(w: &str, x: u64) -> String {
    match x {
        0 => w.to_string(),
        x => format!("{w} {x}"),
    }
}

/// (workload, x, metric) of every row, in the order first measured.
fn rows(r: &Results, daemon: bool) -> Vec<(&'static str, u64, &'static str)> {
    let mut out: Vec<(&'static str, u64, &'static str)> = Vec::new();
    for s in &r.samples {
        let key = (s.workload, s.x, s.metric);
        if s.metric.starts_with("daemon_") == daemon && !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

fn table(o: &mut String, r: &Results, daemon: bool) {
    let rows = rows(r, daemon);
    let cols: Vec<&str> = r
        .targets
        .iter()
        .map(|t| t.0)
        .filter(|t| r.samples.iter().any(|s| s.target == *t && s.metric.starts_with("daemon_") == daemon))
        .collect();
    if rows.is_empty() || cols.is_empty() {
        let _ = writeln!(o, "(nothing measured)\n");
        return;
    }
    let _ = writeln!(o, "| workload | figure | {} |", cols.join(" | "));
    let _ = writeln!(o, "|---|---|{}", "---:|".repeat(cols.len()));
    for (w, x, metric) in rows {
        let cells: Vec<String> = cols
            .iter()
            .map(|t| match stats(&r.samples, w, t, x, metric) {
                Some((med, lo, hi)) => format!("{} [{}-{}]", number(med), number(lo), number(hi)),
                None => "-".into(),
            })
            .collect();
        let _ = writeln!(o, "| {} | {} | {} |", workload_name(w, x), label(metric), cells.join(" | "));
    }
    let _ = writeln!(o);
}

pub fn markdown(r: &Results) -> String {
    let mut o = String::new();
    let m = &r.machine;
    let _ = writeln!(o, "## Real workloads through the mount (`ferrofs bench workloads`)\n");
    let _ = writeln!(o, "`{}`: {} repetition(s); within each, every target in turn, mounted afresh for each workload group. Cells are median [min-max].\n", r.command, r.runs);
    let _ = writeln!(
        o,
        "Machine: {} cores, {} memory, {}; load average {} at the start, {} at the end. Images in {}. The run took {:.1} min.\n",
        m.cores,
        human_bytes(m.memory_bytes),
        m.kernel,
        m.loadavg_start,
        m.loadavg_end,
        r.images,
        r.wall_seconds / 60.0
    );
    let t = &r.tree;
    let _ = write!(
        o,
        "Tree: {} ({} files, {} directories, {} symlinks, {} of data). `tar -xf` of its tarball then `sync -f` (syncfs) on the target; `cp -a` of it to a fresh tmpfs after `echo 3 > /proc/sys/vm/drop_caches`; `rm -rf`.",
        r.tree_source,
        grouped(t.files),
        grouped(t.dirs),
        grouped(t.symlinks),
        human_bytes(t.bytes)
    );
    if let Some(repo) = &r.repo {
        let _ = write!(
            o,
            " git: `git clone --no-hardlinks` of {} ({} tracked files, {} commits), then `git status` and `git log -p > /dev/null` in the clone.",
            repo.path.display(),
            grouped(repo.tracked_files),
            grouped(repo.commits)
        );
    }
    let _ = writeln!(
        o,
        " dbench: `dbench -t {}` (MB/s, max latency). Write latency: {} 4 KiB `pwrite`s, each timed (with an fdatasync each in the `+ fdatasync` rows), appending to a new file or overwriting a file written and synced beforehand.\n",
        r.dbench_seconds,
        grouped(r.writes)
    );
    let _ = writeln!(o, "| target | what |\n|---|---|");
    for (name, what) in &r.targets {
        let _ = writeln!(o, "| {name} | {what} |");
    }
    let _ = writeln!(o);
    table(&mut o, r, false);
    let _ = writeln!(
        o,
        "FUSE servers: CPU time (utime + stime from /proc, in clock ticks) of the daemon over each workload per operation (tree: entries; git clone and status: tracked files; git log: commits; dbench: its operations; latency: writes), and its peak RSS (VmHWM) after the workload, since its mount.\n"
    );
    table(&mut o, r, true);
    for (file, metric, _, _) in CHARTS {
        if r.samples.iter().any(|s| s.metric == metric) {
            let _ = writeln!(o, "![{metric}](results/{file})\n");
        }
    }
    skipped_list(&mut o, "Skipped:", &r.skipped);
    o
}

/// The bar charts of the figures measured: one per entry of [`CHARTS`] with any values.
pub fn charts(r: &Results) -> Vec<(&'static str, Bars)> {
    let mut out = Vec::new();
    for (file, metric, title, y_label) in CHARTS {
        let groups: Vec<(&str, u64)> =
            rows(r, false).into_iter().filter(|row| row.2 == metric).map(|(w, x, _)| (w, x)).collect();
        let series: Vec<(String, Vec<Option<f64>>)> = r
            .targets
            .iter()
            .map(|(t, _)| {
                (
                    t.to_string(),
                    groups
                        .iter()
                        .map(|&(w, x)| stats(&r.samples, w, t, x, metric).map(|s| s.0).filter(|&v| v > 0.0))
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, v)| v.iter().any(Option::is_some))
            .collect();
        if series.is_empty() {
            continue;
        }
        out.push((
            file,
            Bars {
                title: title.into(),
                y_label: y_label.into(),
                groups: groups.iter().map(|&(w, x)| workload_name(w, x)).collect(),
                series,
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeds_results::{Machine, Sample, Skipped};
    use crate::workloads::Results;
    use crate::workloads_tree::Census;

    fn fake() -> Results {
        let mut samples = Vec::new();
        for (rep, scale) in [1.0, 3.0, 2.0].into_iter().enumerate() {
            for (target, base) in [("ext4", 1.0), ("ferrofs", 5.0)] {
                let mut push = |workload, x, metric, value| {
                    samples.push(Sample { workload, target, rep, x, metric, value });
                };
                push("tar -xf + sync", 0, "seconds", base * scale);
                push("dbench", 8, "mb_per_s", 100.0 / base * scale);
                push("append 4 KiB", 0, "p99_us", 10.0 * base * scale);
                if target == "ferrofs" {
                    push("tar -xf + sync", 0, "daemon_peak_rss_mib", 40.0 * scale);
                }
            }
        }
        Results {
            command: "ferrofs bench workloads".into(),
            machine: Machine {
                cores: 2,
                memory_bytes: 1 << 30,
                kernel: "Linux".into(),
                loadavg_start: "1".into(),
                loadavg_end: "2".into(),
            },
            wall_seconds: 60.0,
            runs: 3,
            images: "/dev/shm".into(),
            tree_source: "/usr/share".into(),
            tree: Census { files: 10, dirs: 2, symlinks: 1, bytes: 4096 },
            repo: None,
            dbench_seconds: 6,
            writes: 1000,
            targets: vec![("ext4", "kernel ext4".into()), ("ferrofs", "ferrofs".into()), ("xfs", "kernel XFS".into())],
            skipped: vec![Skipped { workload: "git", target: "all".into(), reason: "git not installed".into() }],
            samples,
        }
    }

    #[test]
    fn tables_give_median_and_range_per_target() {
        let md = markdown(&fake());
        assert!(md.contains("| workload | figure | ext4 | ferrofs |\n"), "{md}");
        assert!(md.contains("| tar -xf + sync | s | 2.00 [1.00-3.00] | 10.0 [5.00-15.0] |"), "{md}");
        assert!(md.contains("| dbench 8 | MB/s | 200 [100-300] | 40.0 [20.0-60.0] |"), "{md}");
        // Daemon figures in a table of their own, with the FUSE servers' columns only.
        assert!(md.contains("| workload | figure | ferrofs |\n|---|---|---:|\n| tar -xf + sync | daemon peak RSS MiB | 80.0 [40.0-120] |"), "{md}");
        assert!(md.contains("- git / all: git not installed"), "{md}");
        assert!(!md.contains("| ferrofs | xfs |"), "a target without figures has no column: {md}");
    }

    #[test]
    fn charts_have_a_bar_per_target_and_group() {
        let charts = charts(&fake());
        let files: Vec<&str> = charts.iter().map(|c| c.0).collect();
        assert_eq!(files, ["workloads-time.png", "workloads-dbench.png", "workloads-latency.png"]);
        let (_, time) = &charts[0];
        assert_eq!(time.groups, ["tar -xf + sync"]);
        assert_eq!(time.series, [("ext4".to_string(), vec![Some(2.0)]), ("ferrofs".to_string(), vec![Some(10.0)])]);
        assert_eq!(charts[1].1.groups, ["dbench 8"]);
    }

    #[test]
    fn json_keeps_every_sample() {
        let v: serde_json::Value = serde_json::to_value(fake()).unwrap();
        let samples = v["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 21);
        assert_eq!(samples[0]["workload"], "tar -xf + sync");
        assert_eq!(samples[0]["metric"], "seconds");
        assert_eq!(v["tree"]["files"], 10);
        assert_eq!(v["targets"][0][0], "ext4");
    }
}

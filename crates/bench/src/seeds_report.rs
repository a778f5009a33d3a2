//! The Markdown report and plot series of `ferrofs bench seeds` (`seeds.rs` runs it).

use super::plot::Plot;
use super::seeds_results::{Results, Sizes, Skipped};
use super::targets::daemons_ran;
use crate::units::{grouped, human_bytes};
use std::fmt::Write;

/// The kernel file system every ratio is taken against.
const BASELINE: &str = "ext4";

/// One column of a table: a metric at one x (threads, clients ...).
struct Col {
    metric: &'static str,
    x: u64,
    head: String,
    fmt: fn(f64) -> String,
}

fn col(metric: &'static str, x: u64, head: impl Into<String>, fmt: fn(f64) -> String) -> Col {
    Col { metric, x, head: head.into(), fmt }
}

fn rate(v: f64) -> String {
    grouped(v.round() as u64)
}

fn secs(v: f64) -> String {
    format!("{v:.3}")
}

fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

fn plain(v: f64) -> String {
    format!("{v:.2}")
}

/// The whole report. `with_plots`: link the PNGs in results/.
pub fn markdown(r: &Results, with_plots: bool) -> String {
    let mut o = String::new();
    let m = &r.machine;
    let _ = writeln!(o, "# Seed experiments: ferrofs beside its peers\n");
    let _ = writeln!(
        o,
        "`{}` ({} sizes, {} repetitions; within each repetition every target in turn, each mounted afresh). \
         Cells are median [min-max] over the repetitions; ratios are medians over the median of kernel {BASELINE}. \
         The seeds' own figures are theirs, measured on their hardware with their kernels: \
         they are shown for the shape of the result, not to compare absolute numbers.\n",
        r.command, r.sizes.preset, r.runs
    );
    let _ = writeln!(
        o,
        "Machine: {} cores, {} memory, {}. Load average (1/5/15 min) {} at the start, {} at the end \
         (the machine is shared with other builds: expect single figures to swing, compare within a run). \
         The whole run took {:.1} min.\n",
        m.cores,
        human_bytes(m.memory_bytes),
        m.kernel,
        m.loadavg_start,
        m.loadavg_end,
        r.wall_seconds / 60.0
    );
    let _ = writeln!(o, "| target | what |\n|---|---|");
    for (n, d) in &r.targets {
        let _ = writeln!(o, "| {n} | {d} |");
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "FUSE daemons (ferrofs, minifuse, fuse2fs) ran {}: every one alike, since the kernel \
         schedules each session's threads as one group (autogroup) and the arrangement moves some \
         daemons' rates by a third (docs/bench-fsmark.md).\n",
        daemons_ran(r.detached)
    );
    sizes(&mut o, &r.sizes);
    let plots = plots(r);
    let plot_links = |o: &mut String, prefix: &str| {
        if with_plots {
            for p in plots.iter().filter(|p| p.file.starts_with(prefix)) {
                let _ = writeln!(o, "![{}](results/{})\n", p.title, p.file);
            }
        }
    };
    for w in &r.workloads {
        match *w {
            "orphan" => {
                let s = &r.sizes;
                let _ = writeln!(o, "## Orphan stress (seed 000)\n");
                let _ = writeln!(
                    o,
                    "P threads (the seed used processes) each truncate their own 4 KiB file by one byte at a time \
                     down to 1 byte (`ftruncate`), then extend it back to 4096; {} round(s); wall seconds per P, lower is better. \
                     ferrofs-embedded is `ferrofs bench orphan`'s engine workload (setattr in this process, orphan tracking on).\n",
                    s.orphan_rounds
                );
                let _ = writeln!(o, "Seed 000's figures (ext4, theirs): 40 processes 236.7 s before the fix, 174.5 s after; `s_orphan_mutex` acquisitions halved.\n");
                let cols: Vec<Col> =
                    s.orphan_threads.iter().map(|&p| col("seconds", p as u64, format!("P={p} s"), secs)).collect();
                let top = *s.orphan_threads.iter().max().unwrap_or(&1) as u64;
                table(&mut o, r, w, &cols, &[col("seconds", top, format!("time / {BASELINE} at P={top}"), plain)]);
                plot_links(&mut o, "orphan");
            }
            "mdtest" => {
                let s = &r.sizes;
                let _ = writeln!(o, "## mdtest-style create / stat / remove (seed 001)\n");
                let _ = writeln!(
                    o,
                    "P workers (threads), each in a directory of its own, {} files each ({} on {}): create (open O_CREAT + close), \
                     stat, remove, as `mdtest -F -C -T -r`; ops/s, higher is better. ferrofs-embedded is `ferrofs bench`'s \
                     create/lookup/unlink path (its create and remove phases end with a sync).\n",
                    grouped(s.mdtest_files),
                    grouped((s.mdtest_files / s.slow_divisor).max(1)),
                    s.slow_targets.join(", ")
                );
                let _ = writeln!(o, "Seed 001's figures (ext4, theirs; `mdtest -n 30000 -F -C -r -u`, 48 processes, 48 directories): create 79k ops/s before, 611k after; remove about 285k ops/s.\n");
                let top = *s.mdtest_workers.iter().max().unwrap_or(&1) as u64;
                for metric in ["create", "stat", "remove"] {
                    let _ = writeln!(o, "**{metric}** ops/s:\n");
                    let cols: Vec<Col> =
                        s.mdtest_workers.iter().map(|&p| col(metric, p as u64, format!("P={p}"), rate)).collect();
                    table(&mut o, r, w, &cols, &[col(metric, top, format!("/ {BASELINE} at P={top}"), plain)]);
                }
                plot_links(&mut o, "mdtest");
            }
            "fsmark" => {
                let s = &r.sizes;
                let t = s.fsmark_threads as u64;
                let _ = writeln!(o, "## fs_mark zero-length creates, then parallel rm -rf (seed 003)\n");
                let _ = writeln!(
                    o,
                    "`fs_mark -S0 -s0 -k -L1 -D 100 -n FILES/{t} -t 1` with {t} directories (one thread each), {} files ({} on {}); \
                     then {t} `rm -rf` at once. Files/s over wall clock, higher is better.\n",
                    grouped(s.fsmark_files),
                    grouped((s.fsmark_files / s.slow_divisor).max(1)),
                    s.slow_targets.join(", ")
                );
                let _ = writeln!(o, "Seed 003's figures (XFS, theirs): 8-way fs_mark 65k files/s before, 90-95k after; 8-way `rm -rf` 23m58s before, 11m29s after (2.1x).\n");
                let cols = [
                    col("create", t, "create files/s", rate),
                    col("remove", t, "remove files/s", rate),
                    col("fsmark_files_per_sec", t, "fs_mark's own files/s", rate),
                ];
                table(
                    &mut o,
                    r,
                    w,
                    &cols,
                    &[
                        col("create", t, format!("create / {BASELINE}"), plain),
                        col("remove", t, format!("remove / {BASELINE}"), plain),
                    ],
                );
            }
            "dbench" => {
                let s = &r.sizes;
                let _ = writeln!(o, "## dbench (seed 002)\n");
                let _ = writeln!(
                    o,
                    "`dbench -t {} -c client.txt -D DIR CLIENTS`: throughput MB/s (higher is better), dbench's max latency and its \
                     Flush (fsync) average and max latency in ms (lower is better).\n",
                    s.dbench_seconds
                );
                let _ = writeln!(o, "Seed 002's figures (btrfs, theirs; `dbench -t 300 64`): 1179 MB/s before, 1339 MB/s after (+12.7%); max latency 676 ms before, 623 ms after.\n");
                for &c in &s.dbench_clients {
                    let x = c as u64;
                    let _ = writeln!(o, "**{c} clients**:\n");
                    let cols = [
                        col("mb_per_s", x, "MB/s", plain),
                        col("max_latency_ms", x, "max latency ms", ms),
                        col("flush_avg_ms", x, "Flush avg ms", ms),
                        col("flush_max_ms", x, "Flush max ms", ms),
                    ];
                    table(&mut o, r, w, &cols, &[col("mb_per_s", x, format!("MB/s / {BASELINE}"), plain)]);
                }
                plot_links(&mut o, "dbench");
            }
            "unmount" => {
                let s = &r.sizes;
                let _ = writeln!(o, "## Unmount beside a large inode cache (seed 004)\n");
                let _ = writeln!(
                    o,
                    "Unmount time of a small file system B ({} files, each touched) alone, then while file system A holds {} cached inodes; \
                     lower is better, and the ratio with/without should stay near 1. ferrofs-embedded is `ferrofs bench unmount` \
                     (A and B are engine mounts in this process); the tmpfs row is the kernel's: umount(2) of a tmpfs B while a tmpfs A holds \
                     the files (seed 004's shape, with one A instead of 100 x 10 submounts). Other targets have no row here.\n",
                    grouped(s.unmount_b_files),
                    grouped(s.unmount_a_files)
                );
                let _ = writeln!(o, "Seed 004's result (theirs, qualitative): with per-superblock inode lists, `umount` time no longer grows with the size of the global inode cache.\n");
                let x = s.unmount_a_files;
                let cols = [
                    col("without_a_ms", x, "B unmount ms, no A", ms),
                    col("with_a_ms", x, "B unmount ms, with A", ms),
                    col("ratio", x, "with / without", plain),
                ];
                table(&mut o, r, w, &cols, &[]);
            }
            _ => {}
        }
        locks(&mut o, r, w);
        for (_, n) in r.notes.iter().filter(|n| n.0 == *w) {
            let _ = writeln!(o, "{n}\n");
        }
    }
    skipped_list(&mut o, "## Skipped", &r.skipped);
    let _ = writeln!(
        o,
        "Every raw figure is in results/seeds.json (`samples`: workload, target, repetition, x, metric, value)."
    );
    o
}

/// `heading` and a line per skipped workload and target, if any were skipped.
pub fn skipped_list(o: &mut String, heading: &str, skipped: &[Skipped]) {
    if skipped.is_empty() {
        return;
    }
    let _ = writeln!(o, "{heading}\n");
    for s in skipped {
        let _ = writeln!(o, "- {} / {}: {}", s.workload, s.target, s.reason);
    }
    let _ = writeln!(o);
}

fn sizes(o: &mut String, s: &Sizes) {
    let _ = writeln!(
        o,
        "Sizes ({}): orphan P={:?} x {} round(s); mdtest P={:?} x {} files; fs_mark {} threads, {} files; dbench {:?} clients x {} s; \
         unmount A {} inodes, B {} files. `--full` runs sizes closer to the seeds'.\n",
        s.preset,
        s.orphan_threads,
        s.orphan_rounds,
        s.mdtest_workers,
        grouped(s.mdtest_files),
        s.fsmark_threads,
        grouped(s.fsmark_files),
        s.dbench_clients,
        s.dbench_seconds,
        grouped(s.unmount_a_files),
        grouped(s.unmount_b_files)
    );
}

/// Rows = targets measured in workload `w`; cells median [min-max]; ratio columns over
/// the baseline's median.
fn table(o: &mut String, r: &Results, w: &str, cols: &[Col], ratios: &[Col]) {
    let rows: Vec<&str> =
        r.targets.iter().map(|t| t.0).filter(|t| r.samples.iter().any(|s| s.workload == w && s.target == *t)).collect();
    if rows.is_empty() {
        let _ = writeln!(o, "(no target measured)\n");
        return;
    }
    let heads: Vec<&str> = cols.iter().chain(ratios).map(|c| c.head.as_str()).collect();
    let _ = writeln!(o, "| target | {} |", heads.join(" | "));
    let _ = writeln!(o, "|---|{}", "---:|".repeat(heads.len()));
    for t in rows {
        let mut cells = Vec::new();
        for c in cols {
            cells.push(match r.stats(w, t, c.x, c.metric) {
                Some((med, lo, hi)) => {
                    format!("{} [{}-{}]", (c.fmt)(med), (c.fmt)(lo), (c.fmt)(hi))
                }
                None => "-".into(),
            });
        }
        for c in ratios {
            let mine = r.stats(w, t, c.x, c.metric);
            let base = r.stats(w, BASELINE, c.x, c.metric);
            cells.push(match (mine, base) {
                (Some(a), Some(b)) if b.0 > 0.0 => format!("{:.2}x", a.0 / b.0),
                _ => "-".into(),
            });
        }
        let _ = writeln!(o, "| {t} | {} |", cells.join(" | "));
    }
    let _ = writeln!(o);
}

fn locks(o: &mut String, r: &Results, w: &str) {
    for set in r.locks.iter().filter(|l| l.workload == w && !l.rows.is_empty()) {
        let _ = writeln!(
            o,
            "Locks of {} in this workload, top {} by wait time (summed over the repetitions; wait = contended acquisitions only):\n",
            set.target,
            set.rows.len()
        );
        let _ = writeln!(
            o,
            "| lock class | acquisitions | contended | wait total ms | wait max us |\n|---|---:|---:|---:|---:|"
        );
        for l in &set.rows {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.3} | {:.1} |",
                l.name,
                grouped(l.acquisitions),
                grouped(l.contentions),
                l.wait_total_ns as f64 / 1e6,
                l.wait_max_ns as f64 / 1e3
            );
        }
        let _ = writeln!(o);
    }
}

/// One scaling curve to draw: a workload's metric over the x values it was measured at.
struct PlotSpec {
    workload: &'static str,
    metric: &'static str,
    file: String,
    title: String,
    y_label: String,
    xs: Vec<u64>,
}

/// The scaling curves: one plot per workload metric with more than one x, one line per target.
pub fn plots(r: &Results) -> Vec<Plot> {
    let s = &r.sizes;
    let mut specs = vec![PlotSpec {
        workload: "orphan",
        metric: "seconds",
        file: "orphan.png".into(),
        title: "Orphan stress (seed 000): wall time, lower is better".into(),
        y_label: "seconds".into(),
        xs: s.orphan_threads.iter().map(|&p| p as u64).collect(),
    }];
    for m in ["create", "stat", "remove"] {
        specs.push(PlotSpec {
            workload: "mdtest",
            metric: m,
            file: format!("mdtest-{m}.png"),
            title: format!("mdtest-style {m} (seed 001), higher is better"),
            y_label: format!("{m} ops/s"),
            xs: s.mdtest_workers.iter().map(|&p| p as u64).collect(),
        });
    }
    specs.push(PlotSpec {
        workload: "dbench",
        metric: "mb_per_s",
        file: "dbench.png".into(),
        title: "dbench (seed 002): throughput, higher is better".into(),
        y_label: "MB/s".into(),
        xs: s.dbench_clients.iter().map(|&c| c as u64).collect(),
    });
    let mut out = Vec::new();
    for PlotSpec { workload: w, metric, file, title, y_label, xs } in specs {
        if !r.workloads.contains(&w) || xs.len() < 2 {
            continue;
        }
        let series: Vec<(String, Vec<(f64, f64)>)> = r
            .targets
            .iter()
            .filter_map(|(t, _)| {
                let pts: Vec<(f64, f64)> =
                    xs.iter().filter_map(|&x| r.stats(w, t, x, metric).map(|st| (x as f64, st.0))).collect();
                (!pts.is_empty()).then(|| (t.to_string(), pts))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        out.push(Plot {
            file,
            title,
            x_label: if w == "dbench" { "clients" } else { "P (threads)" }.into(),
            y_label,
            series,
        });
    }
    out
}

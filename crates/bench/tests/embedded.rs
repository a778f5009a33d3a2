//! The engine workloads of `ferrofs-bench` (as `ferrofs bench` runs them) at a tiny size:
//! exit codes, messages, figures, and that no image is left behind.

use std::process::{Command, Output};

#[path = "../../cli/tests/common/clean_failure.rs"]
mod clean_failure;
use clean_failure::assert_clean_failure;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrofs-bench")).args(args).output().expect("run ferrofs-bench")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A test's scratch directory (removed on drop) and its files' names in it.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(test: &str) -> Scratch {
        Scratch(tempfile::Builder::new().prefix(&format!("ferrofs-bench-{test}")).tempdir().expect("scratch dir"))
    }
    fn path(&self, name: &str) -> String {
        self.0.path().join(name).display().to_string()
    }
}

#[test]
fn bench_reports_every_phase_and_deletes_its_image() {
    let s = Scratch::new("bench");
    let (img, json) = (s.path("bench.img"), s.path("bench.json"));
    let o = bench(&[
        "--image",
        &img,
        "--files",
        "300",
        "--threads",
        "1,2",
        "--shared-dir",
        "--big-dir",
        "500",
        "--runs",
        "2",
        "--json",
        &json,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!std::path::Path::new(&img).exists(), "the benchmark image is left behind");
    assert!(text(&o.stdout).contains("locks, top 10"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cycles = v["cycles"].as_array().unwrap();
    assert_eq!(cycles.len(), 4, "private and shared, 1 and 2 threads");
    for c in cycles {
        let phases: Vec<&str> = c["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap()).collect();
        assert_eq!(phases, ["create", "stat", "remove"]);
        assert_eq!(c["phases"][0]["ops_per_sec"].as_array().unwrap().len(), 2);
    }
    assert_eq!(v["big_dir"]["files"], 500);
    assert_eq!(v["memory"]["inodes_cached"], 300);
    assert!(v["journal"]["commits"].as_u64().unwrap() >= 3 * 300);
}

#[test]
fn bench_refuses_an_existing_image_path() {
    let s = Scratch::new("bench-exists");
    let img = s.path("keep.img");
    std::fs::write(&img, b"precious").unwrap();
    assert_clean_failure(&bench(&["--image", &img, "--files", "10"]), "already exists");
    assert_eq!(std::fs::read(&img).unwrap(), b"precious");
}

/// Results are kept per thread count: a count given twice would be compared with itself.
#[test]
fn bench_refuses_a_thread_count_given_twice() {
    for workload in ["scale", "commit", "orphan"] {
        assert_clean_failure(&bench(&[workload, "--threads", "2,48,2", "--mem"]), "2 is listed twice");
    }
}

/// Each journal workload runs at a tiny size, prints its figures and the lock table, writes
/// its JSON and deletes its image. (A smoke test: no figure is checked against a target.)
#[test]
fn bench_journal_workloads_report_their_figures() {
    let s = Scratch::new("bench-journal");
    let cases: [(&str, &[&str], &str, &str); 4] = [
        ("commit", &["--threads", "1,2", "--files", "4", "--commits", "2000"], "commits/s", "rows"),
        ("orphan", &["--threads", "1,2", "--rounds", "1"], "tracking off", "rows"),
        ("unlinked", &["--files", "300"], "close (frees inodes)", "close_seconds"),
        ("fsync", &["--files", "30"], "p99 loaded/idle", "p99_ratio"),
    ];
    for (workload, extra, printed, field) in cases {
        let (img, json) = (s.path(&format!("{workload}.img")), s.path(&format!("{workload}.json")));
        let mut args = vec![workload, "--image", &img, "--runs", "2", "--json", &json];
        args.extend_from_slice(extra);
        let o = bench(&args);
        assert!(o.status.success(), "{workload}: {}", text(&o.stderr));
        let out = text(&o.stdout);
        assert!(out.contains(printed) && out.contains("locks, top 10"), "{workload}: {out}");
        assert!(!std::path::Path::new(&img).exists(), "{workload} left its image behind");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["mode"], workload);
        assert!(!v["results"][field].is_null(), "{workload}: no {field} in {v}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(s.path("orphan.json")).unwrap()).unwrap();
    for row in v["results"]["rows"].as_array().unwrap() {
        assert_eq!(row["seconds_tracking_on"]["runs"].as_array().unwrap().len(), 2);
        assert_eq!(row["orphan_adds_off"], 0, "tracking off must add no orphans");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("unlinked.json")).unwrap()).unwrap();
    assert_eq!(v["results"]["orphan_adds_per_run"], serde_json::json!([300, 300]));
}

/// The scalability and unmount workloads run at a tiny size, print their tables and targets,
/// write their JSON and delete their images. (A smoke test: no figure is checked against a
/// target.)
#[test]
fn bench_scale_and_unmount_report_their_figures() {
    let s = Scratch::new("bench-scale");
    let (img, json) = (s.path("scale.img"), s.path("scale.json"));
    let o = bench(&[
        "scale",
        "--image",
        &img,
        "--files",
        "200",
        "--mdtest-files",
        "20",
        "--threads",
        "1,3",
        "--runs",
        "2",
        "--min-phase-ms",
        "20",
        "--json",
        &json,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("mdtest pattern") && out.contains("targets:") && out.contains("locks, top 10"), "{out}");
    assert!(!std::path::Path::new(&img).exists(), "scale left its image behind");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["results"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 2 * 7, "private and shared, 2 thread counts, 7 phases");
    for r in rows {
        assert_eq!(r["ops_per_sec"].as_array().unwrap().len(), 2);
        assert!(r["locks"].as_array().unwrap().len() <= 5);
    }
    let readdir =
        rows.iter().find(|r| r["phase"] == "readdir" && r["layout"] == "shared" && r["threads"] == 3).unwrap();
    // The read-only phases repeat for --min-phase-ms; each thread lists the whole directory
    // at least once per run (200 entries, 3 threads).
    for ops in readdir["ops"].as_array().unwrap() {
        assert!(ops.as_u64().unwrap() >= 600, "every thread lists the whole shared directory: {ops}");
    }
    assert_eq!(v["results"]["mdtest"].as_array().unwrap().len(), 2 * 3);
    assert!(v["results"]["targets"].as_array().unwrap().len() >= 3);

    let (img, json) = (s.path("unmount.img"), s.path("unmount.json"));
    let o =
        bench(&["unmount", "--image", &img, "--files", "500", "--small-files", "30", "--runs", "2", "--json", &json]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("ratio with/without"), "{}", text(&o.stdout));
    assert!(!std::path::Path::new(&img).exists() && !std::path::Path::new(&s.path("unmount.small.img")).exists());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["results"]["a_cached_inodes"].as_u64().unwrap() >= 500);
    assert_eq!(v["results"]["b_cached_inodes"], 32, "root, the directory and 30 files");
    assert_eq!(v["results"]["seconds_with_a"]["runs"].as_array().unwrap().len(), 2);
}

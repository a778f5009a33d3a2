//! `ferrofs-bench seeds` end to end at its tiny size, on tmpfs and ferrofs embedded only.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ferrofs-bench");

#[test]
fn seeds_on_tmpfs_writes_report_plots_and_json() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIPPED bench_seeds: needs root to mount tmpfs");
    }
    let dir = std::env::temp_dir().join(format!("ferrofs-seeds-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("RESULTS.md");
    let o = Command::new(BIN)
        .args(["seeds", "--tiny", "--targets", "tmpfs", "--runs", "1", "--report"])
        .arg(&report)
        .output()
        .expect("run ferrofs-bench");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    let md = std::fs::read_to_string(&report).expect("report written");
    for want in ["seed 000", "seed 001", "seed 003", "seed 004", "ferrofs-embedded", "| tmpfs |", "Load average"] {
        assert!(md.contains(want), "{want} missing:\n{md}");
    }
    let results = dir.join("results");
    let png = std::fs::read(results.join("orphan.png")).expect("orphan plot");
    assert_eq!(&png[1..4], b"PNG");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("seeds.json")).unwrap()).expect("valid JSON");
    assert!(v["samples"].as_array().is_some_and(|s| !s.is_empty()));
    std::fs::remove_dir_all(&dir).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("/ffb."), "{mounts}");
}

//! `ferrofs-bench fsmark`, and `fsync` and `scale` on mounted targets, end to end
//! on the one target every Linux has (tmpfs), tiny.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ferrofs-bench");

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(program).is_file())
}

fn unavailable() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to mount tmpfs");
    }
    if !on_path("fs_mark") {
        return Some("fs_mark not installed (scripts/install-bench-deps.sh)");
    }
    None
}

#[test]
fn fsmark_on_tmpfs_reports_files_per_second_and_cleans_up() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED bench_fsmark: {why}");
    }
    let json = std::env::temp_dir().join(format!("ferrofs-fsmark-test-{}.json", std::process::id()));
    let o = Command::new(BIN)
        .args(["fsmark", "--targets", "tmpfs", "--files", "200", "--threads", "1,2", "--runs", "1", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ferrofs-bench");
    let work = std::env::temp_dir().join(format!("ffb.{}", o.id()));
    let o = o.wait_with_output().expect("wait for ferrofs-bench");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("files/s") && out.contains("tmpfs"), "{out}");
    let text = std::fs::read_to_string(&json).expect("JSON report");
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let samples = v["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 2, "{text}");
    assert!(samples.iter().all(|s| s["files"].as_u64() == Some(200) && s["create_seconds"].as_f64().unwrap() > 0.0));
    // Nothing left behind: no mount and no work directory of that run.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("/ffb."), "{mounts}");
    assert!(!work.exists(), "{} left behind", work.display());
}

/// `ferrofs-bench WORKLOAD --targets tmpfs ARGS`: its output and its one mounted target's
/// figures from the JSON report, after checking that it left no mount behind; `None` (the test
/// skips) without root.
fn on_tmpfs(workload: &str, args: &[&str]) -> Option<(String, serde_json::Value)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED {workload} on tmpfs: needs root to mount tmpfs");
        return None;
    }
    let json = std::env::temp_dir().join(format!("ferrofs-{workload}-test-{}.json", std::process::id()));
    let o = Command::new(BIN)
        .args([workload, "--targets", "tmpfs", "--runs", "1"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ferrofs-bench");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    let text = std::fs::read_to_string(&json).expect("JSON report");
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mounted = v["results"]["mounted"].as_array().expect("mounted targets");
    assert_eq!(mounted.len(), 1, "{text}");
    assert_eq!(mounted[0]["target"], "tmpfs");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("/ffb."), "{mounts}");
    Some((out.into_owned(), mounted[0].clone()))
}

#[test]
fn fsync_on_tmpfs_stands_next_to_the_engine_and_cleans_up() {
    let Some((out, tmpfs)) = on_tmpfs("fsync", &["--files", "50"]) else {
        return;
    };
    assert!(out.contains("syncfs") && out.contains("embedded") && out.contains("tmpfs"), "{out}");
    assert!(tmpfs["p99_ratio"].as_f64().unwrap() > 0.0, "{tmpfs}");
    assert!(tmpfs["loaded"]["load_creates"].as_u64().unwrap() > 0, "{tmpfs}");
}

#[test]
fn scale_on_tmpfs_runs_every_phase_through_system_calls_and_cleans_up() {
    let args = ["--files", "300", "--mdtest-files", "20", "--threads", "1,3", "--min-phase-ms", "20"];
    let Some((out, tmpfs)) = on_tmpfs("scale", &args) else {
        return;
    };
    assert!(out.contains("tmpfs through system calls") && out.contains("side by side"), "{out}");
    // Every phase of both layouts at both thread counts, and the mdtest pattern, did its work.
    let rows = tmpfs["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2 * 7, "{tmpfs}");
    for r in rows.iter().chain(tmpfs["mdtest"].as_array().expect("mdtest rows")) {
        let ops = r["ops"][0].as_u64().expect("ops");
        assert!(ops >= 20 && r["median"].as_f64().unwrap() > 0.0, "{r}");
    }
    // The mutating phases do each file exactly once, on tmpfs as on the engine.
    let unlink = rows.iter().find(|r| r["phase"] == "unlink" && r["layout"] == "shared").expect("shared unlink");
    assert_eq!(unlink["ops"][0], 300, "{unlink}");
    // The engine's lock classes are not the mounted file system's.
    assert!(rows.iter().all(|r| r["locks"].as_array().is_some_and(|l| l.is_empty())), "{tmpfs}");
}

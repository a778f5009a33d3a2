//! `ferrofs-bench workloads`: its arguments, and a small run end to end on tmpfs and ferrofs
//! through the mount.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ferrofs-bench");

fn bench(args: &[&str]) -> (Output, String, String) {
    let o = Command::new(BIN).arg("workloads").args(args).output().expect("run ferrofs-bench");
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    (o, out, err)
}

#[test]
fn bad_arguments_are_refused_by_name() {
    for (args, names) in [
        (&["--tree-size", "12Q"][..], "--tree-size"),
        (&["--dbench-clients", "0"][..], "--dbench-clients"),
        (&["--dbench-seconds", "0"][..], "--dbench-seconds"),
        (&["--writes", "0"][..], "--writes"),
        (&["--targets", "nfs"][..], "--targets"),
    ] {
        let (o, out, err) = bench(args);
        assert!(!o.status.success(), "{args:?} accepted: {out}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
    let (o, _, err) = bench(&["--image-dir", "/nonexistent/ferrofs-bench"]);
    assert!(!o.status.success());
    assert!(err.contains("--image-dir") && err.contains("no directory"), "{err}");
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for want in ["workloads", "--ferrofs-options", "--tree", "--tree-size", "--repo", "--out", "passthrough_ll"] {
        assert!(help.contains(want), "{want} missing from --help:\n{help}");
    }
}

fn unavailable() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to mount");
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse");
    }
    None
}

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(program).is_file())
}

#[test]
fn small_run_on_tmpfs_and_ferrofs_has_every_row_and_cleans_up() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED workloads smoke run: {why}");
    }
    let out_dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let child = Command::new(BIN)
        .args(["workloads", "--targets", "tmpfs,ferrofs", "--tree", "generated", "--tree-size", "2M", "--runs", "1"])
        .args(["--dbench-clients", "2", "--dbench-seconds", "2", "--writes", "20", "--repo"])
        .arg(&repo)
        .arg("--out")
        .arg(out_dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ferrofs-bench");
    let pid = child.id();
    let work = std::env::temp_dir().join(format!("ffb.{pid}"));
    let o = child.wait_with_output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("workloads.json")).unwrap()).unwrap();
    let samples = v["samples"].as_array().expect("samples");
    let value = |w: &str, t: &str, m: &str| {
        samples
            .iter()
            .find(|s| s["workload"] == w && s["target"] == t && s["metric"] == m)
            .and_then(|s| s["value"].as_f64())
    };
    let git = on_path("git");
    let mut rows: Vec<(&str, &str)> =
        vec![("tar -xf + sync", "seconds"), ("cp -a out", "seconds"), ("rm -rf", "seconds")];
    if git {
        rows.extend([("git clone", "seconds"), ("git status", "seconds"), ("git log -p", "seconds")]);
    }
    for w in ["append 4 KiB", "append 4 KiB + fdatasync", "overwrite 4 KiB", "overwrite 4 KiB + fdatasync"] {
        rows.extend([(w, "p50_us"), (w, "p99_us")]);
    }
    if on_path("dbench") {
        rows.extend([("dbench", "mb_per_s"), ("dbench", "max_latency_ms")]);
    }
    for t in ["tmpfs", "ferrofs"] {
        for &(w, m) in &rows {
            let got = value(w, t, m);
            assert!(got.is_some_and(|x| x > 0.0), "{w} {m} on {t}: {got:?}\n{out}\n{err}");
        }
    }
    // The daemon's figures: ferrofs only (a FUSE server); CPU is counted in clock ticks, so a
    // short workload may show none.
    for &(w, _) in &rows {
        assert!(value(w, "ferrofs", "daemon_peak_rss_mib").is_some_and(|x| x > 1.0), "{w}: {out}");
        assert!(value(w, "ferrofs", "daemon_cpu_us_per_op").is_some_and(|x| x >= 0.0), "{w}: {out}");
        assert_eq!(value(w, "tmpfs", "daemon_peak_rss_mib"), None, "{w}");
    }
    assert!(v["tree"]["files"].as_u64().unwrap() > 10, "{v}");
    assert!(v["skipped"].as_array().unwrap().iter().all(|s| s["target"] == "all"), "{v}");
    for png in ["workloads-time.png", "workloads-latency.png"] {
        let bytes = std::fs::read(out_dir.path().join(png)).expect(png);
        assert_eq!(&bytes[1..4], b"PNG");
    }
    let md = std::fs::read_to_string(out_dir.path().join("workloads.md")).unwrap();
    assert!(md.contains("| tar -xf + sync | s |") && md.contains("daemon peak RSS MiB"), "{md}");
    assert_eq!(md, out);
    // Nothing left behind: no mount, work directory, image or tarball of that run.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&work.display().to_string()), "{mounts}");
    assert!(!work.exists(), "{} left behind", work.display());
    let ours = format!("ferrofs-bench-{pid}-");
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&ours))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn uring_target_served_through_dev_fuse_is_dropped_with_the_reason() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED uring fallback check: {why}");
    }
    // The module parameter is system-wide: read, never switched here. Only with it off does
    // an `-o uring` mount fall back to /dev/fuse.
    let enable = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").unwrap_or_default();
    if enable.trim() != "N" {
        return eprintln!("SKIPPED uring fallback check: enable_uring is {:?}, not N", enable.trim());
    }
    let (o, out, err) = bench(&[
        "--targets",
        "ferrofs",
        "--ferrofs-options",
        "uring",
        "--tree-size",
        "1M",
        "--runs",
        "1",
        "--dbench-clients",
        "2",
        "--dbench-seconds",
        "1",
        "--writes",
        "10",
        "--repo",
        "/nonexistent",
    ]);
    assert!(o.status.success(), "{out}\n{err}");
    let dropped = out.lines().find(|l| l.contains("ferrofs -o uring") && l.contains("failed in repetition 1"));
    assert!(dropped.is_some_and(|l| l.contains("not io_uring")), "{out}\n{err}");
    assert!(out.contains("| tar -xf + sync | s |"), "{out}");
}

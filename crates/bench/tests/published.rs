//! `ferrofs-bench published`: its arguments, and a small run end to end against the local S3
//! server (scripts/s3-server.sh): every case's row, hash checks, and nothing left behind.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ferrofs-bench");

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]).any(|d| d.join(program).is_file())
}

/// Why the smoke run cannot run here: no root, no FUSE, or no S3 server to be had.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to mount".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-server.sh");
    let o = Command::new(&script).arg("install").output().expect("run scripts/s3-server.sh install");
    if !o.status.success() {
        return Some(format!("no S3 server: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    None
}

#[test]
fn bad_arguments_are_refused_by_name() {
    for (args, names) in [
        (&["--dirs", "0"][..], "--dirs"),
        (&["--delay-ms", "soon"][..], "--delay-ms"),
        (&["--files", "10", "--dirs", "20"][..], "--files"),
    ] {
        let o = Command::new(BIN).arg("published").args(args).output().expect("run ferrofs-bench");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} accepted");
        assert!(err.contains(names), "{args:?}: {err}");
    }
}

#[test]
fn small_run_has_every_row_checks_every_hash_and_cleans_up() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED published smoke run: {why}");
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let child = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .args(["published", "--files", "300", "--dirs", "12", "--runs", "1", "--delay-ms", "0,20", "--disk-dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ferrofs-bench");
    let work = dir.path().join(format!("ferrofs-bench-published-{}", child.id()));
    let o = child.wait_with_output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    let baseline = ["s3backer", "squashfuse", "mksquashfs"].iter().all(|p| on_path(p));
    let mut rows = vec!["| local disk |".to_string()];
    let mut sources = vec!["published"];
    if baseline {
        sources.push("s3backer + squashfuse");
    } else {
        assert!(out.contains("## Skipped") && out.contains("not installed"), "{out}");
    }
    for source in sources {
        for delay in [0, 20] {
            for cache in ["cold", "warm"] {
                rows.push(format!("| {source}, {delay} ms, {cache} |"));
            }
        }
    }
    for row in &rows {
        let line = out.lines().find(|l| l.starts_with(row.as_str()));
        // A measured row has a figure of files/s, not "failed".
        assert!(line.is_some_and(|l| !l.contains("failed")), "{row} missing or failed:\n{out}\n{err}");
    }
    let checked = rows.len() * 300;
    let checked = format!("{},{:03}", checked / 1000, checked % 1000);
    assert!(out.contains(&format!("hash checks passed: {checked} files")), "{out}");
    for target in ["warm >= 0.8x local disk, 20 ms", "cold at 20 ms >= 5,000 files/s", "bytes fetched <= 2x"] {
        assert!(out.contains(target), "{target}: {out}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("published.json")).unwrap()).unwrap();
    let samples = v["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), rows.len(), "{v}");
    for s in samples {
        assert_eq!(s["bytes_read"], v["file_bytes"], "every file read once per case: {s}");
        if s["case"] != "local disk" {
            assert!(s["bytes_fetched"].as_u64().is_some(), "{s}");
        }
    }
    assert_eq!(std::fs::read_to_string(out_dir.join("published.md")).unwrap(), out);
    // Nothing left behind: no mount under the run's directory, no image, objects or caches.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&work.display().to_string()), "{mounts}");
    assert!(!work.exists(), "{} left behind", work.display());
}

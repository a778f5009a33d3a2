//! `ferrofs publish` and `ferrofs gc` as a user runs them: a publish to the in-memory store
//! (one per process) and the one-line refusals of bad arguments. The round trips against a
//! real server are crates/remote's tests and tests/remote_mount.rs.

use std::process::{Command, Output};

fn ferrofs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrofs")).args(args).output().expect("run ferrofs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A scratch directory holding a new 64 MiB image, and the image's path.
fn fresh_image() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img").to_str().unwrap().to_string();
    assert!(ferrofs(&["mkfs", &image, "--size", "64M"]).status.success());
    (dir, image)
}

#[test]
fn publish_replays_and_uploads_an_image() {
    let (_dir, image) = fresh_image();
    let image = image.as_str();
    let out = ferrofs(&["publish", image, "memory://cli/one", "--chunk-size", "256K"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.starts_with("memory://cli/one: generation 1 (over 0): 256 chunks, "), "{line}");
}

#[test]
fn bad_arguments_get_one_line_each() {
    let (dir, image) = fresh_image();
    let image = image.as_str();
    let cases: [(&[&str], &str); 4] = [
        (&["publish", image, "memory://cli/x", "--chunk-size", "3000"], "chunk size 3000 is not a power of two"),
        (&["publish", dir.path().to_str().unwrap(), "memory://cli/x"], "a directory, not a mount point"),
        (&["publish", image, "ftp://bucket/x"], "the scheme must be s3://"),
        (&["gc", "memory://cli/x", "--keep", "1", "--grace-minutes", "5"], "--grace-minutes must be at least 60"),
    ];
    for (args, expected) in cases {
        let out = ferrofs(args);
        let message = stderr(&out);
        assert!(!out.status.success() && message.contains(expected), "{args:?}: {message}");
        assert_eq!(message.trim_end().lines().count(), 1, "{args:?}: {message}");
    }
    let out = ferrofs(&["gc", "memory://cli/x", "--keep", "0"]);
    assert!(!out.status.success() && stderr(&out).contains("'--keep <KEEP>'"), "{}", stderr(&out));
}

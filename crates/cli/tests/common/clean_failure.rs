//! How a failed `ferrofs` or `ferrofs-bench` command must read; the tests of both crates
//! include this file.

use std::process::Output;

/// A failure reads `ferrofs: <what>: <why>`, never a panic.
pub fn assert_clean_failure(o: &Output, why: &str) {
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("ferrofs: "), "{err}");
    assert!(err.contains(why), "{err}");
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
}

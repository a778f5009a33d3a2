//! How one ferrofs program finds another: `ferrofs bench` runs `ferrofs-bench`, and the
//! benchmarks run `ferrofs` to make, mount and query the images they serve through FUSE.
//! Cargo builds both into one directory and `cargo install` puts both on PATH, so the
//! program next to this one comes first (the pair that was built together), then PATH.

use std::path::PathBuf;

/// The `ferrofs` command line.
pub const FERROFS: Program = Program { name: "ferrofs", package: "ferrofs-cli", crate_dir: "crates/cli" };

/// The benchmarks.
pub const FERROFS_BENCH: Program =
    Program { name: "ferrofs-bench", package: "ferrofs-bench", crate_dir: "crates/bench" };

/// The null FUSE server, the ceiling of each transport (`ferrofs_fuse::null`).
pub const FERROFS_NULLFS: Program =
    Program { name: "ferrofs-nullfs", package: "ferrofs-fuse", crate_dir: "crates/fuse" };

/// A program of this repository, and how to build it.
pub struct Program {
    /// The executable's name.
    pub name: &'static str,
    /// The cargo package that builds it.
    pub package: &'static str,
    /// Where that package lives in the repository (for `cargo install --path`).
    pub crate_dir: &'static str,
}

impl Program {
    /// The program next to this process's executable, else the first on PATH; the error
    /// says where it looked and how to build or install it.
    pub fn find(&self) -> Result<PathBuf, String> {
        let here = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(self.name)));
        let path = std::env::var_os("PATH").unwrap_or_default();
        here.into_iter()
            .chain(std::env::split_paths(&path).map(|dir| dir.join(self.name)))
            .find(|candidate| is_executable(candidate))
            .ok_or_else(|| {
                format!(
                    "{} not found next to this program nor on PATH: build it with `cargo build --release -p {}` \
                     (or install it with `cargo install --path {}`)",
                    self.name, self.package, self.crate_dir
                )
            })
    }
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

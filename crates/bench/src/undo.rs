//! What a target's set-up made, taken back in reverse order of making ([`Undo`]), and the
//! mount table that tells whether a mount is still there.

use super::shell::{self, run};
use super::targets::DAEMON_WAIT;
use crate::failure::{CliResult, Context, Failure};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// One thing to take back, in reverse order of making.
pub(super) enum Undo {
    Dir(PathBuf),
    /// A directory and everything in it.
    Tree(PathBuf),
    File(PathBuf),
    Loop(String),
    Mount(PathBuf),
    /// A daemon started by us: after its unmount it must exit.
    Child {
        child: Child,
        what: String,
        log: PathBuf,
    },
    /// A command that takes something back (a server's `stop`), program first.
    Run(Vec<std::ffi::OsString>),
}

impl Undo {
    pub(super) fn undo(self) -> CliResult<()> {
        match self {
            Undo::Dir(d) => std::fs::remove_dir(&d).context(|| format!("rmdir {}", d.display())),
            Undo::Tree(d) => match std::fs::remove_dir_all(&d) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Failure::new(format!("rm -r {}", d.display()), e))
                }
                _ => Ok(()),
            },
            Undo::File(f) => match std::fs::remove_file(&f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Failure::new(format!("rm {}", f.display()), e))
                }
                _ => Ok(()),
            },
            Undo::Run(argv) => run(Command::new(&argv[0]).args(&argv[1..])).map(drop),
            Undo::Loop(dev) => run(Command::new("losetup").arg("-d").arg(&dev)).map(drop),
            Undo::Mount(dir) => unmount(&dir),
            Undo::Child { mut child, what, log } => {
                if shell::wait_exit(&mut child, DAEMON_WAIT) {
                    return Ok(());
                }
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                Err(Failure::new(
                    format!("`{what}`"),
                    format!(
                        "still running {} s after its unmount; killed: {}",
                        DAEMON_WAIT.as_secs(),
                        shell::last_lines(&text)
                    ),
                ))
            }
        }
    }
}

/// What a set-up made, taken back in reverse order by [`Stack::close`] or on drop.
#[derive(Default)]
pub(super) struct Stack(Vec<Undo>);

impl Stack {
    pub(super) fn push(&mut self, undo: Undo) {
        self.0.push(undo);
    }

    /// The things to take back, for helpers that push several.
    pub(super) fn undos(&mut self) -> &mut Vec<Undo> {
        &mut self.0
    }

    /// Take everything back; the first failure, after trying all.
    pub(super) fn close(mut self) -> CliResult<()> {
        self.take_back()
    }

    fn take_back(&mut self) -> CliResult<()> {
        undo_all(&mut self.0)
    }
}

/// Take back everything in `undos`, last first; the first failure, after trying all.
pub(super) fn undo_all(undos: &mut Vec<Undo>) -> CliResult<()> {
    let mut first = None;
    while let Some(u) = undos.pop() {
        if let Err(e) = u.undo() {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Err(e) = self.take_back() {
            eprintln!("ferrofs: clean up: {e}");
        }
    }
}

/// `umount DIR`; if that fails while it is still mounted, detach it lazily and report.
fn unmount(dir: &Path) -> CliResult<()> {
    if !is_mounted(dir) {
        return Ok(());
    }
    match run(Command::new("umount").arg(dir)) {
        Ok(_) => Ok(()),
        Err(e) => {
            if is_mounted(dir) {
                let _ = run(Command::new("umount").arg("-l").arg(dir));
            }
            Err(e)
        }
    }
}

/// Whether something is mounted exactly on `dir`.
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    info.lines().any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(&unescape(m)) == want))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub(super) fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        match rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok()) {
            Some(b) => {
                out.push(b as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/x\\y"), r"/x\\y");
        assert_eq!(unescape("/plain"), "/plain");
    }
}

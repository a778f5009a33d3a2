//! Running other programs for the benchmarks: every command's exit status is checked and a
//! failure carries the command line and its stderr; timed groups of processes; and Ctrl-C
//! (SIGINT) or SIGTERM turned into an ordinary error, so set-up guards still tear down.

use crate::failure::{CliResult, Failure};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often waits look at the interrupt flag.
const POLL: Duration = Duration::from_millis(20);

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// From now on SIGINT and SIGTERM set a flag instead of killing this process; long waits
/// and every timed phase check it and fail with "interrupted", and the guards on the way
/// out clean up. A second signal ends the process at once (exit status 130), cleaned up or
/// not. Installed once: a second pair of handlers would end the process at the first signal.
pub fn catch_interrupts() -> CliResult<()> {
    // Only the caller that creates the flag installs the handlers (checking first and
    // creating after would let two concurrent callers both install them).
    let mut created = false;
    let flag = INTERRUPTED.get_or_init(|| {
        created = true;
        Arc::new(AtomicBool::new(false))
    });
    if !created {
        return Ok(());
    }
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone())
            .and_then(|_| signal_hook::flag::register(sig, flag.clone()))
            .map_err(|e| Failure::new("install the SIGINT/SIGTERM handler", e))?;
    }
    Ok(())
}

pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(SeqCst))
}

/// Fail with "interrupted" once a signal arrived.
pub fn check_interrupt() -> CliResult<()> {
    if interrupted() {
        Err(Failure::new("benchmark", "interrupted"))
    } else {
        Ok(())
    }
}

/// The command line as a shell would show it.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run to completion; its stdout, or a failure naming the command, its exit status and
/// stderr.
pub fn run(cmd: &mut Command) -> CliResult<String> {
    let line = describe(cmd);
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| Failure::new(format!("run `{line}`"), e))?;
    checked(&line, out)
}

fn checked(line: &str, out: Output) -> CliResult<String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Failure::new(
            format!("`{line}`"),
            format!("{}: {}", out.status, last_lines(&String::from_utf8_lossy(&out.stderr))),
        ))
    }
}

/// The end of a program's error output, on one line.
pub fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    match lines.len() {
        0 => "(no error output)".to_string(),
        // A usage message puts the reason first, and a long output puts it last.
        n if n <= 4 => lines.join(" | "),
        n => format!("{} | {} | ... | {} | {}", lines[0], lines[1], lines[n - 2], lines[n - 1]),
    }
}

/// What a timed group of processes took.
#[derive(Debug)]
pub struct Timed {
    /// From just before the first process was started until the last one had exited.
    pub wall: Duration,
    /// User + system CPU time of the processes (children reaped during the group).
    pub cpu: Duration,
    /// Each process's stdout, in the order given.
    pub stdout: Vec<String>,
}

/// Start all `cmds` at once and wait for all; the clock runs from the first start to the
/// last exit. Any failure (or an interrupt, which kills the rest) fails the group.
pub fn run_timed(cmds: Vec<Command>) -> CliResult<Timed> {
    check_interrupt()?;
    let lines: Vec<String> = cmds.iter().map(describe).collect();
    let cpu_before = children_cpu();
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let mut pids = Vec::new();
    let mut spawn_error = None;
    for (i, mut cmd) in cmds.into_iter().enumerate() {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own: an interrupt kills what it forked too (fs_mark forks a
            // worker per directory), which would otherwise hold its output pipe open.
            .process_group(0)
            .spawn();
        match child {
            Ok(child) => {
                pids.push(child.id());
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let out = child.wait_with_output();
                    let _ = tx.send((i, out, Instant::now()));
                });
            }
            Err(e) => {
                spawn_error = Some(Failure::new(format!("run `{}`", lines[i]), e));
                break;
            }
        }
    }
    drop(tx);
    if spawn_error.is_some() {
        kill_all(&pids);
    }
    let mut outputs: Vec<Option<String>> = vec![None; pids.len()];
    let mut failure = spawn_error;
    let mut last = started;
    let mut killed = false;
    let mut pending = pids.len();
    while pending > 0 {
        match rx.recv_timeout(POLL) {
            Ok((i, out, at)) => {
                pending -= 1;
                last = last.max(at);
                let res = out
                    .map_err(|e| Failure::new(format!("wait for `{}`", lines[i]), e))
                    .and_then(|o| checked(&lines[i], o));
                match res {
                    Ok(s) => outputs[i] = Some(s),
                    Err(f) => {
                        failure.get_or_insert(f);
                        if !killed {
                            kill_all(&pids);
                            killed = true;
                        }
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if interrupted() && !killed {
                    kill_all(&pids);
                    killed = true;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    check_interrupt()?;
    if let Some(f) = failure {
        return Err(f);
    }
    Ok(Timed {
        wall: last - started,
        cpu: children_cpu().saturating_sub(cpu_before),
        stdout: outputs.into_iter().map(Option::unwrap_or_default).collect(),
    })
}

/// Kill each process's group (each leads its own, see [`run_timed`]).
fn kill_all(pids: &[u32]) {
    for &pid in pids {
        // SAFETY: kill only sends a signal; a group whose leader already exited (not yet
        // reaped by its waiter thread) still has its id reserved, so it names no other group.
        unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
    }
}

/// CPU time of all reaped children of this process so far.
fn children_cpu() -> Duration {
    // SAFETY: rusage is plain integers, for which all-zero bytes are a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given and keeps no pointer to it.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Wait up to `limit` for `child` to exit (checking for interrupts); true if it did.
pub fn wait_exit(child: &mut Child, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Whether a program is on PATH (or is an existing path).
pub fn have(program: &str) -> bool {
    find_program(program).is_some()
}

pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        let p = std::path::PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(Into::into))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_carry_command_and_stderr() {
        let err = run(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("sh -c") && text.contains("oops") && text.contains('3'), "{text}");
        assert_eq!(run(Command::new("sh").args(["-c", "echo hi"])).unwrap(), "hi\n");
    }

    #[test]
    fn timed_group_collects_outputs_and_fails_as_a_whole() {
        let cmd = |s: &str| {
            let mut c = Command::new("sh");
            c.args(["-c", s]);
            c
        };
        let t = run_timed(vec![cmd("echo a"), cmd("echo b")]).unwrap();
        assert_eq!(t.stdout, vec!["a\n", "b\n"]);
        let err = run_timed(vec![cmd("sleep 5"), cmd("echo bad >&2; exit 1")]).unwrap_err();
        assert!(err.to_string().contains("bad"), "{err}");
    }
}

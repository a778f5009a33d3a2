//! `ferrofs-nullfs MOUNTPOINT [uring] [THREADS]`: the null server (`ferrofs_fuse::null`),
//! the ceiling of a FUSE transport, served until unmounted. `ferrofs bench` runs it.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mountpoint) = args.first() else {
        eprintln!("usage: ferrofs-nullfs MOUNTPOINT [uring] [THREADS]");
        return std::process::ExitCode::from(2);
    };
    let uring = args.get(1).is_some_and(|a| a == "uring");
    let threads = args.get(if uring { 2 } else { 1 }).and_then(|t| t.parse().ok()).unwrap_or(2);
    match ferrofs_fuse::null::serve(std::path::Path::new(mountpoint), uring, threads) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrofs-nullfs: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

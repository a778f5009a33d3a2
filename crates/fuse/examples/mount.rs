//! Mount an image in the foreground (for trying the adapter and measuring it; the `ferrofs`
//! CLI is the real front end):
//!
//!     cargo run --release -p ferrofs-fuse --example mount -- IMAGE MOUNTPOINT \
//!         [--mkfs BYTES] [--threads N] [--ro] [--writeback] [--no-default-permissions] \
//!         [--allow-other] [--timeout SECS] [-o OPTS]
//!
//! Serves until unmounted or SIGTERM/SIGINT.

use ferrofs::dev::FileDevice;
use ferrofs::{FileSystem, MkfsOptions};
use ferrofs_fuse::MountConfig;
use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(image), Some(mnt)) = (args.next(), args.next()) else {
        eprintln!("usage: mount IMAGE MOUNTPOINT [--mkfs BYTES] [--threads N] [--ro] [--writeback] [--no-default-permissions] [--allow-other] [--timeout SECS] [-o OPTS]");
        std::process::exit(2);
    };
    let mut cfg = MountConfig::new(&image, &mnt);
    let value = |args: &mut dyn Iterator<Item = String>, what: &str| args.next().unwrap_or_else(|| panic!("{what} needs a value"));
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mkfs" => {
                let size: u64 = value(&mut args, "--mkfs").parse().expect("--mkfs BYTES");
                let dev = FileDevice::create(&image, size).expect("create image");
                FileSystem::mkfs(&dev, &MkfsOptions::default()).expect("mkfs");
            }
            "--threads" => cfg.threads = value(&mut args, "--threads").parse().expect("--threads N"),
            "--ro" => cfg.read_only = true,
            "--writeback" => cfg.writeback_cache = true,
            "--no-default-permissions" => cfg.default_permissions = false,
            "--allow-other" => cfg.allow_other = true,
            "--timeout" => {
                let t = Duration::from_secs_f64(value(&mut args, "--timeout").parse().expect("--timeout SECS"));
                (cfg.entry_timeout, cfg.attr_timeout) = (t, t);
            }
            "-o" => cfg.options.push(value(&mut args, "-o")),
            other => panic!("unknown argument {other}"),
        }
    }
    if let Err(e) = ferrofs_fuse::mount(&cfg) {
        eprintln!("mount: {e}");
        std::process::exit(1);
    }
}

use super::attr::{request_time, system_time, timespec};
use super::*;
use ferrofs::dev::MemDevice;
use ferrofs::Timespec;
use ferrofs::{MkfsOptions, MountOptions};
use std::time::UNIX_EPOCH;

fn adapter() -> FerroFuse {
    let dev = Arc::new(MemDevice::new(64 << 20));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev, &MountOptions::default()).unwrap();
    FerroFuse::new(Arc::new(fs), &MountConfig::new("image", "mnt")).unwrap()
}

#[test]
fn engine_errors_become_errnos() {
    let a = adapter();
    assert_eq!(a.call("lookup", |fs| fs.lookup(1, b"missing")).unwrap_err(), Errno::ENOENT);
    assert_eq!(a.call("lookup", |fs| fs.lookup(1, &[b'n'; 256])).unwrap_err(), Errno::ENAMETOOLONG);
    assert_eq!(a.call("getattr", |fs| fs.getattr(999_999)).unwrap_err(), Errno::ESTALE);
}

#[test]
fn a_panicking_engine_call_fails_with_eio_and_stops_changes() {
    let a = adapter();
    let res: Res<()> = a.call("test", |_| panic!("engine bug"));
    assert_eq!(res.unwrap_err(), Errno::EIO);
    // Reads still work; changes are refused from now on.
    assert!(a.call("getattr", |fs| fs.getattr(1)).is_ok());
    assert_eq!(a.call("mkdir", |fs| fs.mkdir(1, b"d", 0o755, Cred::default())).unwrap_err(), Errno::EIO);
}

#[test]
fn times_round_trip_including_before_1970() {
    for t in [
        Timespec { sec: 0, nsec: 0 },
        Timespec { sec: 1_700_000_000, nsec: 999_999_999 },
        Timespec { sec: -1, nsec: 500_000_000 },
        Timespec { sec: -86_400, nsec: 0 },
    ] {
        assert_eq!(timespec(system_time(t)), t);
    }
    // Out of range for SystemTime: clamped, not a panic.
    let _ = system_time(Timespec { sec: i64::MAX, nsec: u32::MAX });
    let _ = system_time(Timespec { sec: i64::MIN, nsec: 0 });
}

#[test]
fn request_times_before_1970_keep_their_nanoseconds() {
    // What fuser 0.18 hands us for the kernel's (sec, nsec): see `request_time`.
    let fuser_decoded = |sec: i64, nsec: u32| {
        if sec >= 0 {
            UNIX_EPOCH + Duration::new(sec as u64, nsec)
        } else {
            UNIX_EPOCH - Duration::new(sec.unsigned_abs(), nsec)
        }
    };
    for (sec, nsec) in [(-86_400i64, 999_999_999u32), (-1, 1), (-1, 0), (-5, 500_000_000), (0, 7), (1_700_000_000, 123)]
    {
        assert_eq!(request_time(fuser_decoded(sec, nsec)), Timespec { sec, nsec });
    }
}

#[test]
fn mode_bits_keep_the_type_and_permission_bits() {
    assert_eq!(mode_bits(libc::S_IFREG | 0o666), (libc::S_IFREG | 0o666) as u16);
    assert_eq!(mode_bits(libc::S_IFCHR | 0o4777), (libc::S_IFCHR | 0o4777) as u16);
    assert_eq!(mode_bits(0o2777 | 0o1_000_000), 0o2777);
}

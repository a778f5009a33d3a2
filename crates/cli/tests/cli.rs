//! The `ferrofs` binary as a user runs it: exit codes, messages, and what it leaves behind.

use std::path::PathBuf;
use std::process::{Command, Output};

#[path = "common/clean_failure.rs"]
mod clean_failure;
use clean_failure::assert_clean_failure;

fn ferrofs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrofs")).args(args).output().expect("run ferrofs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh scratch directory per test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ferrofs-cli-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn mkfs_makes_sparse_image_and_refuses_to_overwrite_it() {
    let s = Scratch::new("mkfs");
    let img = s.path("a.img");
    let o = ferrofs(&["mkfs", &img, "--size", "64M", "--ags", "4", "--bytes-per-inode", "4K"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("4 x 4,096 blocks"), "{}", stdout(&o));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    assert_clean_failure(&ferrofs(&["mkfs", &img]), "use --force");
    assert!(ferrofs(&["mkfs", &img, "--force"]).status.success());
}

#[test]
fn mkfs_rejects_bad_sizes_without_panicking() {
    let s = Scratch::new("sizes");
    assert_clean_failure(&ferrofs(&["mkfs", &s.path("tiny.img"), "--size", "100K"]), "too small");
    let o = ferrofs(&["mkfs", &s.path("q.img"), "--size", "12Q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown size suffix"));
}

#[test]
fn info_reports_free_counts_as_json() {
    let s = Scratch::new("info");
    let img = s.path("a.img");
    assert!(ferrofs(&["mkfs", &img, "--size", "64M", "--ags", "4"]).status.success());
    let o = ferrofs(&["info", &img, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["ag_count"], 4);
    assert_eq!(v["ags"].as_array().unwrap().len(), 4);
    // Inode 0 is never used and inode 1 is the root.
    assert_eq!(v["free_inodes"].as_u64().unwrap(), v["total_inodes"].as_u64().unwrap() - 2);
    assert_eq!(v["log_records_pending"], 0);
    assert!(stdout(&ferrofs(&["info", &img])).contains("log                clean"));
}

/// The identity as `info --json` shows it: (uuid, label).
fn identity(img: &str) -> (String, String) {
    let o = ferrofs(&["info", img, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    (v["uuid"].as_str().unwrap().to_string(), v["label"].as_str().unwrap().to_string())
}

#[test]
fn mkfs_and_tune_set_the_label_and_uuid() {
    let s = Scratch::new("identity");
    let (a, b) = (s.path("a.img"), s.path("b.img"));
    let given = "0b5e6c1a-8f3d-4e2b-9a47-1c2d3e4f5a6b";
    let o = ferrofs(&["mkfs", &a, "--size", "64M", "-L", "backups", "-U", given]);
    assert!(o.status.success() && stdout(&o).contains("label              \"backups\""), "{}", stdout(&o));
    assert_eq!(identity(&a), (given.to_string(), "backups".to_string()));
    // By default a random version 4 UUID: no two images share a prefix.
    assert!(ferrofs(&["mkfs", &b, "--size", "64M"]).status.success());
    let (uuid_b, label_b) = identity(&b);
    assert_eq!((&uuid_b[14..15], label_b.as_str()), ("4", ""), "{uuid_b}");
    assert!(ferrofs(&["mkfs", &b, "--size", "64M", "--force"]).status.success());
    assert_ne!(identity(&b).0[..8], uuid_b[..8]);
    // tune changes what it is given and nothing else; the image stays clean.
    let o = ferrofs(&["tune", &a, "-L", "archive"]);
    assert!(o.status.success() && stdout(&o).contains(&format!("label \"archive\", uuid {given}")), "{}", stdout(&o));
    let o = ferrofs(&["tune", &a, "--uuid", "random", "--label", ""]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (uuid, label) = identity(&a);
    assert!(uuid != given && label.is_empty(), "{uuid} {label:?}");
    assert!(stdout(&ferrofs(&["info", &a])).contains("label              (none)"));
    assert_eq!(ferrofs(&["fsck", "-n", &a]).status.code(), Some(0));
    // Bad values are named; nothing changes.
    let o = ferrofs(&["tune", &a, "-L", &"x".repeat(33)]);
    assert!(o.status.code() == Some(2) && stderr(&o).contains("label longer than 32 bytes"), "{}", stderr(&o));
    let o = ferrofs(&["mkfs", &b, "--force", "-U", "0b5e6c1a-8f3d"]);
    assert!(o.status.code() == Some(2) && stderr(&o).contains("--uuid"), "{}", stderr(&o));
    assert_eq!(identity(&a), (uuid, label));
    std::fs::write(s.path("zeros.img"), vec![0u8; 1 << 20]).unwrap();
    assert_clean_failure(&ferrofs(&["tune", &s.path("zeros.img"), "-L", "x"]), "not a ferrofs image");
    // Copies that disagree with the primary are fsck's to settle first, and tune says so.
    use ferrofs::dev::{BlockDevice, FileDevice};
    let dev = FileDevice::open(&a, false).unwrap();
    let sb = ferrofs::read_superblock(&dev).unwrap();
    let copy = sb.geo.ag_layout(1).start;
    let stale = ferrofs::Superblock { label: "stale".into(), ..sb.clone() };
    dev.write_at(&stale.encode(copy)[..], copy * ferrofs::BLOCK_SIZE as u64).unwrap();
    drop(dev);
    assert_clean_failure(&ferrofs(&["tune", &a, "-L", "x"]), "differs from the primary (`ferrofs fsck -y` repairs");
    assert_eq!(ferrofs(&["fsck", "-y", &a]).status.code(), Some(1));
    assert!(ferrofs(&["tune", &a, "-L", "x"]).status.success());
    assert_eq!(identity(&a).1, "x");
    assert_eq!(ferrofs(&["fsck", "-n", &a]).status.code(), Some(0));
}

/// A man page as groff lays it out (its warnings turned on: a page with any is a bug), each
/// line's justified spacing collapsed; or, where groff is missing, its source checked to be
/// a man page.
fn render_man_page(page: &std::path::Path) -> String {
    let source = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let Ok(o) = Command::new("groff").args(["-t", "-man", "-Tascii", "-ww", "-P-cbou"]).arg(page).output() else {
        eprintln!("groff not installed: checking the source of {} only", page.display());
        assert!(source.starts_with(".ie \\n(.g .ds Aq") || source.contains("\n.TH "), "{source}");
        return source.replace("\\-", "-");
    };
    assert!(o.status.success() && o.stderr.is_empty(), "{}: {}", page.display(), stderr(&o));
    stdout(&o).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") + "\n").collect()
}

/// The man pages and completions come from the clap definition: every subcommand that
/// `ferrofs --help` lists, new ones included, gets a page that renders and a place in the
/// bash, zsh and fish completions, installed where those look for them.
#[test]
fn install_docs_gives_every_subcommand_a_page_and_completions() {
    let s = Scratch::new("docs");
    let prefix = s.path("usr");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/install-docs.sh");
    let o = Command::new(script).args([env!("CARGO_BIN_EXE_ferrofs"), &prefix]).output().unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let help = stdout(&ferrofs(&["--help"]));
    let subcommands: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(subcommands.len() >= 8 && subcommands.contains(&"tune"), "{help}");
    let share = PathBuf::from(&prefix).join("share");
    let top = render_man_page(&share.join("man/man8/ferrofs.8"));
    let read = |path: &str| std::fs::read_to_string(share.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (bash, zsh, fish) = (
        read("bash-completion/completions/ferrofs"),
        read("zsh/site-functions/_ferrofs"),
        read("fish/vendor_completions.d/ferrofs.fish"),
    );
    for name in &subcommands {
        let page = render_man_page(&share.join(format!("man/man8/ferrofs-{name}.8")));
        assert!(page.contains(&format!("ferrofs-{name} - ")), "NAME of ferrofs-{name}:\n{page}");
        assert!(page.contains(&format!("ferrofs {name} ")), "SYNOPSIS of ferrofs-{name}:\n{page}");
        assert!(top.contains(&format!("ferrofs-{name}(8)")), "ferrofs(8) does not list {name}:\n{top}");
        assert!(bash.contains(&format!("ferrofs,{name})")), "bash completion lacks {name}");
        assert!(zsh.contains(&format!("'{name}:")), "zsh completion lacks {name}");
        assert!(fish.contains(&format!("-a \"{name}\"")), "fish completion lacks {name}");
    }
    let pages = std::fs::read_dir(share.join("man/man8")).unwrap().count();
    assert_eq!(pages, subcommands.len() + 1, "one page per subcommand and ferrofs(8), no others");
    // Options come along too: tune's page has -L and -U.
    let tune = render_man_page(&share.join("man/man8/ferrofs-tune.8"));
    assert!(tune.contains("-L, --label") && tune.contains("-U, --uuid"), "{tune}");
}

/// An image left with an orphan (a file unlinked while open, then a crash): `info` counts it
/// as pending on disk, and shows the free counts a mount will have once it is freed (its
/// read-only mount frees it in memory).
#[test]
fn info_counts_pending_orphans() {
    use ferrofs::dev::{BlockDevice, MemDevice};
    use ferrofs::{Cred, FileSystem, MkfsOptions, MountOptions};
    use std::sync::Arc;
    let s = Scratch::new("orphan-info");
    let img = s.path("a.img");
    let dev = Arc::new(MemDevice::new(64 << 20));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    let f = fs.create(1, b"f", 0o644, Cred { uid: 0, gid: 0, umask: 0 }).unwrap().ino;
    fs.write(f, 0, &vec![7u8; 1 << 20]).unwrap();
    fs.open(f).unwrap();
    fs.unlink(1, b"f").unwrap();
    fs.sync().unwrap();
    let mut image = vec![0u8; dev.size() as usize];
    dev.read_at(&mut image, 0).unwrap();
    std::mem::forget(fs); // the crash, with the file still open
    std::fs::write(&img, image).unwrap();
    let o = ferrofs(&["info", &img, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let pending: u64 = v["ags"].as_array().unwrap().iter().map(|a| a["orphans"].as_u64().unwrap()).sum();
    assert_eq!(pending, 1, "{v}");
    assert_eq!(v["free_inodes"].as_u64().unwrap(), v["total_inodes"].as_u64().unwrap() - 2, "{v}");
}

#[test]
fn info_and_fsck_fail_cleanly_on_missing_and_foreign_images() {
    let s = Scratch::new("foreign");
    let junk = s.path("junk");
    std::fs::write(&junk, vec![0xa5u8; 1 << 20]).unwrap();
    assert_clean_failure(&ferrofs(&["info", &s.path("none.img")]), "No such file");
    assert_clean_failure(&ferrofs(&["info", &junk]), "not a ferrofs image (found: no known signature)");
    let o = ferrofs(&["fsck", &junk]);
    assert_eq!(o.status.code(), Some(8));
    assert_clean_failure(&o, "not a ferrofs image (found: no known signature)");
}

/// Run a tool that writes a signature into `img`; false (with a note) if it is not installed.
fn tool(cmd: &[&str], stdin: &str) -> bool {
    use std::io::Write;
    let mut child = match Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("SKIPPED: {} is not installed", cmd[0]);
            return false;
        }
        Err(e) => panic!("{}: {e}", cmd[0]),
    };
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "{cmd:?}");
    true
}

/// A sparse image holding what `cmd` wrote, or None where that tool is missing.
fn foreign_image(s: &Scratch, name: &str, cmd: &[&str], stdin: &str) -> Option<String> {
    let img = s.path(name);
    // mkfs.xfs needs 300 MiB at least.
    std::fs::File::create(&img).unwrap().set_len(320 << 20).unwrap();
    let cmd: Vec<&str> = cmd.iter().map(|a| if *a == "IMG" { img.as_str() } else { a }).collect();
    tool(&cmd, stdin).then_some(img)
}

/// Each maker of a signature mkfs must not overwrite unasked, and what mkfs then says.
const FOREIGN: [(&str, &[&str], &str, &str); 6] = [
    ("ext4", &["mkfs.ext4", "-q", "-F", "IMG"], "", "an ext4 file system"),
    ("xfs", &["mkfs.xfs", "-q", "-f", "IMG"], "", "an xfs file system"),
    ("swap", &["mkswap", "-q", "IMG"], "", "a swap signature"),
    ("gpt", &["sfdisk", "-q", "IMG"], "label: gpt\n,10M\n", "a gpt partition table"),
    ("mbr", &["sfdisk", "-q", "IMG"], "label: dos\n,10M\n", "a dos partition table"),
    ("ferrofs", &[env!("CARGO_BIN_EXE_ferrofs"), "mkfs", "--force", "IMG"], "", "a ferrofs file system"),
];

#[test]
fn mkfs_refuses_to_overwrite_what_it_finds_unless_forced() {
    let s = Scratch::new("mkfs-foreign");
    for (name, cmd, stdin, found) in FOREIGN {
        let Some(img) = foreign_image(&s, name, cmd, stdin) else { continue };
        let before = std::fs::read(&img).unwrap();
        assert_clean_failure(&ferrofs(&["mkfs", &img]), &format!("{img} contains {found}"));
        assert_clean_failure(&ferrofs(&["mkfs", &img]), "use --force to overwrite it");
        assert!(std::fs::read(&img).unwrap() == before, "{name}: refused, yet the image changed");
        let forced = ferrofs(&["mkfs", &img, "--force"]);
        assert!(forced.status.success(), "{name}: {}", stderr(&forced));
        assert_eq!(ferrofs(&["fsck", "-n", &img]).status.code(), Some(0), "{name}");
    }
}

#[test]
fn mount_fsck_and_info_name_what_a_foreign_image_holds() {
    let s = Scratch::new("not-ferrofs");
    let mnt = s.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let zeros = s.path("zeros.img");
    std::fs::File::create(&zeros).unwrap().set_len(8 << 20).unwrap();
    let tarball = s.path("a.tar");
    assert!(tool(&["tar", "-cf", &tarball, "-C", env!("CARGO_MANIFEST_DIR"), "Cargo.toml"], ""));
    let mut images = vec![(zeros, "nothing but zeros"), (tarball, "no known signature")];
    for (name, cmd, stdin, found) in &FOREIGN[..5] {
        images.extend(foreign_image(&s, name, cmd, stdin).map(|img| (img, *found)));
    }
    for (img, found) in &images {
        let why = format!("{img}: not a ferrofs image (found: {found})");
        assert_clean_failure(&ferrofs(&["info", img]), &why);
        let checked = ferrofs(&["fsck", "-y", img]);
        assert_eq!(checked.status.code(), Some(8), "{img}");
        assert_clean_failure(&checked, &why);
        // Refused before anything is mounted: this needs no FUSE.
        assert_clean_failure(&ferrofs(&["mount", img, &mnt]), &why);
    }
}

/// `mount --mkfs` makes a file system only where there is no image yet.
#[test]
fn mount_mkfs_never_overwrites_an_existing_image() {
    let s = Scratch::new("mount-mkfs");
    let mnt = s.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(img) = foreign_image(&s, "ext4", FOREIGN[0].1, "") else { return };
    let before = std::fs::read(&img).unwrap();
    let o = ferrofs(&["mount", "--mkfs", "64M", &img, &mnt]);
    assert_clean_failure(&o, "not a ferrofs image (found: an ext4 file system)");
    assert!(std::fs::read(&img).unwrap() == before, "the ext4 image was changed");
}

/// A ferrofs image whose superblock fails its checksum (and has no backup: one AG) is still
/// reported as a corrupt ferrofs superblock, not as a foreign image.
#[test]
fn a_damaged_ferrofs_superblock_is_reported_as_corrupt() {
    let s = Scratch::new("bad-sb");
    let img = s.path("a.img");
    assert!(ferrofs(&["mkfs", &img, "--size", "4M", "--ags", "1"]).status.success());
    corrupt_byte(&img, 100);
    assert_clean_failure(&ferrofs(&["info", &img]), "corrupt superblock at block 0: checksum mismatch");
    assert_clean_failure(&ferrofs(&["fsck", &img]), "corrupt superblock at block 0: checksum mismatch");
    assert_clean_failure(&ferrofs(&["mkfs", &img]), "contains a ferrofs file system whose superblock does not verify");
}

#[test]
fn fsck_exit_codes_follow_e2fsck() {
    let s = Scratch::new("fsck");
    let img = s.path("a.img");
    assert!(ferrofs(&["mkfs", &img, "--size", "64M", "--ags", "4"]).status.success());
    assert_eq!(ferrofs(&["fsck", &img]).status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&ferrofs(&["info", &img, "--json"]).stdout).unwrap();
    corrupt_byte(&img, v["ags"][1]["block_bitmap"].as_u64().unwrap() * 4096 + 4000);
    let checked = ferrofs(&["fsck", "-n", &img]);
    assert_eq!(checked.status.code(), Some(4), "{}", stdout(&checked));
    assert!(stdout(&checked).contains("NOT fixed"));
    assert_eq!(ferrofs(&["fsck", "-y", &img]).status.code(), Some(1));
    assert_eq!(ferrofs(&["fsck", "-n", &img]).status.code(), Some(0));
}

/// Random bytes over the root inode used to leave `fsck -y` at "NOT fixed" (exit 4). Now the
/// root is recreated and what it held reconnected under /lost+found: `fsck -y` exits 1, then
/// `fsck -n` 0, and the file below it is intact.
#[test]
fn fsck_y_repairs_a_damaged_root_inode() {
    use ferrofs::dev::{BlockDevice, FileDevice};
    use ferrofs::{Cred, FileSystem, MountOptions};
    use std::sync::Arc;
    let s = Scratch::new("fsck-root");
    let img = s.path("r.img");
    assert!(ferrofs(&["mkfs", &img, "--size", "64M"]).status.success());
    let cred = Cred { uid: 0, gid: 0, umask: 0 };
    let open = || -> Arc<dyn BlockDevice> { Arc::new(FileDevice::open(&img, false).unwrap()) };
    let fs = FileSystem::mount_device(open(), &MountOptions::default()).unwrap();
    let d = fs.create_dir_all("/d", 0o755, cred).unwrap().ino;
    fs.write_file("/d/f", b"kept", cred).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let dev = open();
    let root_at = ferrofs::read_superblock(&*dev).unwrap().geo.inode_offset(1).unwrap();
    let noise: Vec<u8> = (0..256u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    dev.write_at(&noise, root_at).unwrap();
    dev.flush().unwrap();
    drop(dev);
    assert_eq!(ferrofs(&["fsck", "-n", &img]).status.code(), Some(4));
    let fixed = ferrofs(&["fsck", "-y", &img]);
    assert_eq!(fixed.status.code(), Some(1), "{}", stdout(&fixed));
    assert!(stdout(&fixed).contains("recreated empty"), "{}", stdout(&fixed));
    let checked = ferrofs(&["fsck", "-n", &img]);
    assert_eq!(checked.status.code(), Some(0), "{}", stdout(&checked));
    let fs = FileSystem::mount_device(open(), &MountOptions::default()).unwrap();
    let f = fs.resolve(&format!("/lost+found/#{d}/f")).unwrap();
    assert_eq!(fs.read(f.ino, 0, 100).unwrap(), b"kept");
    fs.unmount().unwrap();
}

fn corrupt_byte(path: &str, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[!b[0]], offset).unwrap();
}

/// `ferrofs` alone in a directory of its own (hard-linked, so that it finds its neighbours
/// there), with PATH naming only `path_dir`.
fn ferrofs_alone(dir: &std::path::Path, path_dir: &std::path::Path, args: &[&str]) -> Output {
    let exe = dir.join("ferrofs");
    if !exe.exists() {
        std::fs::hard_link(env!("CARGO_BIN_EXE_ferrofs"), &exe).expect("link ferrofs");
    }
    Command::new(&exe).args(args).env("PATH", path_dir).output().expect("run ferrofs")
}

/// A scratch directory beside the test binaries (hard links need the same file system).
fn target_scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn bench_without_ferrofs_bench_names_what_to_build() {
    let dir = target_scratch("bench-missing");
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = ferrofs_alone(&dir, &empty, &["bench", "--help"]);
    assert_clean_failure(&o, "ferrofs-bench not found");
    assert!(stderr(&o).contains("cargo build --release -p ferrofs-bench"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `ferrofs bench ARGS` runs `ferrofs-bench ARGS` (next to it, else on PATH): every argument,
/// `--help` included, reaches it as given, and its exit status is the command's.
#[test]
fn bench_runs_ferrofs_bench_with_its_arguments() {
    use std::os::unix::fs::PermissionsExt;
    let dir = target_scratch("bench-delegates");
    let (beside, on_path) = (dir.join("beside"), dir.join("on-path"));
    for (script_dir, path_dir) in [(&beside, &on_path), (&on_path, &on_path)] {
        let _ = std::fs::remove_dir_all(&beside);
        let _ = std::fs::remove_dir_all(&on_path);
        std::fs::create_dir(&beside).unwrap();
        std::fs::create_dir(&on_path).unwrap();
        let script = script_dir.join("ferrofs-bench");
        std::fs::write(&script, "#!/bin/sh\nprintf '%s\\n' \"$@\"\nexit 3\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let o = ferrofs_alone(&beside, path_dir, &["bench", "fsmark", "--help", "--threads", "1,2", "-x"]);
        assert_eq!(o.status.code(), Some(3), "{} {}", script.display(), stderr(&o));
        assert_eq!(stdout(&o), "fsmark\n--help\n--threads\n1,2\n-x\n", "{}", script.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Offline `ferrofs trim IMAGE`: after files are deleted (with a log left to replay), the
/// image's allocated size shrinks, the files kept read back intact and fsck finds it clean.
#[test]
fn trim_gives_an_images_free_space_back() {
    use ferrofs::{dev::FileDevice, Cred, FileSystem, MountOptions};
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;
    let s = Scratch::new("trim");
    let img = s.path("a.img");
    assert!(ferrofs(&["mkfs", &img, "--size", "128M"]).status.success());
    let pattern =
        |seed: u8| (0..1 << 20).map(|i: u32| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect::<Vec<u8>>();
    let me = Cred { uid: 0, gid: 0, umask: 0 };
    let mount = || {
        FileSystem::mount_device(Arc::new(FileDevice::open(&img, false).unwrap()), &MountOptions::default()).unwrap()
    };
    let fs = mount();
    for i in 0..24u8 {
        fs.write_file(&format!("/f{i}"), &pattern(i), me).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount();
    for i in 8..24u8 {
        fs.unlink(ferrofs::ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    // A copy taken while mounted is what a crash would leave: the unlinks in the log only.
    let crashed = s.path("crashed.img");
    assert!(Command::new("cp").args(["--sparse=always", &img, &crashed]).status().unwrap().success());
    drop(fs);
    let img = crashed;
    let sectors = || std::fs::metadata(&img).unwrap().blocks();
    let full = sectors();
    let ro = MountOptions { read_only: true, ..MountOptions::default() };
    let replayed = FileSystem::mount_device(Arc::new(FileDevice::open(&img, true).unwrap()), &ro)
        .unwrap()
        .info()
        .log_records_replayed;
    assert!(replayed > 0, "the copy has a log to replay");
    let o = ferrofs(&["trim", "-v", &img]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("trimmed in"), "{}", stdout(&o));
    assert!(full.saturating_sub(sectors()) >= 15 << 11, "{full} sectors before, {} after", sectors());
    let o = ferrofs(&["fsck", "-n", &img]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let fs =
        FileSystem::mount_device(Arc::new(FileDevice::open(&img, false).unwrap()), &MountOptions::default()).unwrap();
    assert_eq!(fs.info().log_records_replayed, 0, "the trim replayed the log");
    for i in 0..8u8 {
        let ino = fs.resolve(&format!("/f{i}")).unwrap().ino;
        assert!(fs.read(ino, 0, 1 << 20).unwrap() == pattern(i), "f{i} changed");
    }
}

#[test]
fn trim_names_a_bad_argument() {
    let s = Scratch::new("trim-bad");
    assert_clean_failure(&ferrofs(&["trim", &s.path("missing.img")]), "No such file");
    std::fs::write(s.path("zeros.img"), vec![0u8; 1 << 20]).unwrap();
    assert_clean_failure(&ferrofs(&["trim", &s.path("zeros.img")]), "not a ferrofs image");
    let o = ferrofs(&["trim", "-m", "lots", &s.path("zeros.img")]);
    assert_eq!(o.status.code(), Some(2), "clap's usage error");
}

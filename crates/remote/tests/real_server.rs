//! Publish, read back and collect against a real S3-compatible server on localhost
//! (`scripts/s3-server.sh`: versitygw), so that signing, conditional writes and the server's
//! error answers are what a user meets. Skips, saying why, where the server cannot be had.

use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::{Cred, FileSystem, MkfsOptions, MountOptions};
use ferrofs_remote::gc::gc;
use ferrofs_remote::manifest::ChunkRef;
use ferrofs_remote::publish::publish;
use ferrofs_remote::{Remote, RemoteError, RemoteOptions};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A server started for this test, stopped (its objects deleted) when dropped.
struct Server {
    state: PathBuf,
    vars: HashMap<String, String>,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-server.sh")
}

impl Server {
    /// None (after saying why) when the script reports the server cannot be had.
    fn start() -> Option<Server> {
        let state = std::env::temp_dir().join(format!("ferrofs-remote-test-{}", std::process::id()));
        let out = Command::new(script()).arg("start").arg(&state).output().expect("run s3-server.sh");
        if out.status.code() == Some(2) {
            eprintln!("SKIPPED: no S3 test server: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        assert!(out.status.success(), "s3-server.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let vars = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        Some(Server { state, vars })
    }

    fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.vars["S3_BUCKET"])
    }

    fn options(&self) -> RemoteOptions {
        RemoteOptions { endpoint: Some(self.vars["S3_ENDPOINT"].clone()) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.state).status();
    }
}

fn reassemble(remote: &Remote) -> Vec<u8> {
    let manifest = remote.manifest(remote.head().unwrap().unwrap()).unwrap();
    let mut image = Vec::new();
    for (index, chunk) in manifest.chunks.iter().enumerate() {
        match chunk {
            ChunkRef::Zero => image.resize(image.len() + manifest.chunk_len(index as u64) as usize, 0),
            ChunkRef::Stored(hash) => image.extend_from_slice(&remote.get_chunk(hash).unwrap()),
        }
    }
    image
}

fn bytes_of(dev: &dyn BlockDevice) -> Vec<u8> {
    let mut bytes = vec![0; dev.size() as usize];
    dev.read_at(&mut bytes, 0).unwrap();
    bytes
}

#[test]
fn publish_round_trip_on_a_real_server() {
    let Some(server) = Server::start() else { return };
    // The credentials the server was started with, the standard way.
    for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
        std::env::set_var(key, &server.vars[key]);
    }
    let remote = Remote::open(&server.url("images/one"), &server.options()).unwrap();
    assert_eq!(remote.head().unwrap(), None);

    let dev = std::sync::Arc::new(MemDevice::new(64 << 20));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let root = Cred { uid: 0, gid: 0 };
    let mut stale_head = None;
    for round in 0..3u8 {
        if round == 2 {
            stale_head = remote.head_versioned().unwrap().map(|(_, version)| version);
        }
        let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
        fs.write_file(&format!("/f{round}"), &vec![round + 1; 700_000], root).unwrap();
        fs.unmount().unwrap();
        let report = publish(&remote, &*dev, 256 << 10).unwrap();
        assert_eq!(report.generation, u64::from(round) + 1);
        assert!(reassemble(&remote) == bytes_of(&*dev), "round {round}: the image read back differs");
    }
    // Conditional writes are refused by the server itself: HEAD as it was before round 3.
    let stale = stale_head.expect("HEAD read before the last round");
    let late = remote.put(&remote.head_key(), "00000000000000000002".into(), object_store::PutMode::Update(stale));
    assert!(matches!(late, Err(RemoteError::Conflict(_))), "{late:?}");
    assert_eq!(remote.head().unwrap(), Some(3));
    let taken = remote.put(&remote.manifest_key(1), "x".into(), object_store::PutMode::Create);
    assert!(matches!(taken, Err(RemoteError::Conflict(_))), "{taken:?}");

    let report = gc(&remote, 1, Duration::ZERO).unwrap();
    assert_eq!(report.kept, vec![3]);
    assert_eq!(report.manifests_deleted, 2);
    assert!(report.chunks_deleted > 0, "{report:?}");
    assert!(reassemble(&remote) == bytes_of(&*dev), "gc took a chunk of the kept generation");

    // The errors a user meets, one line each.
    let missing = Remote::open("s3://no-such-bucket/x", &server.options()).unwrap_err();
    assert!(matches!(missing, RemoteError::NoBucket(_)), "{missing}");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "wrong");
    let refused = Remote::open(&server.url("images/one"), &server.options()).unwrap_err();
    assert!(matches!(refused, RemoteError::Credentials(_)), "{refused}");
    assert!(!refused.to_string().contains('\n'));
}

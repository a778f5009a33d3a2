//! A published image's store: an object store and the prefix under which the image lives.
//!
//! Keys under the prefix P (docs/SPEC.md, "Published images"): chunks at
//! `P/chunks/<64 lowercase hex of the SHA-256 of the chunk>`, the manifest of generation G at
//! `P/manifests/<G in 20 zero-padded digits>`, and the pointer `P/HEAD` holding the current
//! generation in the same 20 digits.
//!
//! object_store is async; [`Remote`] runs it on one small runtime owned by this crate and offers
//! a blocking API, so that callers (the CLI, the FUSE daemon's threads) need no runtime of their
//! own. Its methods must therefore not be called from inside a tokio runtime.

use crate::manifest::{Manifest, ManifestError};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, RetryConfig,
    UpdateVersion,
};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How to reach the store beyond what the URL says.
#[derive(Clone, Debug, Default)]
pub struct RemoteOptions {
    /// The S3 endpoint (`http://127.0.0.1:7070`) of an S3-compatible server; when unset,
    /// `AWS_ENDPOINT_URL`, else AWS itself.
    pub endpoint: Option<String>,
}

/// Why an operation on the store failed; each displays as one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The URL is not `s3://bucket/prefix` or `memory://name/prefix`.
    #[error("bad store URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store refused the credentials.
    #[error(
        "the store refused the credentials ({0}); check AWS_ACCESS_KEY_ID, \
         AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials"
    )]
    Credentials(String),
    /// The bucket does not exist.
    #[error("bucket {0:?} does not exist")]
    NoBucket(String),
    /// The endpoint could not be reached after the bounded retries.
    #[error("cannot reach the object store at {endpoint}: {detail}")]
    Unreachable {
        /// The endpoint tried.
        endpoint: String,
        /// The transport's reason.
        detail: String,
    },
    /// An object the image needs is missing.
    #[error("{0} is missing from the store")]
    NotFound(String),
    /// A manifest is damaged or inconsistent.
    #[error("manifest of generation {generation} is unusable: {error}")]
    Manifest {
        /// The generation whose manifest was read.
        generation: u64,
        /// What is wrong with it.
        error: ManifestError,
    },
    /// A chunk's bytes do not hash to its key.
    #[error("chunk {0} does not match its hash: the object is damaged")]
    ChunkHash(String),
    /// `HEAD` holds something other than a generation number.
    #[error("{key} holds {content:?}, not a generation number")]
    BadHead {
        /// The key of HEAD.
        key: String,
        /// Its first bytes.
        content: String,
    },
    /// A create-only or conditional write found another writer's object first.
    #[error("{0}")]
    Conflict(String),
    /// Any other failure of the store, with the operation and key.
    #[error("{operation} {key}: {detail}")]
    Store {
        /// What was being done.
        operation: &'static str,
        /// On which key.
        key: String,
        /// The store's reason, on one line.
        detail: String,
    },
}

/// Connections give up after this long, so a dead endpoint fails in seconds, not minutes.
const CONNECT_TIMEOUT: &str = "5s";
/// One request gives up after this long (a 64 MiB chunk on a slow link still fits).
const REQUEST_TIMEOUT: &str = "120s";
/// Retries of one request (object_store retries connection errors and 5xx with backoff).
const RETRIES_MAX: usize = 3;
/// All retries of one request stop after this long.
const RETRY_TIMEOUT: Duration = Duration::from_secs(15);
/// Worker threads of the runtime that drives every store: the work is waiting on the network.
const RUNTIME_THREADS: usize = 2;

/// The runtime that drives every store's requests, started on first use.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("ferrofs-remote")
            .enable_all()
            .build()
            .expect("the object store runtime starts")
    })
}

/// The in-memory stores `memory://NAME/...` names, shared by every open in this process.
fn memory_stores() -> &'static Mutex<HashMap<String, Arc<InMemory>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// A published image's place: an object store and a prefix within it.
#[derive(Clone, Debug)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// What errors name as the endpoint.
    endpoint: String,
    /// What errors name as the bucket.
    bucket: String,
}

impl Remote {
    /// Opens `s3://bucket/prefix` or `memory://name/prefix` and checks that the store answers
    /// (one LIST request), so that bad credentials, a missing bucket or a dead endpoint are
    /// reported here in one line.
    pub fn open(url: &str, options: &RemoteOptions) -> Result<Remote, RemoteError> {
        let bad_url = |reason: &str| RemoteError::BadUrl { url: url.to_string(), reason: reason.to_string() };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad_url("expected s3://bucket/prefix"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad_url("no bucket"));
        }
        let prefix =
            Path::parse(prefix.trim_end_matches('/')).map_err(|error| bad_url(&format!("bad prefix: {error}")))?;
        let remote = match scheme {
            "s3" => {
                let (store, endpoint) = s3_store(bucket, options).map_err(|error| bad_url(&error.to_string()))?;
                Remote { store, prefix, endpoint, bucket: bucket.to_string() }
            }
            "memory" => {
                let store = memory_stores()
                    .lock()
                    .expect("memory store registry")
                    .entry(bucket.to_string())
                    .or_default()
                    .clone();
                Remote::with_store(store, prefix)
            }
            _ => return Err(bad_url("the scheme must be s3:// (or memory:// for tests)")),
        };
        remote.probe()?;
        Ok(remote)
    }

    /// A new, empty in-memory store with an empty prefix; clone it to share it between a
    /// publisher and a reader in a test.
    pub fn memory() -> Remote {
        Remote::with_store(Arc::new(InMemory::new()), Path::default())
    }

    /// A remote over any object store (tests wrap one to inject faults).
    pub fn with_store(store: Arc<dyn ObjectStore>, prefix: Path) -> Remote {
        let endpoint = store.to_string();
        Remote { store, prefix, endpoint, bucket: String::new() }
    }

    /// The object store under this remote.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Runs `future` (object_store requests) to completion on this crate's runtime; for
    /// callers that want many requests in flight. Not to be called from inside a runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        runtime().block_on(future)
    }

    /// The key of the chunk whose SHA-256 is `hash`.
    pub fn chunk_key(&self, hash: &[u8; 32]) -> Path {
        self.chunks_dir().join(hex(hash))
    }

    /// The key of generation `generation`'s manifest.
    pub fn manifest_key(&self, generation: u64) -> Path {
        self.manifests_dir().join(generation_name(generation))
    }

    /// The key of the pointer to the current generation.
    pub fn head_key(&self) -> Path {
        self.prefix.clone().join("HEAD")
    }

    /// The folder of the chunks.
    pub fn chunks_dir(&self) -> Path {
        self.prefix.clone().join("chunks")
    }

    /// The folder of the manifests.
    pub fn manifests_dir(&self) -> Path {
        self.prefix.clone().join("manifests")
    }

    /// The current generation, or None if nothing was ever published here.
    pub fn head(&self) -> Result<Option<u64>, RemoteError> {
        Ok(self.head_versioned()?.map(|(generation, _)| generation))
    }

    /// The current generation and the version of `HEAD` that holds it, for a conditional
    /// update of `HEAD`.
    pub fn head_versioned(&self) -> Result<Option<(u64, UpdateVersion)>, RemoteError> {
        let key = self.head_key();
        let result = self.block_on(async {
            let got = self.store.get(&key).await?;
            let meta = got.meta.clone();
            Ok((got.bytes().await?, meta))
        });
        let (bytes, meta) = match result {
            Ok(found) => found,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(self.error("read", &key, error)),
        };
        let generation = parse_generation(&bytes).ok_or_else(|| RemoteError::BadHead {
            key: key.to_string(),
            content: String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned(),
        })?;
        Ok(Some((generation, UpdateVersion { e_tag: meta.e_tag, version: meta.version })))
    }

    /// The manifest of `generation`, checked (its checksum, its fields, and that it is the
    /// generation its key names).
    pub fn manifest(&self, generation: u64) -> Result<Manifest, RemoteError> {
        let key = self.manifest_key(generation);
        let bytes = self.get(&key)?;
        let manifest = Manifest::decode(&bytes).map_err(|error| RemoteError::Manifest { generation, error })?;
        if manifest.generation != generation {
            return Err(RemoteError::Manifest {
                generation,
                error: ManifestError::Invalid(format!("it says generation {}", manifest.generation)),
            });
        }
        Ok(manifest)
    }

    /// The bytes of the chunk whose SHA-256 is `hash`, checked against it.
    pub fn get_chunk(&self, hash: &[u8; 32]) -> Result<Bytes, RemoteError> {
        let bytes = self.get(&self.chunk_key(hash))?;
        check_chunk(hash, &bytes)?;
        Ok(bytes)
    }

    /// Reads one whole object.
    pub fn get(&self, key: &Path) -> Result<Bytes, RemoteError> {
        self.block_on(async { self.store.get(key).await?.bytes().await })
            .map_err(|error| self.error("read", key, error))
    }

    /// Writes one object; `mode` says whether it may replace one, must be new, or must
    /// replace a given version. A refused condition is [`RemoteError::Conflict`].
    pub fn put(&self, key: &Path, bytes: Bytes, mode: PutMode) -> Result<(), RemoteError> {
        let options = PutOptions { mode, ..Default::default() };
        self.block_on(self.store.put_opts(key, bytes.into(), options))
            .map(drop)
            .map_err(|error| self.error("write", key, error))
    }

    /// Every object under `dir`, with its size and age.
    pub fn list(&self, dir: &Path) -> Result<Vec<ObjectMeta>, RemoteError> {
        self.block_on(self.store.list(Some(dir)).try_collect()).map_err(|error| self.error("list", dir, error))
    }

    /// Runs `operation` over `items` with up to `in_flight` of them at once; the results in
    /// order of completion, stopping at the first error.
    pub fn for_each_concurrent<T, R, F, Fut>(
        &self,
        items: impl IntoIterator<Item = T>,
        in_flight: usize,
        operation: F,
    ) -> Result<Vec<R>, RemoteError>
    where
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<R, RemoteError>>,
    {
        debug_assert!(in_flight > 0);
        self.block_on(futures::stream::iter(items).map(operation).buffer_unordered(in_flight).try_collect())
    }

    /// Asks for one listing of the prefix, so that a store that cannot answer fails at open.
    fn probe(&self) -> Result<(), RemoteError> {
        self.block_on(self.store.list_with_delimiter(Some(&self.prefix)))
            .map(drop)
            .map_err(|error| self.error("list", &self.prefix, error))
    }

    /// Turns an object_store error into the one line a user can act on.
    pub fn error(&self, operation: &'static str, key: &Path, error: object_store::Error) -> RemoteError {
        let full = one_line(&error);
        // An S3 error answer names its cause in <Code> (and <Message>): that is the line.
        let code = xml_field(&full, "Code");
        let detail = match (code, xml_field(&full, "Message")) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            _ => full.clone(),
        };
        match &error {
            object_store::Error::Unauthenticated { .. } => RemoteError::Credentials(detail),
            _ if code.is_some_and(is_credentials_code) => RemoteError::Credentials(detail),
            _ if code == Some("NoSuchBucket") => RemoteError::NoBucket(self.bucket.clone()),
            object_store::Error::NotFound { .. } => RemoteError::NotFound(key.to_string()),
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                RemoteError::Conflict(format!("{key} was written by someone else first"))
            }
            _ if is_unreachable(&error) => RemoteError::Unreachable { endpoint: self.endpoint.clone(), detail },
            _ => RemoteError::Store { operation, key: key.to_string(), detail },
        }
    }
}

/// Checks that `bytes` hash to `hash`.
pub fn check_chunk(hash: &[u8; 32], bytes: &[u8]) -> Result<(), RemoteError> {
    if Sha256::digest(bytes).as_slice() == hash {
        Ok(())
    } else {
        Err(RemoteError::ChunkHash(hex(hash)))
    }
}

/// The SHA-256 of a chunk's bytes: its name in the store.
pub fn chunk_hash(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// 64 lowercase hex digits.
pub fn hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A chunk key's last segment back to its hash, or None if it is not 64 lowercase hex digits.
pub fn parse_hex(name: &str) -> Option<[u8; 32]> {
    let digits = name.as_bytes();
    if digits.len() != 64 || !digits.iter().all(|d| matches!(d, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut hash = [0; 32];
    for (byte, pair) in hash.iter_mut().zip(digits.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(hash)
}

/// A generation as its key's last segment and `HEAD`'s content: 20 zero-padded digits, so
/// that the keys sort in generation order.
pub fn generation_name(generation: u64) -> String {
    format!("{generation:020}")
}

/// `HEAD`'s content or a manifest key's last segment back to its generation: exactly 20
/// decimal digits, not 0.
pub fn parse_generation(text: &[u8]) -> Option<u64> {
    if text.len() != 20 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok().filter(|&generation| generation != 0)
}

/// The S3 client for `bucket`: endpoint from the options or AWS_ENDPOINT_URL, region and
/// credentials from the AWS environment variables, then ~/.aws/credentials and ~/.aws/config
/// (profile AWS_PROFILE, else `default`); plain http only to a loopback endpoint.
fn s3_store(bucket: &str, options: &RemoteOptions) -> Result<(Arc<dyn ObjectStore>, String), object_store::Error> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let profile = aws_profile();
    let unset = |builder: &AmazonS3Builder, key| builder.get_config_value(&key).is_none();
    for (key, name) in [
        (AmazonS3ConfigKey::AccessKeyId, "aws_access_key_id"),
        (AmazonS3ConfigKey::SecretAccessKey, "aws_secret_access_key"),
        (AmazonS3ConfigKey::Token, "aws_session_token"),
        (AmazonS3ConfigKey::Region, "region"),
        (AmazonS3ConfigKey::Endpoint, "endpoint_url"),
    ] {
        if let Some(value) = profile.get(name).filter(|_| unset(&builder, key)) {
            builder = builder.with_config(key, value);
        }
    }
    if unset(&builder, AmazonS3ConfigKey::Region) {
        builder = builder.with_region("us-east-1");
    }
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint).unwrap_or_else(|| "AWS S3".to_string());
    if is_loopback(&endpoint) {
        builder = builder.with_allow_http(true);
    }
    let store = builder
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), CONNECT_TIMEOUT)
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
        .with_retry(RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: RETRIES_MAX,
            retry_timeout: RETRY_TIMEOUT,
        })
        .build()?;
    Ok((Arc::new(store), endpoint))
}

/// The settings of the AWS profile in use, from ~/.aws/config then ~/.aws/credentials (the
/// later file wins, as in the AWS CLI); empty when neither exists.
fn aws_profile() -> HashMap<String, String> {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    let home = std::env::var("HOME").unwrap_or_default();
    let file =
        |variable: &str, default: &str| std::env::var(variable).unwrap_or_else(|_| format!("{home}/.aws/{default}"));
    // The config file names non-default profiles `[profile NAME]`; the credentials file `[NAME]`.
    let config_section = if profile == "default" { profile.clone() } else { format!("profile {profile}") };
    let mut settings = HashMap::new();
    for (path, section) in [
        (file("AWS_CONFIG_FILE", "config"), config_section.as_str()),
        (file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), profile.as_str()),
    ] {
        let Ok(ini) = ini::Ini::load_from_file(&path) else { continue };
        if let Some(properties) = ini.section(Some(section)) {
            for (key, value) in properties.iter() {
                settings.insert(key.to_ascii_lowercase(), value.to_string());
            }
        }
    }
    settings
}

/// Whether the endpoint is on this machine, where plain http is acceptable.
fn is_loopback(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else { return false };
    let host = rest.split('/').next().unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(host, _port)| host);
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// Whether an S3 error code is about the credentials themselves rather than a policy.
fn is_credentials_code(code: &str) -> bool {
    matches!(code, "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken" | "InvalidToken")
}

/// The text of the first `<NAME>...</NAME>` in an S3 error answer.
fn xml_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("<{name}>"))? + name.len() + 2;
    let len = text[start..].find(&format!("</{name}>"))?;
    Some(&text[start..start + len])
}

/// Whether the error is a failure to connect or a timeout, after the retries.
fn is_unreachable(error: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(http) = current.downcast_ref::<object_store::client::HttpError>() {
            return matches!(
                http.kind(),
                object_store::client::HttpErrorKind::Connect | object_store::client::HttpErrorKind::Timeout
            );
        }
        source = current.source();
    }
    false
}

/// The error and its sources on one line.
fn one_line(error: &object_store::Error) -> String {
    error.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::ChunkRef;

    fn sample(generation: u64) -> Manifest {
        Manifest {
            generation,
            parent: generation - 1,
            image_size: 8192,
            chunk_size: 4096,
            block_size: 4096,
            uuid: [1; 16],
            chunks: vec![ChunkRef::Stored(chunk_hash(b"x")), ChunkRef::Zero],
            metadata: vec![0],
        }
    }

    #[test]
    fn keys() {
        let remote = Remote::with_store(Arc::new(InMemory::new()), Path::from("a/b"));
        assert_eq!(remote.head_key().as_ref(), "a/b/HEAD");
        assert_eq!(remote.manifest_key(42).as_ref(), "a/b/manifests/00000000000000000042");
        let hash = chunk_hash(b"");
        assert_eq!(
            remote.chunk_key(&hash).as_ref(),
            "a/b/chunks/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(parse_hex(&hex(&hash)), Some(hash));
        assert_eq!(parse_hex("E3"), None);
    }

    #[test]
    fn generation_names() {
        assert_eq!(parse_generation(generation_name(7).as_bytes()), Some(7));
        assert_eq!(parse_generation(generation_name(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(parse_generation(b"00000000000000000000"), None);
        assert_eq!(parse_generation(b"7"), None);
        assert_eq!(parse_generation(b"99999999999999999999"), None);
        assert_eq!(parse_generation(b"0000000000000000000x"), None);
    }

    #[test]
    fn head_manifest_and_chunk_round_trip() {
        let remote = Remote::memory();
        assert_eq!(remote.head().unwrap(), None);
        let chunk = Bytes::from_static(b"x");
        remote.put(&remote.chunk_key(&chunk_hash(&chunk)), chunk.clone(), PutMode::Create).unwrap();
        let manifest = sample(1);
        remote.put(&remote.manifest_key(1), manifest.encode().into(), PutMode::Create).unwrap();
        remote.put(&remote.head_key(), generation_name(1).into_bytes().into(), PutMode::Create).unwrap();
        let reader = remote.clone();
        assert_eq!(reader.head().unwrap(), Some(1));
        assert_eq!(reader.manifest(1).unwrap(), manifest);
        assert_eq!(reader.get_chunk(&chunk_hash(&chunk)).unwrap(), chunk);
    }

    #[test]
    fn create_only_and_conditional_writes_conflict() {
        let remote = Remote::memory();
        let head = remote.head_key();
        remote.put(&head, generation_name(1).into_bytes().into(), PutMode::Create).unwrap();
        let again = remote.put(&head, generation_name(2).into_bytes().into(), PutMode::Create);
        assert!(matches!(again, Err(RemoteError::Conflict(_))), "{again:?}");
        let (_, version) = remote.head_versioned().unwrap().unwrap();
        remote.put(&head, generation_name(2).into_bytes().into(), PutMode::Update(version.clone())).unwrap();
        let stale = remote.put(&head, generation_name(3).into_bytes().into(), PutMode::Update(version));
        assert!(matches!(stale, Err(RemoteError::Conflict(_))), "{stale:?}");
        assert_eq!(remote.head().unwrap(), Some(2));
    }

    #[test]
    fn damage_is_reported() {
        let remote = Remote::memory();
        let mut bytes = sample(1).encode();
        bytes[90] ^= 1;
        remote.put(&remote.manifest_key(1), bytes.into(), PutMode::Create).unwrap();
        let error = remote.manifest(1).unwrap_err();
        assert!(matches!(error, RemoteError::Manifest { error: ManifestError::Checksum, .. }));
        assert_eq!(
            error.to_string(),
            "manifest of generation 1 is unusable: manifest checksum mismatch: the manifest is damaged"
        );
        // A manifest stored under another generation's key.
        remote.put(&remote.manifest_key(2), sample(1).encode().into(), PutMode::Create).unwrap();
        assert!(matches!(remote.manifest(2), Err(RemoteError::Manifest { generation: 2, .. })));
        let hash = chunk_hash(b"good");
        remote.put(&remote.chunk_key(&hash), Bytes::from_static(b"evil"), PutMode::Create).unwrap();
        assert!(matches!(remote.get_chunk(&hash), Err(RemoteError::ChunkHash(_))));
        assert!(matches!(remote.manifest(3), Err(RemoteError::NotFound(_))));
        remote.put(&remote.head_key(), Bytes::from_static(b"junk"), PutMode::Create).unwrap();
        assert!(matches!(remote.head(), Err(RemoteError::BadHead { .. })));
    }

    #[test]
    fn memory_urls_share_a_store_by_name() {
        let writer = Remote::open("memory://store-test/p/q", &RemoteOptions::default()).unwrap();
        writer.put(&writer.head_key(), generation_name(5).into_bytes().into(), PutMode::Create).unwrap();
        let reader = Remote::open("memory://store-test/p/q/", &RemoteOptions::default()).unwrap();
        assert_eq!(reader.head().unwrap(), Some(5));
        let other = Remote::open("memory://store-test/p", &RemoteOptions::default()).unwrap();
        assert_eq!(other.head().unwrap(), None);
    }

    #[test]
    fn bad_urls_say_why() {
        for url in ["bucket/prefix", "s3:///prefix", "ftp://bucket/prefix", "s3://b/a//b"] {
            let error = Remote::open(url, &RemoteOptions::default()).unwrap_err();
            assert!(matches!(error, RemoteError::BadUrl { .. }), "{url}: {error}");
        }
    }

    #[test]
    fn a_dead_endpoint_fails_fast_in_one_line() {
        // Port 9 (discard) on loopback: nothing listens there on a test machine. Credentials
        // are given so that the client does not go looking for an instance's role first.
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        let options = RemoteOptions { endpoint: Some("http://127.0.0.1:9".to_string()) };
        let started = std::time::Instant::now();
        let error = Remote::open("s3://bucket/prefix", &options).unwrap_err();
        assert!(matches!(error, RemoteError::Unreachable { .. }), "{error}");
        assert!(!error.to_string().contains('\n'));
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    }

    #[test]
    fn s3_error_answers_are_read_for_their_code() {
        let answer = "403 Forbidden: <Error><Code>SignatureDoesNotMatch</Code><Message>No.</Message></Error>";
        assert_eq!(xml_field(answer, "Code"), Some("SignatureDoesNotMatch"));
        assert_eq!(xml_field(answer, "Message"), Some("No."));
        assert_eq!(xml_field(answer, "Condition"), None);
        assert_eq!(xml_field("<Code>unterminated", "Code"), None);
    }

    #[test]
    fn loopback_endpoints_allow_http() {
        assert!(is_loopback("http://127.0.0.1:7070"));
        assert!(is_loopback("http://localhost:7070/"));
        assert!(is_loopback("http://[::1]:7070"));
        assert!(!is_loopback("http://example.com:7070"));
        assert!(!is_loopback("https://127.0.0.1:7070"));
    }
}

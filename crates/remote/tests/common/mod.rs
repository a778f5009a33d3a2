//! A store for the tests that dies at a chosen operation, and can hold every manifest write at
//! a barrier (two publishers meet there), over any other store.

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};

/// Which operation a crash hits, and whether the store had done it when the process died.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // real_server.rs crashes nothing.
pub enum Crash {
    /// Operation K and all later ones never reach the store.
    Before(usize),
    /// Operation K is done but its answer is lost; the later ones never happen.
    After(usize),
}

/// A store that dies at a chosen operation, and can hold every manifest write at a barrier.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    ops: AtomicUsize,
    crash: Option<Crash>,
    manifest_rendezvous: Option<Arc<Barrier>>,
}

impl std::fmt::Display for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultStore({:?})", self.crash)
    }
}

fn injected() -> object_store::Error {
    object_store::Error::Generic { store: "FaultStore", source: "injected crash".into() }
}

impl FaultStore {
    pub fn over(inner: Arc<dyn ObjectStore>, crash: Option<Crash>) -> FaultStore {
        FaultStore { inner, ops: AtomicUsize::new(0), crash, manifest_rendezvous: None }
    }

    /// A store that never fails but holds every manifest write until `barrier` has as many
    /// waiting as it counts.
    pub fn meeting_at_manifests(inner: Arc<dyn ObjectStore>, barrier: Arc<Barrier>) -> FaultStore {
        FaultStore { manifest_rendezvous: Some(barrier), ..FaultStore::over(inner, None) }
    }

    /// Runs one operation as the crash plan allows.
    async fn op<T>(&self, run: impl std::future::Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
        let n = self.ops.fetch_add(1, SeqCst);
        match self.crash {
            Some(Crash::Before(k)) if n >= k => Err(injected()),
            Some(Crash::After(k)) if n > k => Err(injected()),
            Some(Crash::After(k)) if n == k => {
                run.await?;
                Err(injected())
            }
            _ => run.await,
        }
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if let Some(barrier) = self.manifest_rendezvous.as_ref().filter(|_| location.as_ref().contains("manifests/")) {
            barrier.wait();
        }
        self.op(self.inner.put_opts(location, payload, opts)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.op(self.inner.put_multipart_opts(location, opts)).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.op(self.inner.get_opts(location, options)).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if matches!(self.crash, Some(Crash::Before(k) | Crash::After(k)) if self.ops.fetch_add(1, SeqCst) >= k) {
            return futures::stream::once(async { Err(injected()) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.op(self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.op(self.inner.copy_opts(from, to, options)).await
    }
}

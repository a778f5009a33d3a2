//! Publishing ferrofs images to S3-compatible object storage: the manifest of a generation,
//! the store that holds chunks, manifests and `HEAD`, and the tools over them.
//!
//! The engine crate knows nothing of this: a published image is the same bytes as a local one,
//! cut into content-addressed chunks (docs/SPEC.md, "Published images"; docs/DESIGN.md,
//! "Publishing to object storage").

#![deny(missing_docs)]

pub mod cache;
pub mod delay_proxy;
pub mod device;
pub mod gc;
pub mod manifest;
pub mod publish;
pub mod store;

pub use manifest::{ChunkRef, Manifest, ManifestError};
pub use store::{Remote, RemoteError, RemoteOptions};

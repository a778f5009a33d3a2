//! `ferrofs gc s3://bucket/prefix --keep N`: delete the manifests and chunks of a published
//! image that its N newest generations do not need (docs/DESIGN.md, "Publishing to object
//! storage").

use crate::failure::{CliResult, Context, Failure};
use crate::units::{grouped, human_bytes};
use clap::Args;
use ferrofs_remote::gc::{gc, GRACE_MIN};
use ferrofs_remote::{Remote, RemoteOptions};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct GcArgs {
    /// The published image: s3://bucket/prefix.
    pub url: String,
    /// How many generations to keep, HEAD and the ones before it (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: u64,
    /// The S3 endpoint of an S3-compatible server (default: AWS_ENDPOINT_URL, else AWS).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Leave objects younger than this many minutes (a publish may be using them; at least 60).
    #[arg(long, default_value_t = 60)]
    pub grace_minutes: u64,
}

pub fn run(args: &GcArgs) -> CliResult<()> {
    let what = || format!("gc {}", args.url);
    let grace = Duration::from_secs(args.grace_minutes * 60);
    if grace < GRACE_MIN {
        return Err(Failure::new(
            what(),
            format!(
                "--grace-minutes must be at least {}: a publish may still need younger chunks",
                GRACE_MIN.as_secs() / 60
            ),
        ));
    }
    let remote = Remote::open(&args.url, &RemoteOptions { endpoint: args.endpoint.clone() }).context(what)?;
    let keep = usize::try_from(args.keep).unwrap_or(usize::MAX);
    let report = gc(&remote, keep, grace).context(what)?;
    println!(
        "{}: kept generations {:?}; deleted {} manifests and {} chunks ({}); {} unnamed chunks younger than {} min left",
        args.url,
        report.kept,
        grouped(report.manifests_deleted),
        grouped(report.chunks_deleted),
        human_bytes(report.bytes_deleted),
        grouped(report.chunks_spared),
        args.grace_minutes
    );
    Ok(())
}

//! Benchmark commands and the chaos run: programs that print figures, not tests (the machine is
//! shared and noisy, so nothing here is timed against a bound). Each runs against the local
//! stack through `deploy/local/stack bench …` or `deploy/local/stack chaos`, on the harness and
//! fakes of `tidings-tests`.
//!
//! - [`figures`]: medians and rounding of the printed figures.
//! - [`peer`]: the alternative a team would run instead (graphile-worker + web-push).
//! - [`pgstat`]: what Postgres says it did over a window (buffers, commits, WAL, autovacuum).
//! - [`procstat`]: CPU and memory of processes, read from /proc.
//! - [`push`]: PushRequests a benchmark sends itself.
//! - [`rng`]: the seeded sequence that makes two runs meet the same load and faults.
//! - [`seed`]: watches in bulk.

pub mod figures;
pub mod peer;
pub mod pgstat;
pub mod procstat;
pub mod push;
pub mod rng;
pub mod seed;

/// The detector's settings as a deployment gets them by default.
pub fn detector_defaults() -> tidings_detector::Settings {
    let (subjects, source) = placeholders();
    tidings_detector::Settings::new(subjects, source)
}

/// The dispatcher's settings as a deployment gets them by default: what the benchmarks print
/// and run with.
pub fn dispatcher_defaults() -> tidings_dispatcher::Settings {
    let (subjects, source) = placeholders();
    tidings_dispatcher::Settings::new(subjects, source)
}

/// A prefix and a source for settings read only for their defaults, which depend on neither.
fn placeholders() -> (
    tidings_domain::subjects::Subjects,
    tidings_source::SourceConfig,
) {
    (
        tidings_domain::subjects::Subjects::new("x").expect("a valid prefix"),
        tidings_source::SourceConfig::new("http://x/{item}"),
    )
}

/// A new Ed25519 DKIM key in a file of its own (`TIDINGS_DKIM_KEY_FILE`), removed when dropped.
pub fn dkim_key_file(prefix: &str) -> tidings_tests::temp_file::TempFile {
    let pem = tidings_email::dkim::generate_ed25519_pem().expect("key");
    tidings_tests::temp_file::TempFile::new(prefix, "pem", pem.as_bytes()).expect("key file")
}

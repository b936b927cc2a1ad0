//! What the migration tests share: where the migrations are and which one was last released.

use std::path::PathBuf;

pub fn migrations_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations"))
}

/// The highest migration of the last release, from migrations/README.md.
pub fn released() -> i64 {
    std::fs::read_to_string(migrations_dir().join("README.md"))
        .unwrap_or_else(|e| panic!("migrations/README.md: {e}"))
        .lines()
        .find_map(|l| l.strip_prefix("Released: "))
        .expect("migrations/README.md has a `Released: NNNN` line")
        .trim()
        .parse()
        .expect("`Released:` names a migration number")
}

//! A file a test or benchmark hands to a service (a key, a secret), removed when it goes out of
//! scope, so runs do not pile files up in the temporary folder.

use std::path::{Path, PathBuf};

/// A file of its own in the temporary folder, removed on drop.
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Writes `contents` to a new file named `{prefix}-{random}.{extension}`.
    pub fn new(prefix: &str, extension: &str, contents: &[u8]) -> std::io::Result<Self> {
        let name = format!("{prefix}-{}.{extension}", uuid::Uuid::new_v4().simple());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents)?;
        Ok(TempFile { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as a service's setting takes it.
    pub fn setting(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_holds_its_contents_and_is_gone_after_drop() {
        let file = TempFile::new("tidings-temp-file-test", "pem", b"key").unwrap();
        let path = file.path().to_owned();
        assert_eq!(std::fs::read(&path).unwrap(), b"key");
        assert!(file.setting().ends_with(".pem"));
        drop(file);
        assert!(!path.exists(), "{} left behind", path.display());
    }
}

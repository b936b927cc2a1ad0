//! Secrets given as a value (`NAME`) or as a file that holds it (`NAME_FILE`), as Kubernetes
//! mounts a Secret: a file does not show in the process's environment, which leaks into crash
//! reports, `kubectl describe` and child processes.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{name}_FILE {path}: {source}")]
    File {
        name: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name}_FILE {path} is empty")]
    Empty { name: &'static str, path: String },
}

/// `value`, else the contents of `file` without its trailing line break; `None` if neither is
/// given. (clap refuses both at once where the flags say `conflicts_with`.)
pub fn value_or_file(
    name: &'static str,
    value: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, SecretError> {
    if let Some(v) = value {
        return Ok(Some(v.to_owned()));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::File {
        name,
        path: path.display().to_string(),
        source,
    })?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(SecretError::Empty {
            name,
            path: path.display().to_string(),
        });
    }
    Ok(Some(secret.to_owned()))
}

/// Where Postgres is: `DATABASE_URL`, or `DATABASE_URL_FILE` naming a file that holds it.
#[derive(clap::Args, Clone, Debug)]
pub struct DatabaseArgs {
    /// Postgres URL (`postgres://user:password@host/db?sslmode=verify-full&sslrootcert=…`).
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        required_unless_present = "database_url_file"
    )]
    pub database_url: Option<String>,
    /// A file holding the Postgres URL (a mounted Secret), instead of DATABASE_URL.
    #[arg(long, env = "DATABASE_URL_FILE", conflicts_with = "database_url")]
    pub database_url_file: Option<PathBuf>,
}

impl DatabaseArgs {
    pub fn url(&self) -> Result<String, SecretError> {
        let url = value_or_file(
            "DATABASE_URL",
            self.database_url.as_deref(),
            self.database_url_file.as_deref(),
        )?;
        // clap requires one of the two, so `None` only comes from a value built by hand.
        Ok(url.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_wins_and_a_file_loses_its_trailing_line_break() {
        let dir = std::env::temp_dir().join(format!("tidings-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let file = dir.join("url");
        std::fs::write(&file, "postgres://u:p@db/x\n").unwrap_or_default();
        assert_eq!(
            value_or_file("DATABASE_URL", None, Some(&file))
                .ok()
                .flatten()
                .as_deref(),
            Some("postgres://u:p@db/x")
        );
        assert_eq!(
            value_or_file("DATABASE_URL", Some("v"), Some(&file))
                .ok()
                .flatten()
                .as_deref(),
            Some("v")
        );
        assert!(matches!(value_or_file("X", None, None), Ok(None)));
        std::fs::write(&file, "\n").unwrap_or_default();
        let empty = value_or_file("DATABASE_URL", None, Some(&file)).unwrap_err();
        assert!(
            empty.to_string().starts_with("DATABASE_URL_FILE "),
            "{empty}"
        );
        let missing = value_or_file("NATS_PASSWORD", None, Some(&dir.join("none"))).unwrap_err();
        assert!(matches!(
            missing,
            SecretError::File {
                name: "NATS_PASSWORD",
                ..
            }
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! `tidings audit`: what operators did, newest first.

use crate::client::{Api, CliError, exit};
use crate::table;
use tidings_api_types::audit::AuditList;

pub async fn run(
    api: &Api,
    json_out: bool,
    operator: Option<String>,
    since: Option<String>,
    limit: usize,
) -> Result<u8, CliError> {
    let mut query = Vec::new();
    if let Some(o) = operator {
        query.push(("operator", o));
    }
    if let Some(s) = since {
        query.push(("since", s));
    }
    let items = api
        .list::<AuditList>("/v1/admin/audit", &query, limit)
        .await?;
    table::listing(
        json_out,
        &items,
        &[
            ("id", "/id"),
            ("at", "/at"),
            ("operator", "/operator"),
            ("action", "/action"),
            ("path", "/target/path"),
            ("dry run", "/dry_run"),
            ("status", "/status"),
            ("rows", "/rows"),
        ],
    );
    Ok(exit::OK)
}

//! `tidings doctor`: the api's own checks (`GET /v1/admin/doctor`), printed one per line, and
//! exit code 1 when any failed. Not reaching the api at all is the first fault (exit code 6).

use crate::client::{Api, CliError, exit};
use crate::table::cell;
use tidings_api_types::doctor::Diagnosis;

pub async fn run(
    api: &Api,
    json_out: bool,
    max_lag: u64,
    max_due_age: u64,
) -> Result<u8, CliError> {
    let d: Diagnosis = api
        .get(
            "/v1/admin/doctor",
            &[
                ("max_lag", max_lag.to_string()),
                ("max_due_age", max_due_age.to_string()),
            ],
        )
        .await?;
    if json_out {
        println!("{}", cell(&d));
    } else {
        println!("ok    api: reachable, operator token accepted");
        for c in &d.checks {
            let mark = if c.ok { "ok  " } else { "FAIL" };
            println!("{mark}  {}: {}", c.name, crate::table::shown(&c.detail));
        }
    }
    Ok(if d.ok { exit::OK } else { exit::FAULT })
}

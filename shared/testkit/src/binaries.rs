//! The workspace's binaries, as tests run them: the four services and the operator CLI, built
//! (debug, or release under a release benchmark) by the first test that needs them, so a test
//! always runs the current code. Finding and running a binary needs no service crate.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub const SERVICES: [&str; 4] = ["api", "dispatcher", "pusher", "detector"];

/// Where `cargo build` puts this profile's binaries: next to the test executable's `deps/`.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    if deps.ends_with("deps") {
        deps.parent().expect("profile dir").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// Runs `cargo build` for `packages_and_bins` from the workspace (release when the tests run
/// a release build); the error is cargo's output.
fn cargo_build(args: &[String]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["build", "--quiet"])
        .args(args);
    // A release benchmark runs release services.
    if bin_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The service binary `tidings-<name>`, built once per test process; or, when
/// `TIDINGS_SERVICE_BIN_DIR` is set, the one in that folder (to run a test against another
/// build, e.g. to show a new test fails on the code before a fix).
pub fn binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("TIDINGS_SERVICE_BIN_DIR") {
        return PathBuf::from(dir).join(format!("tidings-{name}"));
    }
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let args: Vec<String> = SERVICES
            .iter()
            .flat_map(|s| {
                [
                    "-p".to_owned(),
                    format!("tidings-{s}"),
                    "--bin".to_owned(),
                    format!("tidings-{s}"),
                ]
            })
            .collect();
        cargo_build(&args)
    });
    if let Err(e) = built {
        panic!("building the service binaries failed:\n{e}");
    }
    bin_dir().join(format!("tidings-{name}"))
}

/// The operator CLI, `tidings`, built once per test process (or taken from
/// `TIDINGS_SERVICE_BIN_DIR`, as [`binary`]).
pub fn cli_binary() -> PathBuf {
    if let Some(dir) = std::env::var_os("TIDINGS_SERVICE_BIN_DIR") {
        return PathBuf::from(dir).join("tidings");
    }
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let args = ["-p", "tidings-cli", "--bin", "tidings"].map(str::to_owned);
        cargo_build(&args)
    });
    if let Err(e) = built {
        panic!("building the CLI failed:\n{e}");
    }
    bin_dir().join("tidings")
}

/// What a run of the CLI did.
#[derive(Debug)]
pub struct CliRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// stdout as JSON (a `--json` run).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: not JSON: {self:?}"))
    }

    /// stdout (a `--json` run) as the api's answer it prints.
    pub fn decoded<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: not the answer's type: {self:?}"))
    }
}

/// Runs `tidings ARGS` against the operator api at `ops_url` with `token`.
pub fn cli(ops_url: &str, token: &str, args: &[&str]) -> CliRun {
    let mut cmd = Command::new(cli_binary());
    cmd.env("TIDINGS_OPS_URL", ops_url)
        .env("TIDINGS_ADMIN_TOKEN", token);
    run_cli(cmd, args)
}

/// Runs `tidings ARGS` as an API client, against the public api at `url` with an endpoint's
/// `token` (no operator token in its environment).
pub fn endpoint_cli(url: &str, token: &str, args: &[&str]) -> CliRun {
    let mut cmd = Command::new(cli_binary());
    cmd.env("TIDINGS_API_URL", url)
        .env("TIDINGS_ENDPOINT_TOKEN", token)
        .env_remove("TIDINGS_ADMIN_TOKEN");
    run_cli(cmd, args)
}

fn run_cli(mut cmd: Command, args: &[&str]) -> CliRun {
    let out = cmd
        .args(args)
        .env_remove("TIDINGS_ADMIN_TOKEN_FILE")
        .output()
        .expect("run tidings");
    CliRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

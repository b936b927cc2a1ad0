//! `tidings device …` and `tidings watch …`.

use crate::args::Object;
use crate::client::{Api, CliError, exit};
use crate::table::{self, cell};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use tidings_api_types::objects::{DeviceView, SubscriptionView, WatchView};

/// Which kind of object: its path under `/v1/admin` and the fields shown.
#[derive(Clone, Copy)]
pub enum Kind {
    Device,
    Watch,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Device => "devices",
            Kind::Watch => "watches",
        }
    }

    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Device => &[
                "id",
                "channel",
                "time_zone",
                "locale",
                "preferences",
                "created_at",
                "removed_at",
                "paused_at",
                "watch_count",
            ],
            Kind::Watch => &[
                "id",
                "device_id",
                "item_code",
                "triggers",
                "channel",
                "paused",
                "withdraw",
                "urgent",
                "preferences",
                "created_at",
                "updated_at",
                "removed_at",
            ],
        }
    }
}

pub async fn run(api: &Api, json_out: bool, kind: Kind, command: Object) -> Result<u8, CliError> {
    let (id, action) = match &command {
        Object::Show { id } => (id, None),
        Object::Pause { id } => (id, Some("pause")),
        Object::Resume { id } => (id, Some("resume")),
    };
    let path = format!("/v1/admin/{}/{id}", kind.path());
    match kind {
        Kind::Device => {
            let device: DeviceView = fetch(api, &path, action).await?;
            show(
                json_out,
                &device,
                kind,
                Some(&device.subscriptions),
                &device.outbox,
            );
        }
        Kind::Watch => {
            let watch: WatchView = fetch(api, &path, action).await?;
            show(json_out, &watch, kind, None, &watch.outbox);
        }
    }
    Ok(exit::OK)
}

/// The object at `path`, after `action` (pause, resume) if one is asked.
async fn fetch<T: DeserializeOwned>(
    api: &Api,
    path: &str,
    action: Option<&str>,
) -> Result<T, CliError> {
    match action {
        None => api.get(path, &[]).await,
        Some(a) => api.post(&format!("{path}/{a}"), &Value::Null).await,
    }
}

fn show<T: Serialize>(
    json_out: bool,
    v: &T,
    kind: Kind,
    subscriptions: Option<&[SubscriptionView]>,
    outbox: &BTreeMap<impl std::fmt::Display, i64>,
) {
    if json_out {
        println!("{}", cell(v));
        return;
    }
    table::fields(v, kind.fields());
    if let Some(subs) = subscriptions {
        println!("\nsubscriptions:");
        table::list(
            subs,
            &[
                ("id", "/id"),
                ("host", "/push_host"),
                ("active", "/active"),
                ("created", "/created_at"),
                ("deactivated", "/deactivation_reason"),
            ],
        );
    }
    println!("\nnotifications:");
    let rows: Vec<Vec<String>> = outbox
        .iter()
        .map(|(status, n)| vec![status.to_string(), n.to_string()])
        .collect();
    table::print(&["status", "rows"], &rows);
}

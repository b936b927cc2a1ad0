//! Delivery channels. A channel names a JetStream subject suffix and a pusher.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a notification is delivered. Only Web Push exists today; the enum keeps subjects,
/// dedup keys and the outbox unique key ready for more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "sqlx",
    derive(sqlx::Type),
    sqlx(type_name = "text", rename_all = "snake_case")
)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    WebPush,
}

impl Channel {
    pub const ALL: [Channel; 1] = [Channel::WebPush];

    /// The name used in subjects, dedup keys and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::WebPush => "web_push",
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown channel {0:?} (known: web_push)")]
pub struct UnknownChannel(pub String);

impl std::str::FromStr for Channel {
    type Err = UnknownChannel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Channel::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownChannel(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_its_name() {
        for c in Channel::ALL {
            assert_eq!(c.as_str().parse::<Channel>(), Ok(c));
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
        }
        assert_eq!(
            "sms".parse::<Channel>(),
            Err(UnknownChannel("sms".to_owned()))
        );
    }
}

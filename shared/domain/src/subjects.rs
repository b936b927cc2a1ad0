//! Stream and subject names, all derived from one prefix so that several deployments (or test
//! runs) share a NATS server without seeing each other.

use crate::Channel;
use crate::names::names;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid subject prefix {0:?}: use 1 to 32 characters from a-z, A-Z, 0-9, '_' and '-'")]
pub struct InvalidPrefix(pub String);

names! {
    /// The streams Tidings uses. Each has its own subject space under the prefix.
    pub enum StreamKind("stream") {
        Enqueue = "enqueue",
        Push = "push",
        Result = "result",
        /// Messages that could not be decoded, kept for an operator.
        Dlq = "dlq",
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    pub const DEFAULT_PREFIX: &'static str = "tidings";

    pub fn new(prefix: &str) -> Result<Self, InvalidPrefix> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 32
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Subjects {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(InvalidPrefix(prefix.to_owned()))
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>.<kind>.<channel>`: where one channel's messages of a kind are published.
    pub fn subject(&self, kind: StreamKind, channel: Channel) -> String {
        format!("{}.{}.{}", self.prefix, kind.as_str(), channel)
    }

    /// `<prefix>.<kind>.>`: every subject of the stream.
    pub fn all(&self, kind: StreamKind) -> String {
        format!("{}.{}.>", self.prefix, kind.as_str())
    }

    /// `<prefix>.dlq.<stream>`: where undecodable messages from `from` are copied.
    pub fn dlq(&self, from: StreamKind) -> String {
        format!("{}.dlq.{}", self.prefix, from.as_str())
    }

    /// `<prefix>.hints.<source>`: change hints for one source's items (core NATS, not a stream:
    /// every detector shard hears each, and one lost costs only the wait until the next scan).
    pub fn hints(&self, source: &str) -> String {
        format!("{}.hints.{source}", self.prefix)
    }

    /// `<prefix>.hints.>`: every source's hints.
    pub fn all_hints(&self) -> String {
        format!("{}.hints.>", self.prefix)
    }

    /// `<prefix>_<kind>`: stream names may not contain dots.
    pub fn stream(&self, kind: StreamKind) -> String {
        format!("{}_{}", self.prefix, kind.as_str())
    }

    /// A KV bucket name under the prefix (bucket names share the stream-name rules).
    pub fn bucket(&self, name: &str) -> String {
        format!("{}_{}", self.prefix, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_prefix() {
        let s = Subjects::new("t42").unwrap();
        assert_eq!(
            s.subject(StreamKind::Enqueue, Channel::WebPush),
            "t42.enqueue.web_push"
        );
        assert_eq!(s.all(StreamKind::Result), "t42.result.>");
        assert_eq!(s.dlq(StreamKind::Enqueue), "t42.dlq.enqueue");
        assert_eq!(s.stream(StreamKind::Push), "t42_push");
    }

    #[test]
    fn prefixes_that_would_break_subjects_are_refused() {
        for bad in ["", "a.b", "a b", "a*", "a>", &"x".repeat(33)] {
            assert!(Subjects::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Subjects::new("tidings-prod_2").is_ok());
    }
}

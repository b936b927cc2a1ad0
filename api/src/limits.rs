//! Abuse limits on the anonymous api: token buckets per client address (device registration,
//! watch creation) and per device (watch creation). Anyone can register a device, so these are
//! what stands between a script and the database.
//!
//! Buckets live in this replica's memory, so a limit costs no shared store on every request:
//! with `TIDINGS_API_REPLICAS` = N, each replica keeps a share of 1/N of each rate, and a load
//! balancer that spreads a client's requests over the replicas (round robin, least requests)
//! gives the client the configured rate in all. One that pins a client to a replica gives it a
//! share only. The client address is the TCP peer, or, behind `TIDINGS_API_TRUSTED_PROXIES`
//! proxies, the address the outermost trusted one saw (read from the right of
//! `X-Forwarded-For`).

use axum::http::HeaderMap;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `count` requests per `per`, with bursts up to `count`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a rate: write COUNT/UNIT with UNIT s, m, h or d (e.g. 20/h), or `off`")]
pub struct InvalidRate(pub String);

/// `20/h`, `60/m`, `5/s`, `1000/d`; `off` (or `0`) for no limit.
pub fn parse_rate(text: &str) -> Result<Option<Rate>, InvalidRate> {
    let bad = || InvalidRate(text.to_owned());
    if matches!(text.trim(), "off" | "0") {
        return Ok(None);
    }
    let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let per = match unit.trim() {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        _ => return Err(bad()),
    };
    Ok((count > 0).then_some(Rate { count, per }))
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets are forgotten once full (a full bucket is what a new one is), and only when the map
/// grows past this: memory stays bounded under an address-spraying client.
const MAX_KEYS: usize = 100_000;

/// A bucket's size and how fast it refills.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    capacity: f64,
    per_token: f64,
}

/// One limit: a token bucket per key.
pub struct Limit<K> {
    shape: Option<Shape>,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> Limit<K> {
    pub fn new(rate: Option<Rate>) -> Self {
        Self::shared(rate, 1)
    }

    /// This replica's share of `rate` when `replicas` replicas keep it together: a bucket of
    /// 1/`replicas` of the burst (at least one token) refilled at 1/`replicas` of the rate.
    pub fn shared(rate: Option<Rate>, replicas: u32) -> Self {
        let shape = rate.map(|rate| {
            let share = f64::from(rate.count) / f64::from(replicas.max(1));
            Shape {
                capacity: share.max(1.0),
                per_token: rate.per.as_secs_f64() / share,
            }
        });
        Limit {
            shape,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key` at `now`; `Err(wait)` says how long until one is there.
    pub fn take(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let Some(Shape {
            capacity,
            per_token,
        }) = self.shape
        else {
            return Ok(());
        };
        let refill = |b: &Bucket| {
            let earned = now.saturating_duration_since(b.at).as_secs_f64() / per_token;
            (b.tokens + earned).min(capacity)
        };
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= MAX_KEYS {
            buckets.retain(|_, b| refill(b) < capacity);
        }
        let bucket = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        let tokens = refill(bucket);
        if tokens >= 1.0 {
            *bucket = Bucket {
                tokens: tokens - 1.0,
                at: now,
            };
            Ok(())
        } else {
            *bucket = Bucket { tokens, at: now };
            Err(Duration::from_secs_f64((1.0 - tokens) * per_token))
        }
    }
}

/// The api's limits.
pub struct Limits {
    /// Device registrations per client address.
    pub register: Limit<IpAddr>,
    /// Watch creations per client address.
    pub watches_per_address: Limit<IpAddr>,
    /// Watch creations per device token (its hash).
    pub watches_per_device: Limit<Vec<u8>>,
    /// Change hints per client address, before their signature is checked.
    pub hints_per_address: Limit<IpAddr>,
    /// Proxies in front of the api whose `X-Forwarded-For` entries are believed.
    pub trusted_proxies: usize,
}

impl Limits {
    pub fn new(settings: &crate::Settings) -> Self {
        tidings_runtime::metrics::at_zero(
            &crate::metrics::metrics().rate_limited,
            tidings_runtime::metrics::kinds([
                "register",
                "watches_per_address",
                "watches_per_device",
                "hints_per_address",
                "hints_per_source",
            ]),
        );
        let n = settings.replicas;
        Limits {
            register: Limit::shared(settings.register_rate, n),
            watches_per_address: Limit::shared(settings.watch_rate_per_address, n),
            watches_per_device: Limit::shared(settings.watch_rate_per_device, n),
            hints_per_address: Limit::shared(settings.hint_rate_per_address, n),
            trusted_proxies: settings.trusted_proxies,
        }
    }

    /// The client's address: the peer, or the entry `trusted_proxies` from the right of
    /// `X-Forwarded-For` (each trusted proxy appended the address it saw).
    pub fn client(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> IpAddr {
        let peer = peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip());
        if self.trusted_proxies == 0 {
            return peer;
        }
        let forwarded: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        forwarded
            .len()
            .checked_sub(self.trusted_proxies)
            .and_then(|i| forwarded.get(i))
            .and_then(|a| a.parse().ok())
            .unwrap_or(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_bad_ones_are_named() {
        let hour = Duration::from_secs(3600);
        assert_eq!(
            parse_rate("20/h"),
            Ok(Some(Rate {
                count: 20,
                per: hour
            }))
        );
        assert_eq!(
            parse_rate(" 5 / s "),
            Ok(Some(Rate {
                count: 5,
                per: Duration::from_secs(1)
            }))
        );
        assert_eq!(parse_rate("off"), Ok(None));
        assert_eq!(parse_rate("0/m"), Ok(None));
        for bad in ["20", "20/week", "x/h", "-1/h", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_of_n_replicas_keeps_an_nth_of_the_rate() {
        let hour = Duration::from_secs(3600);
        let t0 = Instant::now();
        let taken = |limit: &Limit<u8>, at| (0..100).filter(|_| limit.take(&1, at).is_ok()).count();
        let rate = Some(Rate {
            count: 20,
            per: hour,
        });
        // Three replicas: 20 / 3 each, so a client spread over all three gets 20 in all.
        let replicas: Vec<Limit<u8>> = (0..3).map(|_| Limit::shared(rate, 3)).collect();
        let burst: usize = replicas.iter().map(|l| taken(l, t0)).sum();
        assert_eq!(burst, 18, "6 whole tokens each of 6.67");
        // Refilled at 20/h in all: an hour later each has its share again.
        let later: usize = replicas.iter().map(|l| taken(l, t0 + hour)).sum();
        assert_eq!(later, 18);
        // A rate smaller than the replicas still lets one through on each.
        let tiny = Limit::<u8>::shared(
            Some(Rate {
                count: 2,
                per: hour,
            }),
            4,
        );
        assert_eq!(taken(&tiny, t0), 1);
        assert_eq!(taken(&Limit::shared(rate, 1), t0), 20);
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refills_at_its_rate() {
        let limit = Limit::new(Some(Rate {
            count: 3,
            per: Duration::from_secs(60),
        }));
        let t0 = Instant::now();
        for _ in 0..3 {
            limit.take(&1, t0).unwrap();
        }
        let wait = limit.take(&1, t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(20), "one token per 20 s");
        // Another key has its own bucket.
        limit.take(&2, t0).unwrap();
        // 20 s later exactly one more.
        let t1 = t0 + Duration::from_secs(20);
        limit.take(&1, t1).unwrap();
        assert!(limit.take(&1, t1).is_err());
        // Long idle: full again, never more than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..3 {
            limit.take(&1, t2).unwrap();
        }
        assert!(limit.take(&1, t2).is_err());
        assert!(Limit::<u8>::new(None).take(&1, t0).is_ok(), "off");
    }

    #[test]
    fn the_client_is_the_peer_unless_proxies_are_trusted() {
        let peer: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.7".parse().unwrap());
        let limits = |trusted_proxies| Limits {
            register: Limit::new(None),
            watches_per_address: Limit::new(None),
            watches_per_device: Limit::new(None),
            hints_per_address: Limit::new(None),
            trusted_proxies,
        };
        assert_eq!(limits(0).client(Some(peer), &headers), peer.ip());
        // One proxy: the address it saw is the last entry; what the client wrote before it is
        // not believed.
        assert_eq!(
            limits(1).client(Some(peer), &headers),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            limits(2).client(Some(peer), &headers),
            "6.6.6.6".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            limits(3).client(Some(peer), &headers),
            peer.ip(),
            "fewer entries than proxies"
        );
    }
}

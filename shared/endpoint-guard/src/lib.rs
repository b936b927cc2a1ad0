//! The endpoint guard: push endpoints are user input, so Tidings only ever connects to https
//! URLs on an allowlist of push-service hosts, at addresses that are not private, loopback,
//! link-local or otherwise internal — unless configured (tests and local demos allow them).
//!
//! The check runs twice: [`check`] before anything is sent (the api at registration, the pusher
//! before each request through a [`Guard`], reporting `permanent` without a connection), and
//! [`GuardedResolver`] inside the HTTP client, so the address actually connected to is the one
//! that was vetted even if DNS answers differently the second time.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The push services browsers use.
pub const DEFAULT_ALLOWED_HOSTS: &[&str] = &[
    "fcm.googleapis.com",
    "android.googleapis.com",
    "updates.push.services.mozilla.com",
    "*.push.services.mozilla.com",
    "web.push.apple.com",
    "*.push.apple.com",
    "*.notify.windows.com",
];

#[derive(Clone, Debug)]
pub struct EndpointPolicy {
    /// Exact host names, or `*.suffix` for any subdomain of `suffix`; each on port 443 unless
    /// the entry names another (`host:8443`) or any (`host:*`). An IPv6 address with a port is
    /// written in brackets (`[::1]:*`).
    pub allowed_hosts: Vec<String>,
    /// The hosts (and ports) that may be at private, loopback or link-local addresses, in the
    /// allowlist's form: `hooks.internal:8443` for one receiver inside the cluster, `127.0.0.1:*`
    /// for tests and local demos. Empty (the default): none may.
    pub private_hosts: Vec<String>,
    /// Allow plain http (tests only).
    pub allow_http: bool,
}

impl Default for EndpointPolicy {
    fn default() -> Self {
        EndpointPolicy {
            allowed_hosts: DEFAULT_ALLOWED_HOSTS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
            private_hosts: Vec::new(),
            allow_http: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("endpoint is not a valid URL")]
    NotAUrl,
    #[error("endpoint must use https, not {0}")]
    Scheme(String),
    #[error("endpoint host {0} is not an allowed push service")]
    Host(String),
    #[error("endpoint host {host} resolves to {addr}, a private or internal address")]
    Private { host: String, addr: IpAddr },
    #[error("endpoint host {0} does not resolve")]
    Unresolvable(String),
    #[error("endpoint must not carry a user name or password")]
    Credentials,
    #[error("endpoint must not carry a fragment")]
    Fragment,
    #[error("endpoint port {port} is not allowed for {host} (push services use 443)")]
    Port { host: String, port: u16 },
}

/// Whether `ip` is anything but a globally reachable unicast address: loopback, private,
/// link-local (169.254.169.254, the cloud metadata service, included), CGNAT, unspecified,
/// multicast, broadcast, documentation, benchmarking, protocol-assignment and reserved ranges.
///
/// IPv6 is judged by a positive list (global unicast `2000::/3`, less its special ranges), so a
/// range this function does not name (`fec0::/10`, `64:ff9b:1::/48`, `100::/64`) is internal. An
/// IPv6 address that embeds an IPv4 one (IPv4-mapped and IPv4-compatible `::/96`, NAT64
/// `64:ff9b::/96`, 6to4 `2002::/16`, Teredo `2001::/32`) is judged by the IPv4 address it reaches:
/// on a cluster with NAT64 egress, `[64:ff9b::a00:5]` is 10.0.0.5. A NAT64 address of a public
/// IPv4 one stays public, so DNS64 clusters can reach IPv4-only receivers.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_internal(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Embedded::One(v4) => v4_internal(v4),
            Embedded::Teredo { server, client } => v4_internal(server) || v4_internal(client),
            Embedded::None => v6_internal(v6),
        },
    }
}

/// IPv4 ranges that are not globally reachable (IANA's special-purpose registry).
fn v4_internal(v4: Ipv4Addr) -> bool {
    let o = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_broadcast()
        || v4.is_multicast()
        || v4.is_documentation()
        || o[0] == 0 // "this network", 0.0.0.0 included
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10, CGNAT
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0.0/24, protocol assignments
        || (o[0] == 192 && o[1] == 88 && o[2] == 99) // 192.88.99.0/24, 6to4 relays
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18.0.0/15, benchmarking
        || o[0] >= 240 // reserved
}

/// IPv6 outside global unicast, and the special ranges inside it.
fn v6_internal(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    (s[0] & 0xe000) != 0x2000 // not 2000::/3: loopback, ULA, link/site-local, multicast, …
        || (s[0] == 0x2001 && s[1] < 0x0200) // 2001::/23, protocol assignments (ORCHID, benchmarking)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x3fff && (s[1] & 0xf000) == 0) // 3fff::/20, documentation
}

/// The IPv4 address an IPv6 one leads to, where it embeds one.
#[derive(Debug, PartialEq, Eq)]
enum Embedded {
    None,
    One(Ipv4Addr),
    /// Teredo: the server's address, and the client's (stored inverted).
    Teredo {
        server: Ipv4Addr,
        client: Ipv4Addr,
    },
}

fn embedded_v4(v6: Ipv6Addr) -> Embedded {
    let s = v6.segments();
    let low = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d); `::` and `::1` are
        // IPv6's own unspecified and loopback addresses, internal either way.
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] => Embedded::One(low(hi, lo)),
        // NAT64, the well-known prefix.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Embedded::One(low(hi, lo)),
        // 6to4: the IPv4 address follows the prefix.
        [0x2002, hi, lo, ..] => Embedded::One(low(hi, lo)),
        [0x2001, 0, server_hi, server_lo, _, _, client_hi, client_lo] => Embedded::Teredo {
            server: low(server_hi, server_lo),
            client: low(!client_hi, !client_lo),
        },
        _ => Embedded::None,
    }
}

/// An allowlist entry split into its host pattern and the port it allows: `None` for any
/// (`:*`), else the port it names, 443 when it names none.
fn pattern_port(entry: &str) -> (&str, Option<u16>) {
    let split = match entry.strip_prefix('[') {
        // `[v6]` or `[v6]:port`
        Some(rest) => rest
            .split_once(']')
            .map(|(host, port)| (host, port.strip_prefix(':'))),
        // A bare IPv6 address has colons of its own and no port.
        None if entry.matches(':').count() > 1 => Some((entry, None)),
        None => Some(match entry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }),
    };
    match split {
        Some((host, Some("*"))) => (host, None),
        Some((host, Some(port))) => (host, Some(port.parse().unwrap_or(0))),
        Some((host, None)) => (host, Some(443)),
        None => (entry, Some(443)),
    }
}

/// The entries of `list` whose host pattern matches `host`, with the port each allows.
fn entries_for<'a>(list: &'a [String], host: &str) -> impl Iterator<Item = Option<u16>> + 'a {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    list.iter().filter_map(move |entry| {
        let (pattern, port) = pattern_port(entry);
        // `*` is any host: webhook endpoints are wherever their clients run.
        let matches = pattern == "*"
            || match pattern.strip_prefix("*.") {
                Some(suffix) => {
                    host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}"))
                }
                None => {
                    host == pattern
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_ascii_lowercase()
                }
            };
        matches.then_some(port)
    })
}

impl EndpointPolicy {
    fn host_allowed(&self, host: &str) -> bool {
        entries_for(&self.allowed_hosts, host).next().is_some()
    }

    fn port_allowed(&self, host: &str, port: u16) -> bool {
        // Port 0 is never a destination, whatever an entry allows (`host:*` included).
        port != 0
            && entries_for(&self.allowed_hosts, host)
                .any(|allowed| allowed.is_none_or(|p| p == port))
    }

    /// Whether `host` may be reached at `ip`: any public address, an internal one only where
    /// [`EndpointPolicy::private_hosts`] names the host (and `port`, when it is known: the
    /// resolver inside the HTTP client is given only the name, after the port was checked).
    fn address_allowed(&self, host: &str, port: Option<u16>, ip: IpAddr) -> bool {
        !is_internal(ip)
            || entries_for(&self.private_hosts, host)
                .any(|allowed| allowed.is_none_or(|p| port.is_none_or(|port| p == port)))
    }
}

/// Checks an endpoint without connecting: scheme, host, and every address it resolves to.
pub async fn check(endpoint: &str, policy: &EndpointPolicy) -> Result<reqwest::Url, Refused> {
    let (url, host) = check_url(endpoint, policy)?;
    if let Host::Name(name, port) = host {
        resolve(&name, port, policy).await?;
    }
    Ok(url)
}

/// An endpoint's host as [`check_url`] found it.
enum Host {
    /// An IP literal, judged by its address already; with the port.
    Literal(SocketAddr),
    /// A name still to resolve, and the port.
    Name(String, u16),
}

/// Everything [`check`] does short of resolving: the URL, and its host.
fn check_url(endpoint: &str, policy: &EndpointPolicy) -> Result<(reqwest::Url, Host), Refused> {
    let url = reqwest::Url::parse(endpoint).map_err(|_| Refused::NotAUrl)?;
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        other => return Err(Refused::Scheme(other.to_owned())),
    }
    // Credentials in the URL would be sent to the push service as Basic auth beside VAPID.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refused::Credentials);
    }
    if url.fragment().is_some() {
        return Err(Refused::Fragment);
    }
    let host = url.host_str().ok_or(Refused::NotAUrl)?.to_owned();
    // An IP literal is judged by its address first: "https://10.0.0.1/" is refused as private
    // even if someone put it on the allowlist.
    let literal = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok();
    let port = url.port_or_known_default().unwrap_or(443);
    if let Some(ip) = literal
        && !policy.address_allowed(&host, Some(port), ip)
    {
        return Err(Refused::Private { host, addr: ip });
    }
    if !policy.host_allowed(&host) {
        return Err(Refused::Host(host));
    }
    if !policy.port_allowed(&host, port) {
        return Err(Refused::Port { host, port });
    }
    let host = match literal {
        Some(ip) => Host::Literal(SocketAddr::new(ip, port)),
        None => Host::Name(host, port),
    };
    Ok((url, host))
}

/// How long a host that resolved to allowed addresses is not resolved again by [`Guard`].
pub const RESOLVED_FOR: Duration = Duration::from_secs(60);

/// The most hosts a [`Guard`] remembers (the allowlist keeps them few; `*.suffix` entries allow
/// more).
const REMEMBERED_HOSTS: usize = 1024;

/// [`check`] for a sender of many requests (the pusher): a host that resolved to allowed
/// addresses is not resolved again for [`RESOLVED_FOR`], so a push costs no DNS lookup (in
/// Kubernetes, with its search domains, several queries to the cluster's DNS) while its
/// connection is pooled anyway. That skips only the early answer: the client's
/// [`GuardedResolver`] still vets every address a new connection goes to. A refusal is not
/// remembered, so a host that stops failing is usable at once.
pub struct Guard {
    policy: Arc<EndpointPolicy>,
    /// Each host's lowest address, and when it was resolved.
    resolved: Mutex<HashMap<(String, u16), (Instant, IpAddr)>>,
    lookups: AtomicU64,
}

impl Guard {
    pub fn new(policy: Arc<EndpointPolicy>) -> Self {
        Guard {
            policy,
            resolved: Mutex::new(HashMap::new()),
            lookups: AtomicU64::new(0),
        }
    }

    pub async fn check(&self, endpoint: &str) -> Result<reqwest::Url, Refused> {
        self.check_at(endpoint).await.map(|(url, _)| url)
    }

    /// [`Guard::check`], with the receiver's address: the lowest the host resolved to (an IP
    /// literal's own) and the port. Names that resolve alike share it, so fairness keyed on it
    /// treats `a.hooks.example` and `b.hooks.example` on one address as one receiver.
    pub async fn check_at(&self, endpoint: &str) -> Result<(reqwest::Url, SocketAddr), Refused> {
        let (url, name, port) = match check_url(endpoint, &self.policy)? {
            (url, Host::Literal(addr)) => return Ok((url, addr)),
            (url, Host::Name(host, port)) => (url, (host, port), port),
        };
        let now = Instant::now();
        let remembered = (self.remembered().get(&name))
            .filter(|(at, _)| now.duration_since(*at) < RESOLVED_FOR)
            .map(|(_, ip)| *ip);
        if let Some(ip) = remembered {
            return Ok((url, SocketAddr::new(ip, port)));
        }
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let addrs = resolve(&name.0, name.1, &self.policy).await?;
        // `resolve` answers at least one address.
        let ip = addrs
            .iter()
            .map(SocketAddr::ip)
            .min()
            .ok_or(Refused::NotAUrl)?;
        let mut resolved = self.remembered();
        if resolved.len() >= REMEMBERED_HOSTS {
            resolved.retain(|_, (at, _)| now.duration_since(*at) < RESOLVED_FOR);
            if resolved.len() >= REMEMBERED_HOSTS {
                resolved.clear();
            }
        }
        resolved.insert(name, (now, ip));
        Ok((url, SocketAddr::new(ip, port)))
    }

    /// How many times a host was resolved.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), (Instant, IpAddr)>> {
        // The map holds no invariant a panicking holder could break.
        self.resolved.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn resolve(
    host: &str,
    port: u16,
    policy: &EndpointPolicy,
) -> Result<Vec<SocketAddr>, Refused> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| Refused::Unresolvable(host.to_owned()))?
        .collect();
    if addrs.is_empty() {
        return Err(Refused::Unresolvable(host.to_owned()));
    }
    let port = (port != 0).then_some(port);
    if let Some(bad) = addrs
        .iter()
        .find(|a| !policy.address_allowed(host, port, a.ip()))
    {
        return Err(Refused::Private {
            host: host.to_owned(),
            addr: bad.ip(),
        });
    }
    Ok(addrs)
}

/// A DNS resolver for reqwest that refuses names resolving to internal addresses.
pub struct GuardedResolver {
    policy: Arc<EndpointPolicy>,
}

impl GuardedResolver {
    pub fn new(policy: Arc<EndpointPolicy>) -> Self {
        GuardedResolver { policy }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let addrs = resolve(name.as_str(), 0, &policy).await?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Which push endpoints may be used: the pusher before each request and the api when a
/// subscription is registered read the same settings, so they cannot disagree.
#[derive(clap::Args, Clone, Debug)]
pub struct EndpointArgs {
    /// Allowed push-service hosts, comma-separated; `*.suffix` for subdomains; `default` for
    /// the browsers' push services (the list used when this is unset), e.g. `default,push.test`.
    #[arg(long, env = "TIDINGS_PUSH_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,
    /// Push-service hosts that may be at private, loopback or link-local addresses,
    /// comma-separated, as `host`, `host:port` or `host:*` (tests and local demos only).
    #[arg(long, env = "TIDINGS_PUSH_ALLOW_PRIVATE", value_delimiter = ',', value_parser = private_host)]
    pub allow_private: Vec<String>,
}

impl EndpointArgs {
    pub fn policy(&self) -> EndpointPolicy {
        let mut policy = EndpointPolicy::default();
        if let Some(hosts) = &self.allowed_hosts {
            policy.allowed_hosts = hosts
                .iter()
                .flat_map(|h| match h.trim() {
                    "default" => DEFAULT_ALLOWED_HOSTS
                        .iter()
                        .map(|d| (*d).to_owned())
                        .collect(),
                    other => vec![other.to_owned()],
                })
                .collect();
        }
        policy.private_hosts = self.allow_private.clone();
        policy
    }
}

/// One entry of an `…_ALLOW_PRIVATE` list. `true` was once a switch for every host and port;
/// it is refused with the form that replaced it, so an old setting fails at start, not open.
fn private_host(entry: &str) -> Result<String, String> {
    match entry.trim() {
        "true" | "1" | "yes" => Err(format!(
            "{entry:?}: name the hosts that may be private, e.g. hooks.internal:8443 or 127.0.0.1:* (one switch for every host is gone)"
        )),
        "" => Err("an empty host".to_owned()),
        host => Ok(host.to_owned()),
    }
}

/// Which webhook URLs API clients may register and the pusher posts to: the same guard as push
/// endpoints (https, no user info, no internal address, DNS checked again at connect, no
/// redirects), with any host allowed by default, on any port.
#[derive(clap::Args, Clone, Debug)]
pub struct WebhookArgs {
    /// Allowed webhook hosts, comma-separated, as for TIDINGS_PUSH_ALLOWED_HOSTS; `*` is any
    /// host (`*:*` on any port, the default).
    #[arg(
        long = "webhook-allowed-hosts",
        env = "TIDINGS_WEBHOOK_ALLOWED_HOSTS",
        value_delimiter = ',',
        default_value = "*:*"
    )]
    pub webhook_allowed_hosts: Vec<String>,
    /// Webhook hosts that may be at private, loopback or link-local addresses, comma-separated,
    /// as `host`, `host:port` or `host:*`: a receiver inside the cluster on purpose
    /// (`hooks.internal:8443`), or tests and local demos (`127.0.0.1:*`). No other client's URL
    /// reaches inside.
    #[arg(
        long = "webhook-allow-private",
        env = "TIDINGS_WEBHOOK_ALLOW_PRIVATE",
        value_delimiter = ',',
        value_parser = private_host
    )]
    pub webhook_allow_private: Vec<String>,
    /// Allow plain http webhook URLs (tests and local demos only).
    #[arg(
        long = "webhook-allow-http",
        env = "TIDINGS_WEBHOOK_ALLOW_HTTP",
        default_value_t = false
    )]
    pub webhook_allow_http: bool,
}

impl WebhookArgs {
    pub fn policy(&self) -> EndpointPolicy {
        EndpointPolicy {
            allowed_hosts: self
                .webhook_allowed_hosts
                .iter()
                .map(|h| h.trim().to_owned())
                .collect(),
            private_hosts: self.webhook_allow_private.clone(),
            allow_http: self.webhook_allow_http,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn webhooks_go_to_any_public_host_and_port_but_never_inside() {
        let any = allow(&["*:*"]);
        assert!(
            check("https://hooks.example.com:8443/in", &any)
                .await
                .is_err_and(|e| matches!(e, Refused::Unresolvable(_)))
        );
        assert_eq!(
            check("https://93.184.215.14:8443/in", &any)
                .await
                .unwrap()
                .port(),
            Some(8443)
        );
        for (url, refused) in [
            ("http://93.184.215.14/in", Refused::Scheme("http".into())),
            ("https://user:pw@93.184.215.14/in", Refused::Credentials),
            ("https://93.184.215.14/in#x", Refused::Fragment),
        ] {
            assert_eq!(check(url, &any).await, Err(refused), "{url}");
        }
        for url in [
            "https://127.0.0.1/in",
            "https://10.1.2.3/in",
            "https://[::1]/in",
            "https://169.254.169.254/latest",
        ] {
            assert!(
                matches!(check(url, &any).await, Err(Refused::Private { .. })),
                "{url}"
            );
        }
        let port_443 = allow(&["*"]);
        assert_eq!(
            check("https://93.184.215.14:8443/in", &port_443).await,
            Err(Refused::Port {
                host: "93.184.215.14".into(),
                port: 8443
            })
        );
        let testing = EndpointPolicy {
            private_hosts: vec!["127.0.0.1:9000".into()],
            allow_http: true,
            ..any
        };
        assert!(check("http://127.0.0.1:9000/in", &testing).await.is_ok());
    }

    #[test]
    fn default_in_the_list_stands_for_the_browsers_push_services() {
        let args = EndpointArgs {
            allowed_hosts: Some(vec!["127.0.0.1:*".into(), "default".into()]),
            allow_private: vec!["127.0.0.1:*".into()],
        };
        let hosts = args.policy().allowed_hosts;
        assert_eq!(hosts[0], "127.0.0.1:*");
        assert_eq!(&hosts[1..], DEFAULT_ALLOWED_HOSTS);
        let unset = EndpointArgs {
            allowed_hosts: None,
            allow_private: Vec::new(),
        };
        assert_eq!(unset.policy().allowed_hosts, DEFAULT_ALLOWED_HOSTS);
    }

    fn allow(hosts: &[&str]) -> EndpointPolicy {
        EndpointPolicy {
            allowed_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            ..EndpointPolicy::default()
        }
    }

    #[tokio::test]
    async fn a_guard_resolves_a_host_once_a_while_and_never_remembers_a_refusal() {
        let allowed = Guard::new(Arc::new(EndpointPolicy {
            private_hosts: vec!["localhost:*".into(), "127.0.0.1:*".into()],
            ..allow(&["localhost:*", "127.0.0.1:*"])
        }));
        for path in ["a", "b", "c"] {
            let url = allowed
                .check(&format!("https://localhost:8443/{path}"))
                .await;
            assert_eq!(url.unwrap().path(), format!("/{path}"));
        }
        assert_eq!(allowed.lookups(), 1, "one lookup for three pushes");
        allowed.check("https://localhost:9443/a").await.unwrap();
        assert_eq!(allowed.lookups(), 2, "another port is looked up on its own");
        allowed.check("https://127.0.0.1:8443/a").await.unwrap();
        assert_eq!(allowed.lookups(), 2, "an address is not looked up");
        // Everything but the lookup is still checked every time.
        assert_eq!(
            allowed.check("http://localhost:8443/a").await,
            Err(Refused::Scheme("http".into()))
        );
        assert_eq!(
            allowed.check("https://push.example/a").await,
            Err(Refused::Host("push.example".into()))
        );

        let private = Guard::new(Arc::new(allow(&["localhost:*"])));
        for _ in 0..2 {
            let refused = private.check("https://localhost:8443/a").await;
            assert!(
                matches!(refused, Err(Refused::Private { .. })),
                "{refused:?}"
            );
        }
        assert_eq!(private.lookups(), 2, "a refusal is not remembered");
    }

    #[tokio::test]
    async fn refuses_what_is_not_an_allowed_https_push_service() {
        let p = EndpointPolicy::default();
        assert_eq!(
            check("http://fcm.googleapis.com/x", &p).await.unwrap_err(),
            Refused::Scheme("http".into())
        );
        assert!(matches!(
            check("https://10.0.0.1/x", &p).await.unwrap_err(),
            Refused::Private { .. }
        ));
        assert!(matches!(
            check("https://169.254.169.254/latest", &p)
                .await
                .unwrap_err(),
            Refused::Private { .. }
        ));
        assert!(matches!(
            check("https://[::1]/x", &p).await.unwrap_err(),
            Refused::Private { .. }
        ));
        assert_eq!(
            check("https://evil.example/x", &p).await.unwrap_err(),
            Refused::Host("evil.example".into())
        );
        assert_eq!(check("not a url", &p).await.unwrap_err(), Refused::NotAUrl);
    }

    #[tokio::test]
    async fn an_allowed_name_that_resolves_to_loopback_is_refused() {
        let p = allow(&["localhost"]);
        assert!(matches!(
            check("https://localhost/x", &p).await.unwrap_err(),
            Refused::Private { .. }
        ));
        let open = EndpointPolicy {
            private_hosts: vec!["localhost".into()],
            ..allow(&["localhost"])
        };
        check("https://localhost/x", &open).await.unwrap();
    }

    #[tokio::test]
    async fn credentials_fragments_and_other_ports_are_refused() {
        let p = allow(&[
            "fcm.googleapis.com",
            "push.example:8443",
            "[2a00:1450::1]:*",
        ]);
        let credentials = [
            "https://user:pw@fcm.googleapis.com/x",
            "https://user@fcm.googleapis.com/x",
            "https://:pw@fcm.googleapis.com/x",
        ];
        for endpoint in credentials {
            assert_eq!(
                check(endpoint, &p).await.unwrap_err(),
                Refused::Credentials,
                "{endpoint}"
            );
        }
        for endpoint in [
            "https://fcm.googleapis.com/x#frag",
            "https://fcm.googleapis.com/x#",
        ] {
            assert_eq!(
                check(endpoint, &p).await.unwrap_err(),
                Refused::Fragment,
                "{endpoint}"
            );
        }
        for port in [0u16, 1, 80, 8443, 65535] {
            let endpoint = format!("https://fcm.googleapis.com:{port}/x");
            assert_eq!(
                check(&endpoint, &p).await.unwrap_err(),
                Refused::Port {
                    host: "fcm.googleapis.com".into(),
                    port
                },
                "{endpoint}"
            );
        }
        // 443 written out is 443; an entry may allow another port, or any.
        assert!(p.port_allowed("fcm.googleapis.com", 443));
        assert!(p.port_allowed("push.example", 8443));
        assert!(!p.port_allowed("push.example", 443));
        assert!(p.port_allowed("[2a00:1450::1]", 9));
        assert_eq!(pattern_port("127.0.0.1:*"), ("127.0.0.1", None));
        // Regression: `127.0.0.1:*` let an endpoint on port 0 through.
        let any = EndpointPolicy {
            allowed_hosts: vec!["127.0.0.1:*".into()],
            ..EndpointPolicy::default()
        };
        assert!(any.port_allowed("127.0.0.1", 8443));
        assert!(!any.port_allowed("127.0.0.1", 0));
        assert_eq!(pattern_port("::1"), ("::1", Some(443)));
        assert_eq!(pattern_port("[::1]:8443"), ("::1", Some(8443)));
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let p = EndpointPolicy::default();
        assert!(p.host_allowed("wns2-by3p.notify.windows.com"));
        assert!(p.host_allowed("FCM.googleapis.com"));
        assert!(!p.host_allowed("notify.windows.com"));
        assert!(!p.host_allowed("evilnotify.windows.com"));
        assert!(!p.host_allowed("fcm.googleapis.com.evil.example"));
    }

    /// Every range the guard knows, at its edges: (address, internal, what it is).
    const ADDRESSES: &[(&str, bool, &str)] = &[
        ("0.0.0.0", true, "unspecified"),
        ("0.255.255.255", true, "this network"),
        ("10.0.0.1", true, "private"),
        ("100.64.0.1", true, "CGNAT"),
        ("100.127.255.255", true, "CGNAT, last"),
        ("100.128.0.1", false, "past CGNAT"),
        ("127.0.0.1", true, "loopback"),
        ("169.254.169.254", true, "link-local, cloud metadata"),
        ("172.16.0.1", true, "private"),
        ("172.32.0.1", false, "past 172.16/12"),
        ("192.0.0.8", true, "protocol assignments"),
        ("192.0.2.1", true, "documentation"),
        ("192.88.99.1", true, "6to4 relay anycast"),
        ("192.168.1.1", true, "private"),
        ("198.18.0.1", true, "benchmarking"),
        ("198.19.255.255", true, "benchmarking, last"),
        ("198.20.0.1", false, "past benchmarking"),
        ("198.51.100.1", true, "documentation"),
        ("203.0.113.1", true, "documentation"),
        ("224.0.0.1", true, "multicast"),
        ("240.0.0.1", true, "reserved"),
        ("255.255.255.255", true, "broadcast"),
        ("142.250.74.106", false, "public"),
        ("::", true, "unspecified"),
        ("::1", true, "loopback"),
        ("::ffff:10.0.0.1", true, "IPv4-mapped private"),
        ("::ffff:142.250.74.106", false, "IPv4-mapped public"),
        ("::10.0.0.1", true, "IPv4-compatible private"),
        ("::127.0.0.1", true, "IPv4-compatible loopback"),
        ("64:ff9b::a00:5", true, "NAT64 of 10.0.0.5"),
        ("64:ff9b::7f00:1", true, "NAT64 of 127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", true, "NAT64 of the metadata address"),
        (
            "64:ff9b::8efa:4a6a",
            false,
            "NAT64 of a public address (DNS64)",
        ),
        ("64:ff9b:1::a00:5", true, "local-use NAT64"),
        ("2002:a00:5::1", true, "6to4 of 10.0.0.5"),
        ("2002:7f00:1::", true, "6to4 of 127.0.0.1"),
        ("2002:8efa:4a6a::1", false, "6to4 of a public address"),
        // Teredo: server 65.54.227.120, client 10.0.0.5 stored inverted (f5ff:fffa).
        (
            "2001:0:4136:e378:8000:63bf:f5ff:fffa",
            true,
            "Teredo to a private client",
        ),
        (
            "2001:0:a00:5:8000:63bf:bdc9:b595",
            true,
            "Teredo through a private server",
        ),
        ("2001:2::1", true, "benchmarking"),
        ("2001:10::1", true, "ORCHID"),
        ("2001:db8::1", true, "documentation"),
        ("3fff::1", true, "documentation (RFC 9637)"),
        ("100::1", true, "discard-only"),
        ("fc00::1", true, "unique local"),
        ("fd00::1", true, "unique local"),
        ("fe80::1", true, "link-local"),
        ("fec0::1", true, "site-local (deprecated)"),
        ("ff02::1", true, "multicast"),
        ("2a00:1450:4001::200e", false, "public"),
        ("2606:4700::1111", false, "public"),
    ];

    #[test]
    fn every_range_is_judged_by_where_it_leads() {
        for (ip, internal, what) in ADDRESSES {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(is_internal(addr), *internal, "{ip} ({what})");
        }
    }

    #[tokio::test]
    async fn embedded_ipv4_literals_are_refused_at_registration() {
        let any = allow(&["*:*"]);
        for literal in [
            "64:ff9b::a00:5",
            "2002:a00:5::1",
            "::10.0.0.5",
            "64:ff9b:1::a00:5",
        ] {
            let url = format!("https://[{literal}]:8443/in");
            assert!(
                matches!(check(&url, &any).await, Err(Refused::Private { .. })),
                "{url}"
            );
        }
    }

    #[test]
    fn private_addresses_are_allowed_per_host_and_port_not_for_all() {
        let policy = EndpointPolicy {
            private_hosts: vec!["hooks.internal:8443".into(), "[fd00::7]:*".into()],
            ..allow(&["*:*"])
        };
        let ten: IpAddr = "10.0.0.5".parse().unwrap();
        assert!(policy.address_allowed("hooks.internal", Some(8443), ten));
        assert!(
            policy.address_allowed("HOOKS.internal.", None, ten),
            "the resolver knows no port"
        );
        assert!(
            !policy.address_allowed("hooks.internal", Some(443), ten),
            "another port"
        );
        assert!(
            !policy.address_allowed("other.example", Some(8443), ten),
            "another host"
        );
        let ula: IpAddr = "fd00::7".parse().unwrap();
        assert!(policy.address_allowed("[fd00::7]", Some(1), ula));
        assert!(!policy.address_allowed("[fd00::8]", Some(1), "fd00::8".parse().unwrap()));
    }

    #[test]
    fn one_switch_for_every_private_host_is_refused() {
        assert!(private_host("true").is_err());
        assert_eq!(
            private_host(" hooks.internal:8443 "),
            Ok("hooks.internal:8443".into())
        );
    }
}

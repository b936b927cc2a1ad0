//! The endpoint guard: push endpoints are user input, so Tidings only ever connects to https
//! URLs on an allowlist of push-service hosts, at addresses that are not private, loopback,
//! link-local or otherwise internal — unless configured (tests and local demos allow them).
//!
//! The check runs twice: [`check`] before anything is sent (the api at registration, the pusher
//! before each request through a [`Guard`], reporting `permanent` without a connection), and
//! [`GuardedResolver`] inside the HTTP client, so the address actually connected to is the one
//! that was vetted even if DNS answers differently the second time.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
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
    /// Allow private, loopback and link-local addresses (tests, local demos). Never in production.
    pub allow_private: bool,
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
            allow_private: false,
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

/// Loopback, private, link-local (incl. 169.254.169.254 metadata), CGNAT, unspecified,
/// multicast, documentation and unique-local ranges: nothing a push service lives at.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10
                || o[0] == 0
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link local
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        }
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

impl EndpointPolicy {
    fn host_allowed(&self, host: &str) -> bool {
        self.entries_for(host).next().is_some()
    }

    /// The allowlist entries whose host pattern matches `host`, with the port each allows.
    fn entries_for<'a>(&'a self, host: &str) -> impl Iterator<Item = Option<u16>> + 'a {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        self.allowed_hosts.iter().filter_map(move |entry| {
            let (pattern, port) = pattern_port(entry);
            // `*` is any host: webhook endpoints are wherever their clients run.
            let matches = pattern == "*"
                || match pattern.strip_prefix("*.") {
                    Some(suffix) => {
                        host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}"))
                    }
                    None => host == pattern.to_ascii_lowercase(),
                };
            matches.then_some(port)
        })
    }

    fn port_allowed(&self, host: &str, port: u16) -> bool {
        // Port 0 is never a destination, whatever an entry allows (`host:*` included).
        port != 0
            && self
                .entries_for(host)
                .any(|allowed| allowed.is_none_or(|p| p == port))
    }

    fn address_allowed(&self, ip: IpAddr) -> bool {
        self.allow_private || !is_internal(ip)
    }
}

/// Checks an endpoint without connecting: scheme, host, and every address it resolves to.
pub async fn check(endpoint: &str, policy: &EndpointPolicy) -> Result<reqwest::Url, Refused> {
    let (url, name) = check_url(endpoint, policy)?;
    if let Some((host, port)) = name {
        resolve(&host, port, policy).await?;
    }
    Ok(url)
}

/// Everything [`check`] does short of resolving: the URL, and the host name and port still to
/// resolve (`None` for an IP literal, judged by its address here).
fn check_url(
    endpoint: &str,
    policy: &EndpointPolicy,
) -> Result<(reqwest::Url, Option<(String, u16)>), Refused> {
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
    if let Some(ip) = literal
        && !policy.address_allowed(ip)
    {
        return Err(Refused::Private { host, addr: ip });
    }
    if !policy.host_allowed(&host) {
        return Err(Refused::Host(host));
    }
    let port = url.port_or_known_default().unwrap_or(443);
    if !policy.port_allowed(&host, port) {
        return Err(Refused::Port { host, port });
    }
    let name = literal.is_none().then_some((host, port));
    Ok((url, name))
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
    resolved: Mutex<HashMap<(String, u16), Instant>>,
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
        let (url, name) = check_url(endpoint, &self.policy)?;
        let Some(name) = name else { return Ok(url) };
        let now = Instant::now();
        let fresh = self
            .remembered()
            .get(&name)
            .is_some_and(|at| now.duration_since(*at) < RESOLVED_FOR);
        if !fresh {
            self.lookups.fetch_add(1, Ordering::Relaxed);
            resolve(&name.0, name.1, &self.policy).await?;
            let mut resolved = self.remembered();
            if resolved.len() >= REMEMBERED_HOSTS {
                resolved.retain(|_, at| now.duration_since(*at) < RESOLVED_FOR);
                if resolved.len() >= REMEMBERED_HOSTS {
                    resolved.clear();
                }
            }
            resolved.insert(name, now);
        }
        Ok(url)
    }

    /// How many times a host was resolved.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), Instant>> {
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
    if let Some(bad) = addrs.iter().find(|a| !policy.address_allowed(a.ip())) {
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
    /// Allow private, loopback and link-local endpoint addresses (tests and local demos only).
    #[arg(long, env = "TIDINGS_PUSH_ALLOW_PRIVATE", default_value_t = false)]
    pub allow_private: bool,
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
        policy.allow_private = self.allow_private;
        policy
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
    /// Allow webhook URLs at private, loopback and link-local addresses (tests, local demos, or
    /// receivers inside the cluster on purpose).
    #[arg(
        long = "webhook-allow-private",
        env = "TIDINGS_WEBHOOK_ALLOW_PRIVATE",
        default_value_t = false
    )]
    pub webhook_allow_private: bool,
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
            allow_private: self.webhook_allow_private,
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
            allow_private: true,
            allow_http: true,
            ..any
        };
        assert!(check("http://127.0.0.1:9000/in", &testing).await.is_ok());
    }

    #[test]
    fn default_in_the_list_stands_for_the_browsers_push_services() {
        let args = EndpointArgs {
            allowed_hosts: Some(vec!["127.0.0.1:*".into(), "default".into()]),
            allow_private: true,
        };
        let hosts = args.policy().allowed_hosts;
        assert_eq!(hosts[0], "127.0.0.1:*");
        assert_eq!(&hosts[1..], DEFAULT_ALLOWED_HOSTS);
        let unset = EndpointArgs {
            allowed_hosts: None,
            allow_private: false,
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
            allow_private: true,
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
            allow_private: true,
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

    #[test]
    fn internal_ranges() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["142.250.74.106", "2a00:1450:4001::200e"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }
}

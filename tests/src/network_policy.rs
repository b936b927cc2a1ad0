//! What a rendered overlay's NetworkPolicies let a pod reach, read as Kubernetes reads them:
//! a pod selected by no egress policy may go anywhere; one selected by any may go where at
//! least one rule of one of them allows.

use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;

use crate::manifests::Overlay;

/// Somewhere a pod sends a packet.
pub struct Destination<'a> {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: &'a str,
    /// The namespace of the pod there, and its labels; `None` outside the cluster.
    pub pod: Option<(&'a str, &'a [(&'a str, &'a str)])>,
}

fn labels_match(selector: &Value, labels: &HashMap<String, String>) -> bool {
    let exact = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let value = labels.get(key).map(String::as_str);
            match e["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => !value.is_some_and(|v| values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                other => panic!("selector operator {other:?}"),
            }
        });
    exact && expressions
}

fn bits(ip: IpAddr) -> (u128, u32) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

/// Whether `ip` is in `cidr` (`a.b.c.d/n` or an IPv6 prefix); never across families.
fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("a CIDR has a length");
    let net: IpAddr = net.parse().expect("a CIDR's address");
    let len: u32 = len.parse().expect("a CIDR's length");
    let ((a, width), (b, other)) = (bits(ip), bits(net));
    if width != other {
        return false;
    }
    let host = width - len;
    len == 0 || (a >> host) == (b >> host)
}

fn peer_allows(peer: &Value, to: &Destination) -> bool {
    if let Some(block) = peer.get("ipBlock") {
        let cidr = block["cidr"].as_str().expect("ipBlock.cidr");
        let except = block["except"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        return in_cidr(to.ip, cidr) && !except.into_iter().any(|e| in_cidr(to.ip, e));
    }
    let Some((namespace, labels)) = to.pod else {
        return false;
    };
    let namespace_labels = HashMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        namespace.to_owned(),
    )]);
    let pod_labels: HashMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let namespace_ok = peer
        .get("namespaceSelector")
        .is_none_or(|s| labels_match(s, &namespace_labels));
    // A peer without a namespace selector means pods of the policy's own namespace; Tidings'
    // policies always name one.
    assert!(
        peer.get("namespaceSelector").is_some(),
        "a peer without a namespace: {peer}"
    );
    let pod_ok = peer
        .get("podSelector")
        .is_none_or(|s| labels_match(s, &pod_labels));
    namespace_ok && pod_ok
}

fn rule_allows(rule: &Value, to: &Destination) -> bool {
    let ports = rule["ports"].as_array().filter(|p| !p.is_empty());
    let port_ok = ports.is_none_or(|ports| {
        ports.iter().any(|p| {
            p["port"].as_u64() == Some(u64::from(to.port))
                && p["protocol"].as_str().unwrap_or("TCP") == to.protocol
        })
    });
    let peers = rule["to"].as_array().filter(|p| !p.is_empty());
    port_ok && peers.is_none_or(|peers| peers.iter().any(|peer| peer_allows(peer, to)))
}

impl Overlay {
    /// The pod labels of the Deployment or StatefulSet `workload`.
    fn pod_labels(&self, workload: &str) -> HashMap<String, String> {
        let doc = self
            .find("Deployment", workload)
            .or_else(|| self.find("StatefulSet", workload))
            .unwrap_or_else(|| panic!("no workload {workload}"));
        doc["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect()
    }

    /// Whether the overlay's NetworkPolicies let `workload`'s pods send to `to`.
    pub fn egress_allows(&self, workload: &str, to: &Destination) -> bool {
        let labels = self.pod_labels(workload);
        let policies: Vec<&Value> = self
            .docs()
            .iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .filter(|d| {
                d["spec"]["policyTypes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t == "Egress")
            })
            .filter(|d| labels_match(&d["spec"]["podSelector"], &labels))
            .collect();
        policies.is_empty()
            || policies.iter().any(|p| {
                p["spec"]["egress"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| rule_allows(r, to))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_hold_what_they_should() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(in_cidr(ip("10.1.2.3"), "10.0.0.0/8"));
        assert!(!in_cidr(ip("11.1.2.3"), "10.0.0.0/8"));
        assert!(in_cidr(ip("8.8.8.8"), "0.0.0.0/0"));
        assert!(!in_cidr(ip("::1"), "0.0.0.0/0"));
        assert!(in_cidr(ip("::ffff:10.0.0.1"), "::ffff:0:0/96"));
        assert!(in_cidr(ip("fd00::1"), "fc00::/7"));
        assert!(!in_cidr(ip("2606:2800::1"), "fc00::/7"));
    }
}

//! Who the NetworkPolicies let reach the webhook's admission port, judged against the nodes' pod
//! ranges: the facts behind [`helmop_core::check::admission_port`]. Pure; `check` reads the objects.

use std::collections::BTreeMap;

use helmop_core::check::PortAdmits;
use helmop_images::policy::Cidr;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The admission port as policies may name it: its number and, when the container names it, its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionPort {
    pub number: i32,
    pub name: Option<String>,
}

/// Whether `policy` applies to ingress of pods labelled `labels` (an absent `policyTypes` means
/// Ingress, as the API server defaults it). A selector that does not compile selects nothing,
/// as the API server would have refused it.
pub fn selects(policy: &NetworkPolicy, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = &policy.spec else {
        return false;
    };
    let ingress = spec
        .policy_types
        .as_ref()
        .is_none_or(|types| types.iter().any(|t| t == "Ingress"));
    // An absent podSelector is the empty one: every pod of the namespace.
    ingress
        && spec.pod_selector.as_ref().is_none_or(|selector| {
            helmop_core::selector::matches(selector, labels).unwrap_or(false)
        })
}

fn port_matches(rule_port: &NetworkPolicyPort, port: &AdmissionPort) -> bool {
    if rule_port.protocol.as_deref().is_some_and(|p| p != "TCP") {
        return false;
    }
    match &rule_port.port {
        None => true,
        Some(IntOrString::Int(p)) => {
            let end = rule_port.end_port.unwrap_or(*p);
            (*p..=end).contains(&port.number)
        }
        Some(IntOrString::String(name)) => port.name.as_deref() == Some(name.as_str()),
    }
}

/// What `policies` (those that [`selects`] the webhook's pods) admit on `port`. `ranges`: the nodes'
/// pod ranges as `(node, cidr)`, `None` when unknown. A range counts as admitted when an ipBlock
/// overlaps it and none of that block's `except` entries covers it whole.
pub fn admits(
    policies: &[NetworkPolicy],
    port: &AdmissionPort,
    ranges: Option<&[(String, Cidr)]>,
) -> PortAdmits {
    let mut out = PortAdmits {
        known_ranges: ranges.filter(|r| !r.is_empty()).map(|r| {
            r.iter()
                .map(|(node, _)| node)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        }),
        ..PortAdmits::default()
    };
    let mut admitted: Vec<String> = Vec::new();
    for policy in policies {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let rules = policy
            .spec
            .as_ref()
            .and_then(|s| s.ingress.as_deref())
            .unwrap_or_default();
        for rule in rules {
            let on_port = rule.ports.as_deref().is_none_or(|ports| {
                ports.is_empty() || ports.iter().any(|p| port_matches(p, port))
            });
            if !on_port {
                continue;
            }
            let peers = rule.from.as_deref().unwrap_or_default();
            if peers.is_empty() {
                out.everyone.push(name.clone());
                continue;
            }
            for peer in peers {
                if peer.pod_selector.is_some() || peer.namespace_selector.is_some() {
                    out.selected_pods.push(name.clone());
                }
                let Some(block) = &peer.ip_block else {
                    continue;
                };
                let Ok(cidr) = block.cidr.parse::<Cidr>() else {
                    continue;
                };
                let except: Vec<Cidr> = block
                    .except
                    .iter()
                    .flatten()
                    .filter_map(|e| e.parse().ok())
                    .collect();
                for (node, range) in ranges.unwrap_or_default() {
                    if cidr.overlaps(range) && !except.iter().any(|e| e.covers(range)) {
                        admitted.push(format!("{node} ({range})"));
                    }
                }
            }
        }
    }
    for list in [&mut out.everyone, &mut out.selected_pods, &mut admitted] {
        list.sort();
        list.dedup();
    }
    out.pod_ranges = admitted;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json).unwrap()
    }

    fn shipped(except: &[&str]) -> NetworkPolicy {
        policy(serde_json::json!({
            "metadata": {"name": "helmop-webhook"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmop-webhook"}},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"ports": [{"port": 8443, "protocol": "TCP"}],
                     "from": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": except}}]},
                    {"ports": [{"port": 8080, "protocol": "TCP"}]},
                ],
            },
        }))
    }

    fn port() -> AdmissionPort {
        AdmissionPort {
            number: 8443,
            name: Some("https".into()),
        }
    }

    fn ranges(list: &[(&str, &str)]) -> Vec<(String, Cidr)> {
        list.iter()
            .map(|(n, c)| (n.to_string(), c.parse().unwrap()))
            .collect()
    }

    #[test]
    fn the_shipped_policy_keeps_off_only_the_ranges_it_excepts() {
        let nodes = ranges(&[("n1", "10.42.0.0/24"), ("n2", "10.244.1.0/24")]);
        let found = admits(&[shipped(&["10.42.0.0/16"])], &port(), Some(&nodes));
        assert_eq!(found.pod_ranges, vec!["n2 (10.244.1.0/24)"]);
        assert_eq!(found.known_ranges, Some(2));
        assert!(
            found.everyone.is_empty(),
            "the open admin-port rule is not the admission port"
        );

        let found = admits(
            &[shipped(&["10.42.0.0/16", "10.244.0.0/16"])],
            &port(),
            Some(&nodes),
        );
        assert!(found.pod_ranges.is_empty(), "{found:?}");

        let found = admits(&[shipped(&["10.42.0.0/16"])], &port(), None);
        assert_eq!((found.pod_ranges.len(), found.known_ranges), (0, None));
    }

    #[test]
    fn open_rules_selectors_and_ports_are_told_apart() {
        let open = policy(serde_json::json!({
            "metadata": {"name": "open"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": "https"}]}]},
        }));
        assert_eq!(admits(&[open], &port(), None).everyone, vec!["open"]);

        let by_pods = policy(serde_json::json!({
            "metadata": {"name": "agents"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]},
        }));
        assert_eq!(
            admits(&[by_pods], &port(), None).selected_pods,
            vec!["agents"]
        );

        let elsewhere = policy(serde_json::json!({
            "metadata": {"name": "other-port"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 9000, "endPort": 9100}]}]},
        }));
        assert_eq!(admits(&[elsewhere], &port(), None), PortAdmits::default());

        let range = policy(serde_json::json!({
            "metadata": {"name": "range"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 8000, "endPort": 9000}]}]},
        }));
        assert_eq!(admits(&[range], &port(), None).everyone, vec!["range"]);
    }

    #[test]
    fn a_policy_selects_by_labels_and_ingress() {
        let labels: BTreeMap<String, String> = [(
            "app.kubernetes.io/name".to_owned(),
            "helmop-webhook".to_owned(),
        )]
        .into();
        assert!(selects(&shipped(&[]), &labels));
        assert!(!selects(&shipped(&[]), &BTreeMap::new()));
        let egress_only = policy(serde_json::json!({
            "metadata": {"name": "e"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
        }));
        assert!(!selects(&egress_only, &labels));
    }
}

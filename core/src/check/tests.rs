use super::*;

const DAY: i64 = 86_400;
const NOW: i64 = 1_800_000_000;

fn hook(name: &str, ca: bool) -> WebhookFact {
    WebhookFact {
        name: name.into(),
        ca_bundle: ca,
    }
}

fn verdicts(findings: &[Finding]) -> Vec<Verdict> {
    findings.iter().map(|f| f.verdict).collect()
}

#[test]
fn every_problem_has_a_fix() {
    let mut all = webhook_configurations("w", &ConfigFact::Absent, &ConfigFact::Absent);
    all.extend(webhook_configurations(
        "w",
        &ConfigFact::Present(vec![hook("a", false)]),
        &ConfigFact::Absent,
    ));
    all.push(validating_answer("w", "ns", &ValidatingProbe::Admitted));
    all.push(validating_answer(
        "w",
        "ns",
        &ValidatingProbe::CallFailed {
            message: "x509".into(),
        },
    ));
    all.push(mutating_answer("w", Some("ns"), &MutatingProbe::NotStamped));
    all.push(hash_key("a/b", &Presence::Absent));
    all.push(lease(
        LeaseRole::RolloutWatcher,
        "n/l",
        &LeaseFact::Present {
            holder: Some("p".into()),
            renewed: Some(NOW - 3600),
            duration: Some(15),
        },
        NOW,
    ));
    assert!(
        all.iter().all(|f| f.verdict == Verdict::Problem),
        "{all:#?}"
    );
    for f in &all {
        let fix = f.fix.as_deref().unwrap_or_default();
        assert!(!fix.is_empty() && !fix.contains('\n'), "{f:?}");
    }
}

#[test]
fn full_install_is_ok() {
    let v = ConfigFact::Present(vec![hook("helmops.validate.helmop.dev", true)]);
    let m = ConfigFact::Present(vec![hook("workloads.mutate.helmop.dev", true)]);
    let f = webhook_configurations("helmop-webhook", &v, &m);
    assert_eq!(verdicts(&f), [Verdict::Ok, Verdict::Ok]);
    assert_eq!(f[0].subject, "validating/helmop-webhook");
    assert_eq!(f[1].message, "1 webhook: workloads.mutate.helmop.dev");
}

#[test]
fn stamping_only_is_ok_and_says_so() {
    let m = ConfigFact::Present(vec![hook("w", true)]);
    let f = webhook_configurations("helmop-webhook", &ConfigFact::Present(vec![]), &m);
    assert_eq!(verdicts(&f), [Verdict::Ok, Verdict::Ok]);
    assert!(f[0].message.contains("stamping-only"), "{}", f[0].message);
    // Only the mutating one, no validating configuration at all: a warning, not a problem.
    let f = webhook_configurations("helmop-webhook", &ConfigFact::Absent, &m);
    assert_eq!(verdicts(&f), [Verdict::Warning, Verdict::Ok]);
}

#[test]
fn missing_configurations_and_ca_bundles_are_problems() {
    let f = webhook_configurations("x", &ConfigFact::Absent, &ConfigFact::Absent);
    assert_eq!(verdicts(&f), [Verdict::Problem]);
    assert!(f[0].message.contains("not installed"));
    let v = ConfigFact::Present(vec![hook("a", true), hook("b", false)]);
    let m = ConfigFact::Unreadable("forbidden".into());
    let f = webhook_configurations("x", &v, &m);
    assert_eq!(verdicts(&f), [Verdict::Problem, Verdict::Warning]);
    assert!(
        f[0].message.contains("no caBundle in b"),
        "{}",
        f[0].message
    );
}

#[test]
fn validating_answers() {
    let ok = validating_answer(
        "w",
        "ns",
        &ValidatingProbe::Denied {
            webhook: "helmops.validate.helmop.dev".into(),
        },
    );
    assert_eq!(ok.verdict, Verdict::Ok);
    assert_eq!(
        validating_answer("w", "ns", &ValidatingProbe::CrdAbsent).verdict,
        Verdict::Ok
    );
    let other = validating_answer(
        "w",
        "ns",
        &ValidatingProbe::DeniedByOther {
            message: "quota".into(),
        },
    );
    assert_eq!(other.verdict, Verdict::Warning);
}

#[test]
fn mutating_answers() {
    assert_eq!(
        mutating_answer("w", None, &MutatingProbe::NoNamespace).verdict,
        Verdict::Ok
    );
    let f = mutating_answer(
        "w",
        Some("apps"),
        &MutatingProbe::Stamped {
            stamp: "v2:0123456789abcdef0123456789".into(),
        },
    );
    assert_eq!(f.verdict, Verdict::Ok);
    assert!(f.message.contains("(v2:0123456789abcde…)"), "{}", f.message);
}

fn cert(not_after: i64, chain: Result<(), String>) -> CertFact {
    CertFact::Checked {
        source: "Secret s/t".into(),
        server_name: "svc.ns.svc".into(),
        not_after,
        chain,
    }
}

#[test]
fn certificate_expiry() {
    let v = |c: CertFact| serving_certificate("s", &c, NOW).verdict;
    assert_eq!(v(cert(NOW + 90 * DAY, Ok(()))), Verdict::Ok);
    assert_eq!(v(cert(NOW + 29 * DAY, Ok(()))), Verdict::Warning);
    assert_eq!(v(cert(NOW + 30 * DAY, Ok(()))), Verdict::Ok);
    assert_eq!(v(cert(NOW, Ok(()))), Verdict::Problem);
    assert_eq!(v(cert(NOW - DAY, Ok(()))), Verdict::Problem);
    assert_eq!(
        v(cert(NOW + 90 * DAY, Err("unknown issuer".into()))),
        Verdict::Problem
    );
    let expired = serving_certificate("s", &cert(NOW - DAY, Ok(())), NOW);
    assert!(
        expired.message.contains("expired at 2027-01-14T"),
        "{}",
        expired.message
    );
    let soon = serving_certificate("s", &cert(NOW + 29 * DAY, Ok(())), NOW);
    assert!(soon.message.contains("(in 29d)"), "{}", soon.message);
    assert_eq!(
        v(CertFact::Unavailable {
            source: "x".into(),
            reason: "forbidden".into()
        }),
        Verdict::Warning
    );
}

#[test]
fn hash_key_presence() {
    assert_eq!(hash_key("a/b", &Presence::Present).verdict, Verdict::Ok);
    assert_eq!(hash_key("a/b", &Presence::Absent).verdict, Verdict::Problem);
    assert_eq!(
        hash_key("a/b", &Presence::Unreadable("forbidden".into())).verdict,
        Verdict::Warning
    );
    assert_eq!(hash_key("a/b", &Presence::Absent).subject, "secret/a/b");
}

#[test]
fn opt_in_lists_are_bounded() {
    let many: Vec<String> = (0..12).map(|i| format!("ns{i:02}")).collect();
    let f = opt_in(
        "l",
        &OptIn {
            namespaces: Ok(many),
            workloads: Ok(vec![]),
        },
    );
    assert_eq!(verdicts(&f), [Verdict::Ok, Verdict::Ok]);
    assert_eq!(f[0].message, "12: ns00, ns01, ns02, ns03, ns04 (+7 more)");
    assert_eq!(f[1].message, "0");
    let none = opt_in(
        "l",
        &OptIn {
            namespaces: Ok(vec![]),
            workloads: Ok(vec![]),
        },
    );
    assert_eq!(verdicts(&none), [Verdict::Warning, Verdict::Warning]);
    // One fix line for both.
    assert!(none[0].fix.is_some() && none[1].fix.is_none(), "{none:?}");
    let unreadable = opt_in(
        "l",
        &OptIn {
            namespaces: Err("forbidden".into()),
            workloads: Ok(vec!["a/deployment/b".into()]),
        },
    );
    assert_eq!(verdicts(&unreadable), [Verdict::Warning, Verdict::Ok]);
}

#[test]
fn access_per_command() {
    let fact = |command, right: &str, allowed| AccessFact {
        command,
        right: right.into(),
        allowed,
    };
    let f = access(
        "namespace apps",
        &[
            fact("propagate", "list helmops", Ok(true)),
            fact("propagate", "get secrets", Ok(true)),
            fact("rollout", "patch deployments", Ok(false)),
            fact("rollout", "get deployments", Ok(true)),
            fact("prune", "list helmops", Err("boom".into())),
        ],
    );
    assert_eq!(
        verdicts(&f),
        [Verdict::Ok, Verdict::Warning, Verdict::Warning]
    );
    assert_eq!(f[0].subject, "propagate (namespace apps)");
    assert_eq!(f[0].message, "allowed (2 rights)");
    assert_eq!(f[1].message, "not allowed: patch deployments");
    assert!(f[2].message.contains("boom"));
}

#[test]
fn leases() {
    let held = |renewed, duration| LeaseFact::Present {
        holder: Some("pod-a_1".into()),
        renewed: Some(renewed),
        duration,
    };
    let l = |role, fact: &LeaseFact| lease(role, "helmop-system/x", fact, NOW);
    assert_eq!(
        l(LeaseRole::Propagator, &LeaseFact::Absent).verdict,
        Verdict::Ok
    );
    assert_eq!(
        l(LeaseRole::RolloutWatcher, &LeaseFact::Absent).verdict,
        Verdict::Warning
    );
    let fresh = l(LeaseRole::RolloutWatcher, &held(NOW - 5, Some(15)));
    assert_eq!(fresh.verdict, Verdict::Ok);
    assert_eq!(fresh.message, "held by pod-a_1, renewed 5s ago");
    // Within the duration plus the skew allowance: still fresh.
    assert_eq!(
        l(LeaseRole::RolloutWatcher, &held(NOW - 25, Some(15))).verdict,
        Verdict::Ok
    );
    let stale = l(LeaseRole::Propagator, &held(NOW - 600, Some(15)));
    assert_eq!(stale.verdict, Verdict::Problem);
    assert!(
        stale.message.contains("not renewed for 10m"),
        "{}",
        stale.message
    );
    let released = LeaseFact::Present {
        holder: Some(String::new()),
        renewed: Some(NOW),
        duration: Some(15),
    };
    assert_eq!(
        l(LeaseRole::RolloutWatcher, &released).verdict,
        Verdict::Warning
    );
}

#[test]
fn report_result_is_the_worst_verdict() {
    let r = Report::new(None, vec![]);
    assert_eq!(r.result, Verdict::Ok);
    let findings = vec![
        hash_key("a/b", &Presence::Present),
        lease(LeaseRole::RolloutWatcher, "x", &LeaseFact::Absent, NOW),
    ];
    let r = Report::new(Some("apps".into()), findings);
    assert_eq!(r.result, Verdict::Warning);
    assert_eq!(
        r.summary,
        Summary {
            ok: 1,
            warning: 1,
            problem: 0
        }
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["result"], "warning");
    assert_eq!(json["findings"][0]["check"], "hash-key");
    assert_eq!(json["findings"][0]["verdict"], "ok");
    assert!(json["findings"][0].get("fix").is_none());
    assert_eq!(json["findings"][1]["check"], "lease");
    assert!(json["findings"][1]["fix"].is_string());
}

fn port(client_auth: bool, policies: &[&str], admits: PortAdmits) -> PortFact {
    PortFact::Known {
        client_auth,
        policies: policies.iter().map(|p| p.to_string()).collect(),
        admits,
        apiserver: Vec::new(),
    }
}

#[test]
fn the_fix_names_the_api_servers_addresses_when_the_cluster_tells_them() {
    let open = |apiserver: &[&str]| PortFact::Known {
        client_auth: false,
        policies: Vec::new(),
        admits: PortAdmits::default(),
        apiserver: apiserver.iter().map(|a| a.to_string()).collect(),
    };
    let found = admission_port("ns/svc", &open(&["10.0.0.5", "fd00::5"]));
    let fix = found.fix.unwrap_or_default();
    assert!(
        fix.contains("an ipBlock of only 10.0.0.5/32, fd00::5/128"),
        "{fix}"
    );
    let found = admission_port("ns/svc", &open(&[]));
    assert!(
        !found.fix.unwrap_or_default().contains("ipBlock of only"),
        "no addresses, no suggestion"
    );
    let leaky = PortFact::Known {
        client_auth: false,
        policies: vec!["np".into()],
        admits: PortAdmits {
            pod_ranges: vec!["n1 (10.244.1.0/24)".into()],
            known_ranges: Some(1),
            ..PortAdmits::default()
        },
        apiserver: vec!["10.0.0.5".into()],
    };
    let fix = admission_port("ns/svc", &leaky).fix.unwrap_or_default();
    assert!(
        fix.contains("{.items[*].spec.podCIDRs}") && fix.contains("10.0.0.5/32"),
        "{fix}"
    );
}

#[test]
fn the_admission_port_is_judged_by_who_can_reach_it() {
    let kept_off = PortAdmits {
        known_ranges: Some(3),
        ..PortAdmits::default()
    };
    let cases = [
        (
            port(true, &[], PortAdmits::default()),
            Verdict::Ok,
            "--client-ca",
        ),
        (
            port(false, &[], PortAdmits::default()),
            Verdict::Warning,
            "any pod can post",
        ),
        (
            port(false, &["np"], kept_off.clone()),
            Verdict::Ok,
            "all 3 nodes",
        ),
        (
            port(
                false,
                &["np"],
                PortAdmits {
                    pod_ranges: vec!["n1 (10.244.1.0/24)".into()],
                    ..kept_off.clone()
                },
            ),
            Verdict::Problem,
            "pod ranges of n1 (10.244.1.0/24)",
        ),
        (
            port(
                false,
                &["np"],
                PortAdmits {
                    everyone: vec!["np".into()],
                    ..kept_off.clone()
                },
            ),
            Verdict::Problem,
            "admits every source",
        ),
        (
            port(
                false,
                &["np"],
                PortAdmits {
                    selected_pods: vec!["np".into()],
                    ..kept_off.clone()
                },
            ),
            Verdict::Warning,
            "chosen by selectors",
        ),
        (
            port(false, &["np"], PortAdmits::default()),
            Verdict::Warning,
            "is not known",
        ),
        (
            PortFact::Unknown("forbidden".into()),
            Verdict::Warning,
            "forbidden",
        ),
    ];
    for (fact, verdict, says) in cases {
        let found = admission_port("helmop-system/helmop-webhook", &fact);
        assert_eq!(found.verdict, verdict, "{fact:?}: {}", found.message);
        assert!(found.message.contains(says), "{fact:?}: {}", found.message);
        assert_eq!(found.subject, "service/helmop-system/helmop-webhook");
        if verdict == Verdict::Problem {
            assert!(found.fix.is_some(), "{fact:?}");
        }
    }
}

#[test]
fn holds_are_a_warning_naming_the_workloads_and_what_to_do() {
    assert_eq!(rollout_holds(&Ok(Vec::new())).verdict, Verdict::Ok);
    let f = rollout_holds(&Ok(vec![HoldFact {
        workload: "apps/deployment/web".into(),
        reason: "RestampBreakerOpen".into(),
        note: "not restamped: Secret apps/flap changes too often".into(),
    }]));
    assert_eq!(f.verdict, Verdict::Warning);
    assert!(
        f.message
            .contains("apps/deployment/web (RestampBreakerOpen)"),
        "{}",
        f.message
    );
    assert!(
        f.fix
            .as_deref()
            .is_some_and(|x| x.contains("rollout --resume"))
    );
    let e = rollout_holds(&Err("forbidden".into()));
    assert_eq!(
        (e.verdict, e.check.as_str()),
        (Verdict::Warning, "rollout-holds")
    );
}

#[test]
fn every_hold_reason_has_a_short_name_of_its_own() {
    let labels: std::collections::BTreeSet<&str> =
        HOLD_REASONS.iter().map(|(r, _)| hold_label(r)).collect();
    assert_eq!(labels.len(), HOLD_REASONS.len(), "{labels:?}");
    for (reason, _) in HOLD_REASONS {
        assert_ne!(hold_label(reason), reason, "{reason} has a short name");
    }
    let hold = Hold {
        reason: "RestampBreakerOpen".into(),
        note: "n".into(),
    };
    assert_eq!(hold.label(), "breaker");
    assert_eq!(hold_label("SomethingNew"), "SomethingNew");
    assert_eq!(
        serde_json::to_value(&hold).ok(),
        Some(serde_json::json!({"reason": "RestampBreakerOpen", "note": "n"}))
    );
}

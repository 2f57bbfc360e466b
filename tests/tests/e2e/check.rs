//! `kubectl helmop check` against the upstream cluster, with the real webhook in-process on
//! loopback and registered by URL for the test's namespace only, under configuration names,
//! a hash key and Leases of the test's own (the `--webhook-configuration`, `--hash-key-secret`
//! and `--lease-namespace` flags), so breaking them touches no other test on the shared cluster.

use std::collections::BTreeSet;

use anyhow::Context;
use helmop_tests::*;
use helmop_webhook::state::Config;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use serde_json::Value;

use crate::plugin::support::{Out, helmop};

/// The finding about `subject` of kind `check`.
fn finding<'a>(report: &'a Value, check: &str, subject: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|f| f["check"] == check && f["subject"] == subject)
        })
        .unwrap_or_else(|| panic!("no {check} finding about {subject} in {report:#}"))
}

/// The report's shape: what scripts may rely on.
fn assert_shape(report: &Value) {
    assert_shape_with(report, true);
}

/// [`assert_shape`]; `every_check`: each kind of check has a finding (no serving certificate is
/// looked at without a webhook configuration).
fn assert_shape_with(report: &Value, every_check: bool) {
    let keys: BTreeSet<&str> = report
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        BTreeSet::from(["result", "summary", "namespace", "findings"]),
        "{report:#}"
    );
    let verdicts = ["ok", "warning", "problem"];
    let findings = report["findings"].as_array().cloned().unwrap_or_default();
    let mut counted = 0;
    for v in verdicts {
        let n = report["summary"][v].as_u64().unwrap_or(u64::MAX);
        assert_eq!(
            n as usize,
            findings.iter().filter(|f| f["verdict"] == v).count(),
            "summary.{v} in {report:#}"
        );
        counted += n as usize;
    }
    assert_eq!(counted, findings.len());
    for f in &findings {
        let keys: BTreeSet<&str> = f
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut want = BTreeSet::from(["check", "subject", "verdict", "message"]);
        if f.get("fix").is_some() {
            want.insert("fix");
        }
        assert_eq!(keys, want, "{f:#}");
        assert!(verdicts.contains(&f["verdict"].as_str().unwrap_or_default()));
        if f["verdict"] == "problem" {
            assert!(f["fix"].as_str().is_some_and(|s| !s.is_empty()), "{f:#}");
        }
    }
    if !every_check {
        return;
    }
    for check in [
        "webhook-configuration",
        "webhook-answer",
        "serving-certificate",
        "hash-key",
        "opt-in",
        "access",
        "lease",
        "rollout-holds",
    ] {
        assert!(
            findings.iter().any(|f| f["check"] == check),
            "no {check} finding in {report:#}"
        );
    }
}

fn verdict<'a>(report: &'a Value, check: &str, subject: &str) -> &'a str {
    finding(report, check, subject)["verdict"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_working_install_then_a_missing_hash_key_and_a_foreign_ca_bundle()
-> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "check").await?;
    create_secret(&client, &ns, "hash-key", &[("key", &random_key()?)]).await?;
    let webhook = LocalWebhook::start(
        client.clone(),
        Config {
            hash_key_secret: hash_key_in(&ns),
            ..Config::default()
        },
    )
    .await?;
    let name = format!("{ns}-check");
    let validating = |ca: &str| {
        WebhookRegistration::new(
            WebhookKind::Validating,
            &name,
            &format!("{}/validate/helmops", webhook.url),
            ca,
        )
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "fleet.cattle.io",
            "v1alpha1",
            &["helmops"],
        ))
        .only_namespace(&ns)
    };
    validating(&webhook.ca_pem).register(&client).await?;
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &name,
        &format!("{}/mutate/workloads", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "apps",
        "v1",
        &["deployments"],
    ))
    .failure_policy("Ignore")
    .only_namespace(&ns)
    .register(&client)
    .await?;
    // The rollout watcher's Lease, held and renewed just now.
    Api::<Lease>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("kubectl-helmop-rollout".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("check-test_1".into()),
                    lease_duration_seconds: Some(3600),
                    renew_time: Some(MicroTime(Timestamp::now())),
                    ..LeaseSpec::default()
                }),
            },
        )
        .await?;

    // A shard of the propagator, held and renewed just now: `check` finds it by listing.
    Api::<Lease>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("kubectl-helmop-propagate-shard-shard0".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("check-test_2".into()),
                    lease_duration_seconds: Some(3600),
                    renew_time: Some(MicroTime(Timestamp::now())),
                    ..LeaseSpec::default()
                }),
            },
        )
        .await?;

    let key_ref = format!("{ns}/hash-key");
    let args = [
        "check",
        "-n",
        &ns,
        "--webhook-configuration",
        &name,
        "--hash-key-secret",
        &key_ref,
        "--lease-namespace",
        &ns,
    ];
    let json_args: Vec<&str> = args.iter().copied().chain(["-o", "json"]).collect();
    let validating_subject = format!("validating/{name}");
    let mutating_subject = format!("mutating/{name}");

    // Everything in place: no problem (the opt-in findings may warn on a cluster where no other
    // test opted anything in), exit 0.
    let report = helmop(&json_args).await?.expect(0).json();
    assert_shape(&report);
    assert_ne!(report["result"], "problem", "{report:#}");
    assert_eq!(report["namespace"], ns.as_str());
    for (check, subject) in [
        ("webhook-configuration", validating_subject.as_str()),
        ("webhook-configuration", mutating_subject.as_str()),
        ("webhook-answer", validating_subject.as_str()),
        ("webhook-answer", mutating_subject.as_str()),
        ("serving-certificate", validating_subject.as_str()),
        ("serving-certificate", mutating_subject.as_str()),
        ("hash-key", &format!("secret/{key_ref}")),
        ("lease", &format!("lease/{ns}/kubectl-helmop-rollout")),
        ("lease", &format!("lease/{ns}/kubectl-helmop-propagate")),
        (
            "lease",
            &format!("lease/{ns}/kubectl-helmop-propagate-shard-shard0"),
        ),
        ("access", &format!("propagate (namespace {ns})")),
        ("access", &format!("rollout (namespace {ns})")),
    ] {
        assert_eq!(
            verdict(&report, check, subject),
            "ok",
            "{check} {subject}: {report:#}"
        );
    }
    let answer = &finding(&report, "webhook-answer", &validating_subject)["message"];
    assert!(
        answer
            .as_str()
            .is_some_and(|m| m.contains("denied an invalid HelmOp")),
        "{answer}"
    );
    let stamped = &finding(&report, "webhook-answer", &mutating_subject)["message"];
    assert!(
        stamped.as_str().is_some_and(|m| m.contains("stamped (v2:")),
        "{stamped}"
    );
    let cert = &finding(&report, "serving-certificate", &validating_subject)["message"];
    assert!(
        cert.as_str()
            .is_some_and(|m| m.starts_with("verified for 127.0.0.1")),
        "{cert}"
    );
    let lease = &finding(
        &report,
        "lease",
        &format!("lease/{ns}/kubectl-helmop-rollout"),
    )["message"];
    assert!(
        lease
            .as_str()
            .is_some_and(|m| m.starts_with("held by check-test_1, renewed")),
        "{lease}"
    );
    // Nothing was stored by the dry runs.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns);
    assert!(
        deployments
            .list(&Default::default())
            .await?
            .items
            .is_empty()
    );

    // The table: aligned columns, the counts, no fix lines without a problem or warning fix.
    let table: Out = helmop(&args).await?.expect(0);
    let first = table.stdout.lines().next().unwrap_or_default().to_owned();
    assert!(
        first.starts_with("CHECK") && first.contains("SUBJECT") && first.ends_with("MESSAGE"),
        "{}",
        table.stdout
    );
    assert!(table.stdout.contains(" 0 problem(s)\n"), "{}", table.stdout);

    // The hash key gone: a problem with its fix, exit 1.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("hash-key", &DeleteParams::default())
        .await?;
    let out = helmop(&json_args).await?.expect(1);
    let report = out.json();
    assert_shape(&report);
    assert_eq!(report["result"], "problem");
    let key = finding(&report, "hash-key", &format!("secret/{key_ref}"));
    assert_eq!(key["verdict"], "problem", "{key:#}");
    assert!(
        key["fix"]
            .as_str()
            .is_some_and(|f| f.contains("hash-key initContainer")),
        "{key:#}"
    );
    let table = helmop(&args).await?.expect(1);
    assert!(
        table.stdout.contains(&format!(
            "\nfix secret/{key_ref}: kubectl -n helmop-system rollout restart"
        )),
        "{}",
        table.stdout
    );

    // The validating configuration trusting another CA: the certificate does not verify, and the
    // API server cannot call the webhook any more (once it has picked up the change).
    create_secret(&client, &ns, "hash-key", &[("key", &random_key()?)]).await?;
    let foreign = test_certs_for(&["127.0.0.1"]);
    validating(&foreign.ca_pem).register(&client).await?;
    let deadline = std::time::Instant::now() + DEFAULT_TIMEOUT;
    let last = loop {
        let out = helmop(&json_args).await?;
        let report = out.json();
        if out.code == 1 && verdict(&report, "webhook-answer", &validating_subject) == "problem" {
            break report;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the validating webhook still answers: {report:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert_shape(&last);
    let cert = finding(&last, "serving-certificate", &validating_subject);
    assert_eq!(cert["verdict"], "problem", "{cert:#}");
    assert!(
        cert["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not verify")),
        "{cert:#}"
    );
    assert!(
        cert["fix"]
            .as_str()
            .is_some_and(|f| f.contains("rollout restart deployment helmop-webhook")),
        "{cert:#}"
    );
    assert_eq!(
        verdict(&last, "serving-certificate", &mutating_subject),
        "ok",
        "{last:#}"
    );

    for kind in [WebhookKind::Validating, WebhookKind::Mutating] {
        unregister_webhook(&client, kind, &name).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_without_helmop_installed_names_the_install_and_an_unreachable_cluster_exits_3()
-> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "check-none").await?;
    let out = helmop(&[
        "check",
        "--webhook-configuration",
        &format!("{ns}-absent"),
        "--lease-namespace",
        &ns,
        "-o",
        "json",
    ])
    .await?
    .expect(1);
    let report = out.json();
    assert_shape_with(&report, false);
    let f = finding(&report, "webhook-configuration", &format!("{ns}-absent"));
    assert_eq!(f["verdict"], "problem");
    assert!(
        f["fix"]
            .as_str()
            .is_some_and(|s| s.contains("deploy/self-signed.yaml")),
        "{f:#}"
    );
    // No -n: the Deployment dry run is skipped, not failed.
    assert_eq!(
        verdict(&report, "webhook-answer", &format!("mutating/{ns}-absent")),
        "ok"
    );

    let (port, _held) = crate::plugin::support::black_hole()?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        crate::plugin::support::loopback_kubeconfig(port),
    )?;
    let out =
        crate::plugin::support::run_with(&kubeconfig, &["check", "--request-timeout", "2s"], &[])
            .await?;
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("cannot reach"), "{}", out.stderr);
    Ok(())
}

/// A serving certificate for `names`, from a CA of its own, valid until `until` (UTC date).
fn short_lived_pki(
    names: &[&str],
    until: k8s_openapi::jiff::civil::Date,
) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    // Fixed, valid inputs only: a failure here is a bug in the test.
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("self-signed CA");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("serving key");
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .expect("serving params");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_after = rcgen::date_time_ymd(
        i32::from(until.year()),
        u8::try_from(until.month()).expect("month"),
        u8::try_from(until.day()).expect("day"),
    );
    let cert = params.signed_by(&key, &issuer).expect("serving cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_a_service_webhooks_certificate_from_its_deployments_secret()
-> anyhow::Result<()> {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
        WebhookClientConfig,
    };
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::api::{Patch, PatchParams};

    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "check-svc").await?;
    create_secret(&client, &ns, "hash-key", &[("key", &random_key()?)]).await?;
    // Expiring in 10 days: verified, and a warning.
    let until = Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(240))?
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .date();
    let server_name = format!("webhook.{ns}.svc");
    let (ca, cert, key) = short_lived_pki(&[&server_name], until);
    create_secret(
        &client,
        &ns,
        "serving",
        &[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())],
    )
    .await?;
    // Never scheduled (the upstream has no node): only its volumes matter to check.
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "webhook"},
        "spec": {
            "selector": {"matchLabels": {"app": "webhook"}},
            "template": {
                "metadata": {"labels": {"app": "webhook"}},
                "spec": {
                    "containers": [{"name": "webhook", "image": "example.invalid/webhook:1"}],
                    "volumes": [{"name": "tls", "secret": {"secretName": "serving"}}],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    let name = format!("{ns}-svc");
    let configuration = MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: format!("{name}.tests.helmop.dev"),
            client_config: WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: ns.clone(),
                    name: "webhook".into(),
                    path: Some("/mutate/workloads".into()),
                    port: Some(443),
                }),
                ca_bundle: Some(ByteString(ca.into_bytes())),
                url: None,
            },
            rules: Some(vec![RuleWithOperations {
                operations: Some(vec!["CREATE".into()]),
                api_groups: Some(vec!["apps".into()]),
                api_versions: Some(vec!["v1".into()]),
                resources: Some(vec!["deployments".into()]),
                scope: None,
            }]),
            // Only this test's namespace, and never in the way: nothing answers there.
            namespace_selector: Some(LabelSelector {
                match_labels: Some([(TEST_NAMESPACE_LABEL.to_owned(), ns.clone())].into()),
                match_expressions: None,
            }),
            failure_policy: Some("Ignore".into()),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(2),
            ..MutatingWebhook::default()
        }]),
    };
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("helmop-tests").force(),
            &Patch::Apply(&configuration),
        )
        .await?;

    let key_ref = format!("{ns}/hash-key");
    let out = helmop(&[
        "check",
        "--webhook-configuration",
        &name,
        "--hash-key-secret",
        &key_ref,
        "--lease-namespace",
        &ns,
        "-o",
        "json",
    ])
    .await?;
    let report = out.json();
    assert_shape(&report);
    let cert = finding(&report, "serving-certificate", &format!("mutating/{name}"));
    assert_eq!(cert["verdict"], "warning", "{cert:#}");
    let message = cert["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "verified for {server_name}, but expires at {until}T"
        )),
        "{cert:#}"
    );
    assert!(
        cert["fix"]
            .as_str()
            .is_some_and(|f| f.contains("rollout restart deployment helmop-webhook"))
    );
    // Warnings alone (no validating configuration, the certificate, no rollout watcher) exit 0.
    assert_ne!(report["result"], "problem", "{report:#}");
    assert_eq!(out.code, 0);

    admission_port_is_judged_against_the_pod_ranges(&client, &ns, &name, &key_ref).await?;
    unregister_webhook(&client, WebhookKind::Mutating, &name).await?;
    Ok(())
}

/// The admission-port finding for the Service `webhook` the configuration `name` calls: no
/// NetworkPolicy (any pod may call it), the shipped `network-policy` component whose `except` misses
/// a node's pod range (a problem naming the node), then with that range excepted (ok).
async fn admission_port_is_judged_against_the_pod_ranges(
    client: &kube::Client,
    ns: &str,
    name: &str,
    key_ref: &str,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Node, Pod, Service};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{Patch, PatchParams};

    let labels =
        serde_json::json!({"app.kubernetes.io/name": "helmop-webhook", "role": "port-test"});
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "webhook"},
        "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": "https"}]},
    }))?;
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await?;
    // Never scheduled: only its labels, arguments and ports matter to check. No token: on Kubernetes
    // 1.20 admission refuses a pod that mounts one until the token controller has made the namespace's
    // token Secret, which on a loaded machine may come after the default ServiceAccount.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "webhook-port", "labels": labels},
        "spec": {"automountServiceAccountToken": false, "containers": [{
            "name": "webhook", "image": "example.invalid/webhook:1",
            "args": ["--listen=0.0.0.0:8443"],
            "ports": [{"name": "https", "containerPort": 8443}],
        }]},
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    // A node whose pods live in 10.244.77.0/24 (no kubelet: only its spec matters).
    let node_name = format!("{ns}-node");
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node_name},
        "spec": {"podCIDR": "10.244.77.0/24", "podCIDRs": ["10.244.77.0/24"]},
    }))?;
    let nodes = Api::<Node>::all(client.clone());
    nodes.create(&PostParams::default(), &node).await?;

    let subject = format!("service/{ns}/webhook");
    // Runs check; its exit code, after the admission-port finding was found with `verdict` and `says`.
    let expect = |verdict: &'static str, says: String| {
        let subject = subject.clone();
        async move {
            let out = helmop(&[
                "check",
                "--webhook-configuration",
                name,
                "--hash-key-secret",
                key_ref,
                "--lease-namespace",
                ns,
                "-o",
                "json",
            ])
            .await?;
            let report = out.json();
            let port = finding(&report, "admission-port", &subject).clone();
            assert_eq!(port["verdict"], verdict, "{port:#}");
            assert!(
                port["message"].as_str().is_some_and(|m| m.contains(&says)),
                "{port:#}"
            );
            anyhow::Ok((out.code, port))
        }
    };
    // The fix names what the cluster tells of the control plane: the API server's own addresses, in
    // the `default/kubernetes` Endpoints. The harness's API servers advertise loopback addresses, which
    // Endpoints may not hold, so they run with `--endpoint-reconciler-type=none`; the test writes what a
    // real one keeps there, with a documentation address (TEST-NET-1) for the API server's.
    let endpoints_api =
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), "default");
    let wrote_endpoints = endpoints_api.get_opt("kubernetes").await?.is_none();
    if wrote_endpoints {
        let endpoints: k8s_openapi::api::core::v1::Endpoints =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "kubernetes"},
                "subsets": [{"addresses": [{"ip": "192.0.2.10"}],
                             "ports": [{"name": "https", "port": 443}]}],
            }))?;
        endpoints_api
            .create(&PostParams::default(), &endpoints)
            .await?;
    }
    let endpoints = endpoints_api.get("kubernetes").await?;
    let (_, open) = expect("warning", "any pod can post a review".into()).await?;
    let address = endpoints
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten())
        .map(|a| a.ip.clone())
        .next()
        .context("the kubernetes Endpoints list no address")?;
    assert!(
        open["fix"].as_str().is_some_and(|f| f.contains(&format!(
            "an ipBlock of only {address}/{}",
            if address.contains(':') { 128 } else { 32 }
        ))),
        "{open:#}"
    );

    // The shipped component as a user adds it, with its RKE2/k3s default pod CIDR.
    let text = std::fs::read_to_string(manifests_dir().join("network-policy/networkpolicy.yaml"))?;
    let mut policy: NetworkPolicy = serde_saphyr::from_str(&text)?;
    policy.metadata.namespace = Some(ns.to_owned());
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), ns);
    policies.create(&PostParams::default(), &policy).await?;
    let (code, _) = expect("problem", format!("{node_name} (10.244.77.0/24)")).await?;
    assert_eq!(code, 1, "a problem exits 1");

    policies
        .patch(
            "helmop-webhook",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(serde_json::json!([{
                "op": "add",
                "path": "/spec/ingress/0/from/0/ipBlock/except/-",
                "value": "10.244.0.0/16",
            }]))?),
        )
        .await?;
    expect("ok", "keeps the pod ranges".into()).await?;
    nodes.delete(&node_name, &DeleteParams::default()).await?;
    if wrote_endpoints {
        endpoints_api
            .delete("kubernetes", &DeleteParams::default())
            .await?;
    }
    Ok(())
}

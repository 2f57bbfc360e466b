//! A Recreate never loses a copy silently (docs/copy-lifecycle.md): when the create after the
//! delete is refused (another webhook, helmop's old copy held by a finalizer), the copy is
//! reported `Lost` ("deleted to be recreated, now missing", exit 2), no workload reading it is
//! restamped, and the next run creates it. The real binary against the shared control plane.

use helmop_tests::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::plugin::support::*;

/// `propagate app -n NS -o json`, expecting exit `code`: the report.
async fn propagate_app(f: &Fleet, code: i32) -> anyhow::Result<Value> {
    Ok(helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(code)
        .json())
}

async fn restamp_of(client: &kube::Client, ns: &str) -> anyhow::Result<Option<String>> {
    let web = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("web")
        .await?;
    Ok(annotation(&web.metadata, "helmop.dev/restamp").map(String::from))
}

/// Sources `a` (Secret) and `b` (ConfigMap), HelmOp `app` copying both into `apps` on down1,
/// the reader, and a first propagate (the copies created, the reader restamped).
async fn setup(f: &Fleet, apps: &str) -> anyhow::Result<()> {
    create_secret(&f.upstream, &f.ns, "a", &[("k", b"one")]).await?;
    create_config_map(&f.upstream, &f.ns, "b", &[("mode", "one")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: a}}\n- {{kind: ConfigMap, name: b}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    create_reader(&f.down1, apps, "a", "b").await?;
    let first = propagate_app(f, 0).await?;
    assert!(
        rows(&first)
            .iter()
            .any(|r| r["workload"] == "Deployment/web" && r["state"] == "Restamped"),
        "{first:#}"
    );
    Ok(())
}

/// Copy `a` made immutable downstream (so it must be recreated) and both sources changed.
async fn change_both(f: &Fleet, apps: &str, extra: Value) -> anyhow::Result<()> {
    let mut patch = json!({"immutable": true});
    if let (Some(p), Some(e)) = (patch.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    Api::<Secret>::namespaced(f.down1.clone(), apps)
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    set_secret_data(&f.upstream, &f.ns, "a", json!({"k": b64(b"two")})).await?;
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"mode": "two"}})),
        )
        .await?;
    Ok(())
}

fn state_of(report: &Value, name: &str) -> (String, String) {
    let r = rows(report)
        .into_iter()
        .find(|r| r["name"] == name && r.get("workload").is_none())
        .unwrap_or_else(|| panic!("no row for {name} in {report:#}"));
    (
        r["state"].as_str().unwrap_or_default().to_string(),
        r["reason"].as_str().unwrap_or_default().to_string(),
    )
}

fn restamped(report: &Value) -> bool {
    rows(report)
        .iter()
        .any(|r| r.get("workload").is_some() && r["state"] == "Restamped")
}

/// Another webhook refuses the create after helmop deleted its immutable copy.
#[tokio::test]
async fn a_refused_recreate_is_lost_holds_its_readers_and_is_created_by_the_next_run()
-> anyhow::Result<()> {
    let f = Fleet::new("rc-lost").await?;
    let apps = fresh_namespace(&f.down1, "rc-lost-apps").await?;
    setup(&f, &apps).await?;
    let stamp_before = restamp_of(&f.down1, &apps).await?;
    change_both(&f, &apps, json!({})).await?;

    // A webhook downstream that refuses every new Secret in the namespace (updates pass).
    let certs = test_certs();
    let (url, calls) = start_denying_webhook(&certs).await?;
    let name = format!("deny-secrets-{apps}");
    WebhookRegistration::new(WebhookKind::Validating, &name, &url, &certs.ca_pem)
        .rule(WebhookRule::new(&["CREATE"], "", "v1", &["secrets"]))
        .only_namespace(&apps)
        .register(&f.down1)
        .await?;
    // Every probe has a name of its own: a probe created before the webhook was active must not
    // answer a later probe with AlreadyExists.
    let probes = std::sync::atomic::AtomicUsize::new(0);
    let probe = || async {
        let n = probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        create_secret(&f.down1, &apps, &format!("probe-{n}"), &[]).await
    };
    wait_for("the webhook to refuse Secrets", DEFAULT_TIMEOUT, || async {
        Ok(match probe().await {
            Err(e) if format!("{e:#}").contains("denied by the helmop-tests webhook") => Some(()),
            _ => None,
        })
    })
    .await?;
    let before = calls.load(std::sync::atomic::Ordering::SeqCst);

    let out = propagate_app(&f, 2).await?;
    let (state, reason) = state_of(&out, "a");
    assert_eq!(state, "Lost", "{out:#}");
    assert!(
        reason.starts_with("deleted to be recreated, now missing")
            && reason.contains("denied by the helmop-tests webhook"),
        "{reason}"
    );
    // Retried, not given up at the first refusal.
    assert!(
        calls.load(std::sync::atomic::Ordering::SeqCst) - before >= 5,
        "the create was not retried"
    );
    assert_eq!(state_of(&out, "b").0, "Updated", "{out:#}");
    // The reader reads the missing copy: not restamped into pods that could not start.
    assert!(!restamped(&out), "{out:#}");
    assert_eq!(restamp_of(&f.down1, &apps).await?, stamp_before);
    assert!(get_secret(&f.down1, &apps, "a").await?.is_none());
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(state_of(&status, "a").0, "Missing", "{status:#}");

    // The webhook goes: the next run creates the copy and restamps the reader.
    Api::<ValidatingWebhookConfiguration>::all(f.down1.clone())
        .delete(&name, &DeleteParams::default())
        .await?;
    wait_for("the webhook to be gone", DEFAULT_TIMEOUT, || async {
        Ok(probe().await.ok().map(|_| ()))
    })
    .await?;
    let out = propagate_app(&f, 0).await?;
    assert_eq!(state_of(&out, "a").0, "Created", "{out:#}");
    assert!(restamped(&out), "{out:#}");
    let copy = some(get_secret(&f.down1, &apps, "a").await?, "the copy")?;
    assert_eq!(copy.data.unwrap_or_default()["k"].0, b"two");
    Ok(())
}

/// Helmop's own old copy held by a finalizer answers the create with 409: that is
/// helmop's copy still terminating (`Lost`, then `Failed` and retried), never a foreign
/// `Conflict`.
#[tokio::test]
async fn a_copy_held_by_a_finalizer_is_retried_not_a_conflict() -> anyhow::Result<()> {
    let f = Fleet::new("rc-final").await?;
    let apps = fresh_namespace(&f.down1, "rc-final-apps").await?;
    setup(&f, &apps).await?;
    change_both(
        &f,
        &apps,
        json!({"metadata": {"finalizers": ["helmop-tests/hold"]}}),
    )
    .await?;

    let out = propagate_app(&f, 2).await?;
    let (state, reason) = state_of(&out, "a");
    assert_eq!(state, "Lost", "{out:#}");
    assert!(
        reason.contains("helmop's old copy is still being deleted (finalizers: helmop-tests/hold)"),
        "{reason}"
    );
    assert!(!restamped(&out), "{out:#}");

    // Still held: the next run's create meets the terminating copy again: Failed, not Conflict.
    let out = propagate_app(&f, 2).await?;
    let (state, reason) = state_of(&out, "a");
    assert_eq!(state, "Failed", "{out:#}");
    assert!(reason.contains("still being deleted"), "{reason}");

    // The finalizer goes, the old copy with it: the next run creates the new one.
    Api::<Secret>::namespaced(f.down1.clone(), &apps)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    wait_for("the old copy to go", DEFAULT_TIMEOUT, || async {
        Ok(get_secret(&f.down1, &apps, "a")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let out = propagate_app(&f, 0).await?;
    assert_eq!(state_of(&out, "a").0, "Created", "{out:#}");
    assert!(restamped(&out), "{out:#}");
    let _ = Api::<Secret>::namespaced(f.down1.clone(), &apps)
        .delete("a", &DeleteParams::default())
        .await;
    Ok(())
}

//! `propagate` copies exactly the objects a HelmOp lists to the clusters it targets, and a second run writes
//! nothing.

use std::collections::BTreeSet;

use helmop_tests::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::support::*;

#[tokio::test]
async fn propagate_copies_exactly_the_right_objects_and_a_second_run_writes_nothing()
-> anyhow::Result<()> {
    let f = Fleet::new("pa-copy").await?;
    let (apps, edge) = (f.dest("apps"), f.dest("edge"));
    let db = create(
        &f.upstream,
        &secret_obj(
            &f.ns,
            "db",
            "example.com/db",
            &[("user", b"app"), ("password", &[0, 1, 2, 255])],
            &[
                ("app", "web"),
                ("helmop.dev/owners", "forged"),
                ("fleet.cattle.io/bundledeployment", "x"),
            ],
            &[
                ("note", "hi"),
                ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
            ],
        ),
    )
    .await?;
    let settings = ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            namespace: Some(f.ns.clone()),
            ..ObjectMeta::default()
        },
        data: Some([("mode".to_string(), "fast".to_string())].into()),
        binary_data: Some([("blob".to_string(), ByteString(vec![9, 0, 9]))].into()),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .create(&PostParams::default(), &settings)
        .await?;
    create_secret(&f.upstream, &f.ns, "unused", &[("x", b"y")]).await?;
    // Root resource db everywhere; the first matching target wins: down2 by its group (into
    // its own namespace), down1 by label (plus settings).
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\n\
             downstreamResources:\n- {{kind: Secret, name: db}}\n\
             targets:\n\
             - clusterGroup: edge\n  namespace: {edge}\n\
             - clusterSelector: {{matchLabels: {{env: prod}}}}\n  downstreamResources:\n  - {{kind: ConfigMap, name: settings}}\n"
        ),
    ))
    .await?;

    // Before anything is copied, status says Missing everywhere.
    let missing = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let missing = states(&missing);
    assert_eq!(missing.len(), 3, "{missing:#?}");
    assert!(missing.values().all(|s| s == "Missing"), "{missing:#?}");

    // The plan first: nothing is written.
    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&dry), 0);
    let planned = states(&dry);
    assert_eq!(
        planned.values().collect::<BTreeSet<_>>(),
        BTreeSet::from([&"Create".to_string()]),
        "{planned:#?}"
    );
    assert_eq!(planned.len(), 3, "{planned:#?}");
    assert!(!namespace_exists(&f.down1, &apps).await?);
    assert!(!namespace_exists(&f.down2, &edge).await?);

    let first = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let id = first["upstreamId"].as_str().unwrap_or_default().to_string();
    assert!(id.starts_with("up-"), "{first:#}");
    assert!(writes(&first) >= 3, "{first:#}");
    let states1 = states(&first);
    assert_eq!(
        states1,
        [
            (
                format!("{}/down1 {apps} ConfigMap/settings", f.ns),
                "Created".to_string()
            ),
            (
                format!("{}/down1 {apps} Secret/db", f.ns),
                "Created".to_string()
            ),
            (
                format!("{}/down2 {edge} Secret/db", f.ns),
                "Created".to_string()
            ),
        ]
        .into(),
    );

    // Exactly these copies, nothing else, nowhere else.
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([
            place(&apps, "ConfigMap", "settings"),
            place(&apps, "Secret", "db")
        ])
    );
    assert_eq!(
        copies_of(&f.down2, &f.ns).await?,
        BTreeSet::from([place(&edge, "Secret", "db")])
    );
    assert!(!namespace_exists(&f.down1, &edge).await?);
    assert!(!namespace_exists(&f.down2, &apps).await?);

    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db on down1")?;
    assert_eq!(copy.type_.as_deref(), Some("example.com/db"));
    assert_eq!(copy.data, db.data);
    let labels = copy.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels,
        [
            ("app".to_string(), "web".to_string()),
            (
                "helmop.dev/managed-by".to_string(),
                "kubectl-helmop".to_string()
            ),
        ]
        .into()
    );
    let m = &copy.metadata;
    assert_eq!(annotation(m, "note"), Some("hi"));
    assert_eq!(
        annotation(m, "kubectl.kubernetes.io/last-applied-configuration"),
        None
    );
    assert_eq!(
        annotation(m, "helmop.dev/owners"),
        Some(format!("{id}/{}/app", f.ns).as_str())
    );
    assert_eq!(
        annotation(m, "helmop.dev/source"),
        Some(format!("{id}/{}/Secret/db", f.ns).as_str())
    );
    assert_eq!(
        annotation(m, "helmop.dev/source-uid"),
        db.metadata.uid.as_deref()
    );
    let hash = annotation(m, "helmop.dev/content-hash").unwrap_or_default();
    assert!(hash.starts_with("v1:") && hash.len() == 67, "{hash}");
    let managers: Vec<String> = m
        .managed_fields
        .iter()
        .flatten()
        .map(|f| {
            format!(
                "{}/{}",
                f.manager.clone().unwrap_or_default(),
                f.operation.clone().unwrap_or_default()
            )
        })
        .collect();
    // Created with a POST (never merged into an object that appeared meanwhile).
    assert_eq!(managers, ["kubectl-helmop/Update"]);
    let cm = some(
        get_config_map(&f.down1, &apps, "settings").await?,
        "settings on down1",
    )?;
    assert_eq!(cm.data, settings.data);
    assert_eq!(cm.binary_data, settings.binary_data);
    let edge_copy = some(get_secret(&f.down2, &edge, "db").await?, "db on down2")?;
    assert_eq!(edge_copy.data, db.data);

    // Second run: zero writes, every object untouched.
    let before = [
        rv(&copy.metadata),
        rv(&cm.metadata),
        rv(&edge_copy.metadata),
    ];
    let second = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&second), 0, "{second:#}");
    assert!(
        states(&second).values().all(|s| s == "Unchanged"),
        "{second:#}"
    );
    let after = [
        rv(&some(get_secret(&f.down1, &apps, "db").await?, "db")?.metadata),
        rv(&some(
            get_config_map(&f.down1, &apps, "settings").await?,
            "settings",
        )?
        .metadata),
        rv(&some(get_secret(&f.down2, &edge, "db").await?, "db")?.metadata),
    ];
    assert_eq!(before, after);

    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let st = states(&status);
    assert_eq!(st.len(), 3, "{status:#}");
    assert!(st.values().all(|s| s == "Synced"), "{status:#}");
    Ok(())
}

use std::fmt::Debug;

use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::*;

const HELMOP_CRD: &str = include_str!("../../../vendor/fleet-crds/helmops.fleet.cattle.io.yaml");
const CLUSTER_CRD: &str = include_str!("../../../vendor/fleet-crds/clusters.fleet.cattle.io.yaml");
const CLUSTERGROUP_CRD: &str =
    include_str!("../../../vendor/fleet-crds/clustergroups.fleet.cattle.io.yaml");
const MAPPING_CRD: &str =
    include_str!("../../../vendor/fleet-crds/bundlenamespacemappings.fleet.cattle.io.yaml");

/// The openAPIV3Schema of a CRD's first version.
fn schema(crd: &str) -> Value {
    let docs = crate::yaml::parse_documents(crd.as_bytes()).unwrap();
    docs[0].value["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn round_trip<T: Serialize + DeserializeOwned>(v: &Value) -> Value {
    let typed: T = serde_json::from_value(v.clone()).unwrap();
    serde_json::to_value(&typed).unwrap()
}

fn arb_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        "[a-z0-9 ]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map("[a-z]{1,5}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// Objects that follow `schema`, with random subsets of the declared fields and, unless
/// `unknown` is false, extra fields the schema does not declare (what a newer Fleet could add).
fn from_schema(schema: &Value, unknown: bool) -> BoxedStrategy<Value> {
    if schema["x-kubernetes-int-or-string"] == json!(true) {
        return prop_oneof![
            any::<i32>().prop_map(Value::from),
            "[0-9]{1,2}%".prop_map(Value::from)
        ]
        .boxed();
    }
    match schema["type"].as_str() {
        Some("string") => "[a-z0-9.-]{1,8}".prop_map(Value::from).boxed(),
        Some("integer") | Some("number") => any::<i32>().prop_map(Value::from).boxed(),
        Some("boolean") => any::<bool>().prop_map(Value::from).boxed(),
        Some("array") => proptest::collection::vec(from_schema(&schema["items"], unknown), 0..3)
            .prop_map(Value::from)
            .boxed(),
        Some("object") => {
            if let Some(props) = schema["properties"].as_object() {
                let required: Vec<&str> = schema["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = props
                    .iter()
                    .map(|(key, sub)| {
                        // Label selectors are k8s-openapi types without an extra map; the API
                        // server prunes unknown fields inside them anyway (structural schema).
                        let unknown = unknown && !key.to_ascii_lowercase().ends_with("selector");
                        let key = key.clone();
                        let value = from_schema(sub, unknown);
                        if required.contains(&key.as_str()) {
                            value.prop_map(move |v| Some((key.clone(), v))).boxed()
                        } else {
                            proptest::option::of(value)
                                .prop_map(move |v| v.map(|v| (key.clone(), v)))
                                .boxed()
                        }
                    })
                    .collect();
                let extra = if unknown {
                    proptest::collection::btree_map("xUnknown[A-Z][a-z]{0,4}", arb_json(), 0..2)
                        .boxed()
                } else {
                    Just(Default::default()).boxed()
                };
                (fields, extra)
                    .prop_map(|(fields, extra)| {
                        let mut m: Map<String, Value> = fields.into_iter().flatten().collect();
                        m.extend(extra);
                        Value::Object(m)
                    })
                    .boxed()
            } else if schema["additionalProperties"].is_object() {
                proptest::collection::btree_map(
                    "[a-z]{1,5}",
                    from_schema(&schema["additionalProperties"], unknown),
                    0..3,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect()))
                .boxed()
            } else {
                // Free-form objects (helm values, templateValues, ...).
                proptest::collection::btree_map("[a-z]{1,5}", arb_json(), 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect()))
                    .boxed()
            }
        }
        _ => arb_json(),
    }
}

/// A whole object: fixed apiVersion/kind, ObjectMeta, and spec/status from the CRD schema.
fn arb_object(crd: &str, kind: &'static str) -> BoxedStrategy<Value> {
    let s = schema(crd);
    let spec = from_schema(&s["properties"]["spec"], true);
    let status = proptest::option::of(from_schema(&s["properties"]["status"], true));
    let top_extra = proptest::collection::btree_map("xUnknown[A-Z][a-z]{0,4}", arb_json(), 0..2);
    let labels = proptest::collection::btree_map("[a-z]{1,5}", "[a-z0-9]{0,5}", 0..3);
    (spec, status, top_extra, labels)
        .prop_map(move |(spec, status, extra, labels)| {
            let mut obj = json!({
                "apiVersion": FLEET_API_VERSION,
                "kind": kind,
                "metadata": {"name": "x", "namespace": "fleet-default", "labels": labels, "resourceVersion": "7"},
                "spec": spec,
            });
            if let Some(status) = status {
                obj["status"] = status;
            }
            let map = obj.as_object_mut().unwrap();
            map.extend(extra);
            obj
        })
        .boxed()
}

/// A BundleNamespaceMapping: its selectors sit at the top level, next to unknown fields.
fn arb_mapping() -> BoxedStrategy<Value> {
    let s = schema(MAPPING_CRD);
    let selector = |key: &str| proptest::option::of(from_schema(&s["properties"][key], false));
    let top_extra = proptest::collection::btree_map("xUnknown[A-Z][a-z]{0,4}", arb_json(), 0..2);
    (
        selector("bundleSelector"),
        selector("namespaceSelector"),
        top_extra,
    )
        .prop_map(|(bundles, namespaces, extra)| {
            let mut obj = json!({
                "apiVersion": FLEET_API_VERSION,
                "kind": "BundleNamespaceMapping",
                "metadata": {"name": "x", "namespace": "fleet-default", "resourceVersion": "7"},
            });
            let map = obj.as_object_mut().unwrap();
            if let Some(b) = bundles {
                map.insert("bundleSelector".into(), b);
            }
            if let Some(n) = namespaces {
                map.insert("namespaceSelector".into(), n);
            }
            map.extend(extra);
            obj
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn mapping_fields_survive_read_modify_write(obj in arb_mapping()) {
        prop_assert_eq!(round_trip::<BundleNamespaceMapping>(&obj), obj);
    }

    #[test]
    fn helmop_fields_survive_read_modify_write(obj in arb_object(HELMOP_CRD, "HelmOp")) {
        prop_assert_eq!(round_trip::<HelmOp>(&obj), obj);
    }

    #[test]
    fn cluster_fields_survive_read_modify_write(obj in arb_object(CLUSTER_CRD, "Cluster")) {
        prop_assert_eq!(round_trip::<Cluster>(&obj), obj);
    }

    #[test]
    fn clustergroup_fields_survive_read_modify_write(obj in arb_object(CLUSTERGROUP_CRD, "ClusterGroup")) {
        prop_assert_eq!(round_trip::<ClusterGroup>(&obj), obj);
    }
}

#[test]
fn the_generator_covers_the_fields_helmop_reads() {
    // Guards the property tests above against a schema walk that silently produces nothing.
    let s = schema(HELMOP_CRD);
    let spec = &s["properties"]["spec"]["properties"];
    for key in [
        "helm",
        "namespace",
        "defaultNamespace",
        "helmSecretName",
        "downstreamResources",
        "keepResources",
        "targets",
        "targetRestrictions",
        "labels",
    ] {
        assert!(spec.get(key).is_some(), "spec.{key} missing from the CRD");
    }
    let mapping = schema(MAPPING_CRD);
    for key in ["bundleSelector", "namespaceSelector"] {
        assert_eq!(
            mapping["properties"][key]["type"], "object",
            "{key} missing from the BundleNamespaceMapping CRD"
        );
    }
    let target = &spec["targets"]["items"]["properties"];
    for key in [
        "name",
        "clusterName",
        "clusterSelector",
        "clusterGroup",
        "clusterGroupSelector",
        "doNotDeploy",
        "namespace",
        "defaultNamespace",
        "helm",
        "downstreamResources",
        "keepResources",
    ] {
        assert!(
            target.get(key).is_some(),
            "spec.targets[].{key} missing from the CRD"
        );
    }
    let helm = &spec["helm"]["properties"];
    for key in ["chart", "repo", "version", "releaseName", "valuesFrom"] {
        assert!(
            helm.get(key).is_some(),
            "spec.helm.{key} missing from the CRD"
        );
    }
    let vf = &helm["valuesFrom"]["items"]["properties"];
    for key in ["configMapKeyRef", "secretKeyRef"] {
        for field in ["name", "namespace", "key"] {
            assert!(vf[key]["properties"].get(field).is_some(), "{key}.{field}");
        }
    }
    let c = schema(CLUSTER_CRD);
    for key in ["kubeConfigSecret", "kubeConfigSecretNamespace"] {
        assert!(
            c["properties"]["spec"]["properties"].get(key).is_some(),
            "{key}"
        );
    }
    let g = schema(CLUSTERGROUP_CRD);
    assert!(
        g["properties"]["spec"]["properties"]
            .get("selector")
            .is_some()
    );
}

/// A realistic HelmOp, with fields helmop does not model at every level.
fn realistic() -> Value {
    json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {
            "name": "shop", "namespace": "fleet-default", "uid": "u-1", "generation": 3,
            "annotations": {"helmop.dev/allow-missing": "true"},
            "finalizers": ["fleet.cattle.io/helmop-finalizer"],
        },
        "spec": {
            "helm": {
                "repo": "oci://ghcr.io/acme/charts/shop",
                "version": "1.2.x",
                "releaseName": "shop",
                "values": {"replicas": 2, "image": {"tag": "v1"}},
                "valuesFrom": [
                    {"secretKeyRef": {"name": "db", "namespace": "fleet-default", "key": "values.yaml", "futureField": 1}},
                    {"configMapKeyRef": {"name": "settings", "key": "v"}, "futureEntryField": true},
                ],
                "timeoutSeconds": 300,
                "atomic": true,
            },
            "namespace": "shop",
            "helmSecretName": "registry-creds",
            "insecureSkipTLSVerify": false,
            "pollingInterval": "5m",
            "downstreamResources": [{"kind": "Secret", "name": "db"}, {"kind": "ConfigMap", "name": "settings", "futureField": "x"}],
            "keepResources": false,
            "targets": [
                {
                    "name": "eu", "clusterGroup": "eu",
                    "clusterSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
                    "helm": {"values": {"region": "eu"}, "version": "1.3.0", "futureHelm": "y"},
                    "downstreamResources": [{"kind": "ConfigMap", "name": "eu-settings"}],
                    "doNotDeploy": false,
                    "keepResources": true,
                    "correctDrift": {"enabled": true},
                    "futureTargetField": {"a": [1, 2]},
                },
                {"clusterSelector": {}, "namespace": "shop-rest"},
            ],
            "correctDrift": {"enabled": false},
            "futureSpecField": [1, "two", null],
        },
        "status": {"version": "1.2.7", "conditions": [{"type": "Ready", "status": "True"}]},
        "futureTopLevel": "kept",
    })
}

#[test]
fn realistic_helmop_round_trips_and_reads() {
    let v = realistic();
    assert_eq!(round_trip::<HelmOp>(&v), v);

    let op: HelmOp = serde_json::from_value(v).unwrap();
    assert_eq!(op.spec.namespace(), Some("shop"));
    assert_eq!(op.spec.helm_secret_name(), Some("registry-creds"));
    assert_eq!(op.spec.downstream_resources().len(), 2);
    assert_eq!(
        op.spec.downstream_resources()[0].to_ref(),
        Some(crate::resource::ResourceRef::secret("db"))
    );
    let helm = op.spec.helm.as_ref().unwrap();
    assert_eq!(helm.repo.as_deref(), Some("oci://ghcr.io/acme/charts/shop"));
    assert_eq!(helm.values_from().len(), 2);
    assert_eq!(
        helm.values_from()[0]
            .secret_key_ref
            .as_ref()
            .unwrap()
            .namespace
            .as_deref(),
        Some("fleet-default")
    );
    let t = &op.spec.targets()[0];
    assert_eq!(t.cluster_group(), Some("eu"));
    assert!(t.keep_resources());
    assert!(!t.do_not_deploy());
    assert_eq!(
        t.downstream_resources()[0].to_ref().unwrap().to_string(),
        "configmap/eu-settings"
    );
    assert_eq!(op.spec.targets()[1].namespace(), Some("shop-rest"));
    assert!(op.spec.targets()[1].cluster_selector.is_some());
    assert!(op.spec.targets()[1].cluster_group_selector.is_none());
}

#[test]
fn modify_keeps_unknown_fields() {
    let mut op: HelmOp = serde_json::from_value(realistic()).unwrap();
    op.spec
        .downstream_resources
        .get_or_insert_with(Vec::new)
        .push(DownstreamResource::new("Secret", "tls"));
    op.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("x".into(), "y".into());
    let out = serde_json::to_value(&op).unwrap();
    assert_eq!(out["futureTopLevel"], "kept");
    assert_eq!(out["spec"]["futureSpecField"], json!([1, "two", null]));
    assert_eq!(
        out["spec"]["targets"][0]["futureTargetField"],
        json!({"a": [1, 2]})
    );
    assert_eq!(out["spec"]["targets"][0]["helm"]["futureHelm"], "y");
    assert_eq!(
        out["spec"]["helm"]["valuesFrom"][0]["secretKeyRef"]["futureField"],
        1
    );
    assert_eq!(
        out["spec"]["helm"]["valuesFrom"][1]["futureEntryField"],
        true
    );
    assert_eq!(out["spec"]["downstreamResources"][1]["futureField"], "x");
    assert_eq!(
        out["spec"]["downstreamResources"][2],
        json!({"kind": "Secret", "name": "tls"})
    );
    assert_eq!(out["status"]["version"], "1.2.7");
}

#[test]
fn explicit_empty_values_are_kept() {
    let v = json!({
        "apiVersion": FLEET_API_VERSION, "kind": "HelmOp", "metadata": {},
        "spec": {"downstreamResources": [], "targets": [{"clusterSelector": {}, "doNotDeploy": false, "keepResources": false}], "keepResources": false, "namespace": ""},
    });
    assert_eq!(round_trip::<HelmOp>(&v), v);
}

#[test]
fn missing_spec_and_type_meta_default() {
    let op: HelmOp = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
    assert_eq!(op.api_version, FLEET_API_VERSION);
    assert_eq!(op.kind, "HelmOp");
    assert!(op.spec.targets().is_empty());
    assert!(!op.spec.keep_resources());
    assert_eq!(op.spec.namespace(), None);
}

#[test]
fn cluster_kubeconfig_secret_location() {
    let mut c = Cluster::new("fleet-default", "c1", &[]);
    assert_eq!(c.kubeconfig_secret(), None);
    c.spec.kube_config_secret = Some("c1-kubeconfig".into());
    assert_eq!(
        c.kubeconfig_secret(),
        Some(("fleet-default".into(), "c1-kubeconfig".into()))
    );
    c.spec.kube_config_secret_namespace = Some("secrets".into());
    assert_eq!(
        c.kubeconfig_secret(),
        Some(("secrets".into(), "c1-kubeconfig".into()))
    );
    c.spec.kube_config_secret_namespace = Some(String::new());
    assert_eq!(
        c.kubeconfig_secret(),
        Some(("fleet-default".into(), "c1-kubeconfig".into()))
    );
}

#[test]
fn a_cluster_is_off_schedule_only_when_scheduled_without_an_active_schedule() {
    // rancher/fleet v0.16 target/target.go: OffSchedule = Scheduled && !ActiveSchedule.
    let off = |status: Value| {
        let c: Cluster = serde_json::from_value(json!({
            "metadata": {"name": "c1", "namespace": "ns"},
            "status": status,
        }))
        .unwrap();
        c.off_schedule()
    };
    assert!(off(json!({"scheduled": true})));
    assert!(off(json!({"scheduled": true, "activeSchedule": false})));
    assert!(!off(json!({"scheduled": true, "activeSchedule": true})));
    assert!(!off(json!({"scheduled": false})));
    // activeSchedule alone means nothing: no Schedule holds the Cluster.
    assert!(!off(json!({"activeSchedule": false})));
    assert!(!off(json!({"display": {"readyBundles": "1/1"}})));
    assert!(!off(Value::Null));
    assert!(!Cluster::new("ns", "c1", &[]).off_schedule());
}

#[test]
fn cluster_status_fields_helmop_does_not_read_survive() {
    let v = json!({
        "apiVersion": FLEET_API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": "ns"},
        "spec": {},
        "status": {"scheduled": true, "activeSchedule": false, "display": {"readyBundles": "1/1"}},
    });
    assert_eq!(round_trip::<Cluster>(&v), v);
}

#[test]
fn kubeconfig_namespaces_fleet_reads_from() {
    let c = Cluster::new("team-a", "c1", &[]);
    for ns in [
        "team-a",
        "fleet-local",
        "fleet-default",
        "cattle-fleet-system",
        "fleet-system",
        "cattle-fleet-clusters-system",
        "fleet-clusters-system",
        "cluster-abc",
        "cluster-",
    ] {
        assert!(c.fleet_reads_kubeconfig_from(ns), "{ns}");
    }
    for ns in [
        "team-b",
        "kube-system",
        "default",
        "Fleet-default",
        "fleet-default-x",
        "my-cluster-x",
        "",
    ] {
        assert!(!c.fleet_reads_kubeconfig_from(ns), "{ns}");
    }
}

fn assert_api_resource<K>()
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    assert_eq!(K::api_version(&()), FLEET_API_VERSION);
    assert_eq!(K::group(&()), FLEET_GROUP);
    assert_eq!(K::version(&()), FLEET_VERSION);
}

#[test]
fn usable_with_kube_api() {
    assert_api_resource::<HelmOp>();
    assert_api_resource::<Cluster>();
    assert_api_resource::<ClusterGroup>();
    assert_api_resource::<BundleNamespaceMapping>();
    assert_eq!(
        <BundleNamespaceMapping as kube::Resource>::url_path(&(), Some("ns")),
        "/apis/fleet.cattle.io/v1alpha1/namespaces/ns/bundlenamespacemappings"
    );
    assert_eq!(
        <HelmOp as kube::Resource>::url_path(&(), Some("fleet-default")),
        "/apis/fleet.cattle.io/v1alpha1/namespaces/fleet-default/helmops"
    );
    assert_eq!(
        <Cluster as kube::Resource>::url_path(&(), Some("ns")),
        "/apis/fleet.cattle.io/v1alpha1/namespaces/ns/clusters"
    );
    assert_eq!(
        <ClusterGroup as kube::Resource>::url_path(&(), None),
        "/apis/fleet.cattle.io/v1alpha1/clustergroups"
    );
    let op = HelmOp::new("ns", "a", HelmOpSpec::default());
    assert_eq!(kube::Resource::meta(&op).name.as_deref(), Some("a"));
}

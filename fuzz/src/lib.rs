//! Shared pieces of the fuzz targets: a byte-driven generator of HelmOp-shaped JSON (random bytes rarely form
//! JSON that reaches the interesting validation paths), and decision logic for driving the real admission router
//! without a cluster.

use futures::future::BoxFuture;
use helmop_core::validate::{Severity, validate_helmop_in};
use helmop_webhook::admission::Request;
use helmop_webhook::server::{Handlers, Webhook};
use helmop_webhook::verdict::Verdict;
use serde_json::{Map, Value};

/// Reads the fuzzer's bytes as a sequence of choices; when they run out every choice is 0 (the generator then
/// closes what it has open).
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn pick<'t, T>(&mut self, items: &'t [T]) -> &'t T {
        &items[usize::from(self.byte()) % items.len()]
    }

    /// Up to 24 raw bytes as a (lossy) string: names with odd characters, case and length.
    fn raw_string(&mut self) -> String {
        let len = usize::from(self.byte() % 25).min(self.data.len());
        let (s, rest) = self.data.split_at(len);
        self.data = rest;
        String::from_utf8_lossy(s).into_owned()
    }
}

/// Keys of the HelmOp schema (and a few that are not), so generated objects hit real fields.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "annotations",
    "labels",
    "spec",
    "helm",
    "repo",
    "chart",
    "version",
    "releaseName",
    "values",
    "valuesFrom",
    "secretKeyRef",
    "configMapKeyRef",
    "key",
    "downstreamResources",
    "targets",
    "clusterName",
    "clusterSelector",
    "clusterGroup",
    "clusterGroupSelector",
    "matchLabels",
    "matchExpressions",
    "operator",
    "doNotDeploy",
    "keepResources",
    "defaultNamespace",
    "targetNamespace",
    "helmSecretName",
    "insecureSkipTLSVerify",
    "paused",
    "helmop.dev/allow-missing",
    "unknownField",
];

/// String values that mean something to the validator.
const STRINGS: &[&str] = &[
    "",
    "Secret",
    "ConfigMap",
    "secret",
    "CONFIGMAP",
    "Deployment",
    "db",
    "Bad_Name",
    "a.b-c",
    "true",
    "false",
    "1.2.3",
    ">= 1.0.0 < 2",
    "v1.0.0-rc.1+build",
    "oci://registry.example.com/charts/app",
    "https://charts.example.com",
    "http://",
    "./chart.tgz",
    "fleet.cattle.io/v1alpha1",
    "HelmOp",
    "default",
    "kube-system",
    "In",
    "NotIn",
    "Exists",
];

/// A JSON value chosen by `bytes`: mostly objects with schema keys, nested at most `depth` deep.
pub fn json_value(bytes: &mut Bytes<'_>, depth: u8) -> Value {
    let choice = bytes.byte();
    match if depth == 0 { choice % 6 } else { choice % 9 } {
        0 => Value::Null,
        1 => Value::Bool(choice & 0x80 != 0),
        2 => Value::from(i64::from(bytes.byte()) - 64),
        3 => Value::from(f64::from(bytes.byte()) / 3.0),
        4 => Value::String(bytes.pick(STRINGS).to_string()),
        5 => Value::String(bytes.raw_string()),
        6 => {
            let len = bytes.byte() % 5;
            Value::Array((0..len).map(|_| json_value(bytes, depth - 1)).collect())
        }
        _ => {
            let len = bytes.byte() % 6;
            let mut map = Map::new();
            for _ in 0..len {
                let key = if bytes.byte().is_multiple_of(8) {
                    bytes.raw_string()
                } else {
                    bytes.pick(KEYS).to_string()
                };
                map.insert(key, json_value(bytes, depth - 1));
            }
            Value::Object(map)
        }
    }
}

/// A HelmOp-like object: the usual envelope around a generated `spec`, or (one time in eight) any value.
pub fn helmop_like(data: &[u8]) -> Value {
    let mut bytes = Bytes::new(data);
    if bytes.byte().is_multiple_of(8) {
        return json_value(&mut bytes, 6);
    }
    let mut spec = json_value(&mut bytes, 6);
    // Most runs get a plausible helm section so the validator goes past "spec.helm is missing".
    if let Value::Object(map) = &mut spec
        && !bytes.byte().is_multiple_of(4)
    {
        map.entry("helm").or_insert_with(|| {
            serde_json::json!({"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"})
        });
    }
    serde_json::json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": "app", "namespace": "team"},
        "spec": spec,
    })
}

/// Pure stand-ins for the live handlers: HelmOps get the core validation (so denial messages built from
/// arbitrary input go through the encoder), workloads get a patch, references are allowed. No cluster, no I/O.
pub struct CoreHandlers;

impl Handlers for CoreHandlers {
    fn review<'a>(&'a self, webhook: Webhook, req: &'a Request) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            match webhook {
                Webhook::Helmops => {
                    let Some(object) = &req.object else {
                        return Verdict::allow();
                    };
                    let findings = validate_helmop_in(object.view(), req.namespace.as_deref());
                    let (denials, warnings): (Vec<_>, Vec<_>) = findings
                        .into_iter()
                        .partition(|f| f.severity == Severity::Deny);
                    let warnings = warnings.iter().map(|f| f.to_string()).collect();
                    if denials.is_empty() {
                        Verdict::allow_with_warnings(warnings)
                    } else {
                        Verdict::Deny {
                            message: denials
                                .iter()
                                .map(|f| f.to_string())
                                .collect::<Vec<_>>()
                                .join("; "),
                            code: 403,
                            warnings,
                        }
                    }
                }
                Webhook::Workloads => {
                    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                        {"op": "add", "path": "/metadata/annotations/helmop.dev~1config-hash", "value": req.name}
                    ]))
                    .unwrap_or(json_patch::Patch(Vec::new()));
                    Verdict::Allow {
                        patch: Some(patch),
                        warnings: vec![format!("stamped {}", req.name)],
                    }
                }
                Webhook::References => Verdict::allow(),
            }
        })
    }

    fn ready(&self) -> bool {
        true
    }
}

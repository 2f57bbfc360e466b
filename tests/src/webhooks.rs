//! Registering admission webhooks that the API server reaches by `clientConfig.url`.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};

use crate::namespaces::TEST_NAMESPACE_LABEL;

const FIELD_MANAGER: &str = "helmop-tests";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookKind {
    Validating,
    Mutating,
}

/// One `rules` entry: which operations on which resources are sent to the webhook.
#[derive(Debug, Clone)]
pub struct WebhookRule {
    pub operations: Vec<String>,
    pub api_groups: Vec<String>,
    pub api_versions: Vec<String>,
    pub resources: Vec<String>,
}

impl WebhookRule {
    /// E.g. `WebhookRule::new(&["CREATE", "UPDATE"], "fleet.cattle.io", "v1alpha1", &["helmops"])`;
    /// the core group is `""`.
    pub fn new(
        operations: &[&str],
        api_group: &str,
        api_version: &str,
        resources: &[&str],
    ) -> Self {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        WebhookRule {
            operations: owned(operations),
            api_groups: vec![api_group.to_owned()],
            api_versions: vec![api_version.to_owned()],
            resources: owned(resources),
        }
    }
}

/// A webhook configuration with one webhook, built step by step:
///
/// ```no_run
/// # use helmop_tests::*;
/// # async fn demo(client: kube::Client, url: String, ca: String, ns: String) -> anyhow::Result<()> {
/// WebhookRegistration::new(WebhookKind::Validating, "deny-configmaps", &url, &ca)
///     .rule(WebhookRule::new(&["CREATE"], "", "v1", &["configmaps"]))
///     .only_namespace(&ns)
///     .register(&client)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct WebhookRegistration {
    kind: WebhookKind,
    name: String,
    url: String,
    ca_pem: String,
    rules: Vec<WebhookRule>,
    namespace: Option<String>,
    failure_policy: String,
    timeout_seconds: i32,
}

impl WebhookRegistration {
    /// Failure policy `Fail`, 10 s timeout, all namespaces until [`Self::only_namespace`].
    pub fn new(kind: WebhookKind, name: &str, url: &str, ca_pem: &str) -> Self {
        WebhookRegistration {
            kind,
            name: name.to_owned(),
            url: url.to_owned(),
            ca_pem: ca_pem.to_owned(),
            rules: Vec::new(),
            namespace: None,
            failure_policy: "Fail".to_owned(),
            timeout_seconds: 10,
        }
    }

    pub fn rule(mut self, rule: WebhookRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Limit the webhook to one namespace made by `fresh_namespace`, so that concurrent tests
    /// on the shared clusters are not affected by it.
    pub fn only_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    /// `Fail` (default) or `Ignore`.
    pub fn failure_policy(mut self, policy: &str) -> Self {
        self.failure_policy = policy.to_owned();
        self
    }

    pub fn timeout_seconds(mut self, seconds: i32) -> Self {
        self.timeout_seconds = seconds;
        self
    }

    /// Creates or replaces the configuration (named like the registration) on the cluster.
    pub async fn register(&self, client: &Client) -> anyhow::Result<()> {
        let client_config = WebhookClientConfig {
            url: Some(self.url.clone()),
            ca_bundle: Some(ByteString(self.ca_pem.clone().into_bytes())),
            service: None,
        };
        let rules: Vec<RuleWithOperations> = self
            .rules
            .iter()
            .map(|r| RuleWithOperations {
                operations: Some(r.operations.clone()),
                api_groups: Some(r.api_groups.clone()),
                api_versions: Some(r.api_versions.clone()),
                resources: Some(r.resources.clone()),
                scope: None,
            })
            .collect();
        let namespace_selector = self.namespace.as_ref().map(|ns| LabelSelector {
            match_labels: Some(BTreeMap::from([(
                TEST_NAMESPACE_LABEL.to_owned(),
                ns.clone(),
            )])),
            match_expressions: None,
        });
        // Webhook names must be fully qualified (at least three DNS labels).
        let webhook_name = format!("{}.tests.helmop.dev", self.name);
        let metadata = ObjectMeta {
            name: Some(self.name.clone()),
            ..Default::default()
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let review_versions = vec!["v1".to_owned()];
        match self.kind {
            WebhookKind::Validating => {
                let config = ValidatingWebhookConfiguration {
                    metadata,
                    webhooks: Some(vec![ValidatingWebhook {
                        name: webhook_name,
                        client_config,
                        rules: Some(rules),
                        namespace_selector,
                        failure_policy: Some(self.failure_policy.clone()),
                        side_effects: "None".to_owned(),
                        admission_review_versions: review_versions,
                        timeout_seconds: Some(self.timeout_seconds),
                        ..Default::default()
                    }]),
                };
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .patch(&self.name, &params, &Patch::Apply(&config))
                    .await
                    .with_context(|| format!("registering validating webhook {}", self.name))?;
            }
            WebhookKind::Mutating => {
                let config = MutatingWebhookConfiguration {
                    metadata,
                    webhooks: Some(vec![MutatingWebhook {
                        name: webhook_name,
                        client_config,
                        rules: Some(rules),
                        namespace_selector,
                        failure_policy: Some(self.failure_policy.clone()),
                        side_effects: "None".to_owned(),
                        admission_review_versions: review_versions,
                        timeout_seconds: Some(self.timeout_seconds),
                        reinvocation_policy: Some("IfNeeded".to_owned()),
                        ..Default::default()
                    }]),
                };
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .patch(&self.name, &params, &Patch::Apply(&config))
                    .await
                    .with_context(|| format!("registering mutating webhook {}", self.name))?;
            }
        }
        Ok(())
    }
}

/// Registers a webhook for all namespaces; see [`WebhookRegistration`] to limit it to one.
pub async fn register_webhook(
    client: &Client,
    kind: WebhookKind,
    name: &str,
    url: &str,
    ca_pem: &str,
    rules: &[WebhookRule],
) -> anyhow::Result<()> {
    rules
        .iter()
        .cloned()
        .fold(
            WebhookRegistration::new(kind, name, url, ca_pem),
            WebhookRegistration::rule,
        )
        .register(client)
        .await
}

/// Deletes a webhook configuration registered above (absent is fine).
pub async fn unregister_webhook(
    client: &Client,
    kind: WebhookKind,
    name: &str,
) -> anyhow::Result<()> {
    let params = DeleteParams::default();
    let result = match kind {
        WebhookKind::Validating => Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(name, &params)
            .await
            .map(|_| ()),
        WebhookKind::Mutating => Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(name, &params)
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting webhook configuration {name}")),
    }
}

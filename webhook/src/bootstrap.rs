//! One-shot installers run as Jobs from the webhook image (`helmop-bootstrap`), so the manifests need no
//! shell, no openssl and no third-party image:
//!
//! - `hash-key`: creates the hash-key Secret with fresh random bytes when it does not exist; never overwrites.
//! - `tls`: for clusters without cert-manager, keeps a CA (its own Secret) and a serving certificate for the
//!   webhook Service (Secret `kubernetes.io/tls`, mounted by the Deployment), renews the certificate when it
//!   nears expiry (the pods reload it from the volume), and writes the CA into the webhook configurations'
//!   `caBundle`. Idempotent: run it again any time; a CronJob does, daily. It also keeps a client certificate
//!   for the API server from the same CA (Secret `helmop-apiserver-client`): installed in the API server's
//!   admission `kubeConfigFile`, it is what the webhook's `--client-ca /tls/ca.crt` lets through.

use std::time::Duration;

use helmop_core::names;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::collections::BTreeMap;

use crate::config::SecretRef;
use crate::error::{Error, Result};

/// Label on every Secret this module writes; Secrets without it are never modified.
pub const MANAGED_BY: (&str, &str) = (names::LABEL_APP_MANAGED_BY, names::BOOTSTRAP_MANAGER);
pub use names::{
    ANN_DNS_NAMES as DNS_NAMES, ANN_ISSUED_AT as ISSUED_AT, ANN_NOT_AFTER as NOT_AFTER,
};
/// How long a replaced CA stays in `caBundle` and in the serving Secret's `ca.crt` after a certificate
/// of the new CA was issued: the pods reload the new certificate within a minute or two of the kubelet
/// updating their volume, and the API server's client certificate must be copied meanwhile. Removed by
/// the first run after that (the daily CronJob).
pub const ROTATION_GRACE: Duration = Duration::from_secs(15 * 60);

const HASH_KEY_BYTES: usize = 32;
const CA_COMMON_NAME: &str = "helmop-webhook-ca";
const CA_VALIDITY_DAYS: u32 = 3650;
/// Subject of the API server's client certificate (also its identity in the Secret's annotation).
pub const API_SERVER_CLIENT_NAME: &str = "kube-apiserver-helmop-webhook-client";

fn bootstrap_error(msg: impl Into<String>) -> Error {
    Error::Bootstrap(msg.into())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())])
}

fn is_managed(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
}

/// What [`ensure_hash_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKeyOutcome {
    Created,
    AlreadyPresent,
}

fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    crate::tls::provider()
        .secure_random
        .fill(&mut buf)
        .map_err(|_| bootstrap_error("the system random number generator failed"))?;
    Ok(buf)
}

/// A new hash-key Secret: `HASH_KEY_BYTES` random bytes under data key `key`, immutable (rotate by deleting it).
pub fn hash_key_secret(name: &str, key: Vec<u8>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(managed_labels()),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        immutable: Some(true),
        data: Some(BTreeMap::from([("key".to_owned(), ByteString(key))])),
        ..Default::default()
    }
}

fn check_hash_key(secret: &Secret, at: &SecretRef) -> Result<()> {
    match secret.data.as_ref().and_then(|d| d.get("key")) {
        Some(key) if key.0.len() >= helmop_core::hash::HashKey::MIN_LEN => Ok(()),
        Some(key) => Err(bootstrap_error(format!(
            "secret {at} holds a {}-byte key, at least {} are needed; delete it and run again",
            key.0.len(),
            helmop_core::hash::HashKey::MIN_LEN
        ))),
        None => Err(bootstrap_error(format!(
            "secret {at} exists without data key `key`; delete it and run again"
        ))),
    }
}

/// Creates the hash-key Secret unless it exists; an existing one is checked, never changed.
pub async fn ensure_hash_key(client: Client, at: &SecretRef) -> Result<HashKeyOutcome> {
    let api: Api<Secret> = Api::namespaced(client, &at.namespace);
    if let Some(existing) = api.get_opt(&at.name).await? {
        check_hash_key(&existing, at)?;
        return Ok(HashKeyOutcome::AlreadyPresent);
    }
    let secret = hash_key_secret(&at.name, random_bytes(HASH_KEY_BYTES)?);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(HashKeyOutcome::Created),
        // Someone else created it between our GET and POST: theirs stands.
        Err(e) if is_conflict(&e) => {
            let existing = api.get(&at.name).await?;
            check_hash_key(&existing, at)?;
            Ok(HashKeyOutcome::AlreadyPresent)
        }
        Err(e) => Err(e.into()),
    }
}

/// A PEM certificate and key, with the expiry written into the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
    pub not_after: i64,
}

fn ca_params() -> Result<rcgen::CertificateParams> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| bootstrap_error(e.to_string()))?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, CA_COMMON_NAME);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    Ok(params)
}

fn validity(params: &mut rcgen::CertificateParams, now: i64, days: u32) -> Result<i64> {
    // Backdated a little for clocks that lag ours.
    let not_before = now - 3600;
    let not_after = now + i64::from(days) * 86_400;
    let at = |t| {
        time::OffsetDateTime::from_unix_timestamp(t).map_err(|e| bootstrap_error(e.to_string()))
    };
    params.not_before = at(not_before)?;
    params.not_after = at(not_after)?;
    Ok(not_after)
}

/// A new CA (ECDSA P-256) valid for ten years from `now` (unix seconds).
pub fn generate_ca(now: i64) -> Result<Pem> {
    let key = rcgen::KeyPair::generate().map_err(|e| bootstrap_error(e.to_string()))?;
    let mut params = ca_params()?;
    let not_after = validity(&mut params, now, CA_VALIDITY_DAYS)?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| bootstrap_error(e.to_string()))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after,
    })
}

/// A serving certificate for `dns_names`, signed by the CA made by [`generate_ca`].
pub fn issue_serving_cert(ca: &Pem, dns_names: &[String], now: i64, days: u32) -> Result<Pem> {
    issue(
        ca,
        dns_names,
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        now,
        days,
    )
}

/// A client certificate (for the API server) named `common_name`, signed by the CA made by [`generate_ca`]. Its
/// extended key usage is client authentication only, and the serving certificate's is server authentication
/// only, so neither passes for the other.
pub fn issue_client_cert(ca: &Pem, common_name: &str, now: i64, days: u32) -> Result<Pem> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| bootstrap_error(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    sign(
        ca,
        params,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        now,
        days,
    )
}

fn issue(
    ca: &Pem,
    dns_names: &[String],
    usage: rcgen::ExtendedKeyUsagePurpose,
    now: i64,
    days: u32,
) -> Result<Pem> {
    let mut params = rcgen::CertificateParams::new(dns_names.to_vec())
        .map_err(|e| bootstrap_error(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        dns_names.first().map_or("helmop-webhook", |s| s),
    );
    sign(ca, params, usage, now, days)
}

fn sign(
    ca: &Pem,
    mut params: rcgen::CertificateParams,
    usage: rcgen::ExtendedKeyUsagePurpose,
    now: i64,
    days: u32,
) -> Result<Pem> {
    let ca_key =
        rcgen::KeyPair::from_pem(&ca.key).map_err(|e| bootstrap_error(format!("CA key: {e}")))?;
    // The issuer is rebuilt from the same parameters as the CA: same subject, and the authority key id is
    // derived from the CA key, so no X.509 parsing is needed.
    let issuer = rcgen::Issuer::new(ca_params()?, ca_key);
    let key = rcgen::KeyPair::generate().map_err(|e| bootstrap_error(e.to_string()))?;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    let not_after = validity(&mut params, now, days)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| bootstrap_error(e.to_string()))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after,
    })
}

/// The names the API server may use for a Service.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_owned(),
    ]
}

fn tls_secret(name: &str, pem: &Pem, ca_cert: &str, dns_names: &[String]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(managed_labels()),
            annotations: Some(BTreeMap::from([
                (NOT_AFTER.to_owned(), pem.not_after.to_string()),
                (DNS_NAMES.to_owned(), dns_names.join(",")),
                (ISSUED_AT.to_owned(), unix_now().to_string()),
            ])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            (
                "tls.crt".to_owned(),
                ByteString(pem.cert.clone().into_bytes()),
            ),
            (
                "tls.key".to_owned(),
                ByteString(pem.key.clone().into_bytes()),
            ),
            ("ca.crt".to_owned(), ByteString(ca_cert.as_bytes().to_vec())),
        ])),
        ..Default::default()
    }
}

fn data_str<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| std::str::from_utf8(&b.0).ok())
}

fn pem_from_secret(secret: &Secret) -> Option<Pem> {
    let not_after = secret
        .metadata
        .annotations
        .as_ref()?
        .get(NOT_AFTER)?
        .parse()
        .ok()?;
    Some(Pem {
        cert: data_str(secret, "tls.crt")?.to_owned(),
        key: data_str(secret, "tls.key")?.to_owned(),
        not_after,
    })
}

/// Why the serving certificate is (re)issued, or `None` to keep it.
pub fn renewal_reason(
    secret: &Secret,
    ca_cert: &str,
    dns_names: &[String],
    now: i64,
    renew_before: Duration,
) -> Option<&'static str> {
    let Some(pem) = pem_from_secret(secret) else {
        return Some("certificate, key or expiry annotation missing");
    };
    // `ca.crt` may carry a replaced CA after the current one while a rotation settles.
    if pem_blocks(data_str(secret, "ca.crt").unwrap_or(""))
        .first()
        .copied()
        != Some(ca_cert.trim())
    {
        return Some("issued by another CA");
    }
    let names = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DNS_NAMES))
        .map(String::as_str);
    if names != Some(dns_names.join(",").as_str()) {
        return Some("issued for other DNS names");
    }
    if crate::tls::load_certified_key(pem.cert.as_bytes(), pem.key.as_bytes()).is_err() {
        return Some("certificate and key do not load");
    }
    let renew_before = i64::try_from(renew_before.as_secs()).unwrap_or(i64::MAX);
    if pem.not_after.saturating_sub(now) < renew_before {
        return Some("expires soon");
    }
    None
}

/// The PEM certificate blocks of `bundle`, trimmed, in order.
pub fn pem_blocks(bundle: &str) -> Vec<&str> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        out.push(rest[start..start + end + END.len()].trim());
        rest = &rest[start + end + END.len()..];
    }
    out
}

/// The CA bundle to trust next, given the one trusted now: add before remove. While `ca` is not in
/// `current`, it goes first and the CAs trusted so far stay (the pods may still serve a certificate of
/// the old CA, and the API server may still present a client certificate of it); once it is, the others
/// go only when `settled` (the new CA's certificate has been out [`ROTATION_GRACE`]).
pub fn next_bundle(current: &str, ca: &str, settled: bool) -> String {
    let ca = ca.trim();
    let blocks = pem_blocks(current);
    let others: Vec<&str> = blocks.iter().copied().filter(|b| *b != ca).collect();
    if blocks.contains(&ca) && (settled || others.is_empty()) {
        return format!("{ca}\n");
    }
    let mut out = format!("{ca}\n");
    for b in others {
        out.push_str(b);
        out.push('\n');
    }
    out
}

/// Sets `caBundle` on every webhook of a configuration; true when something changed.
pub fn set_ca_bundle<'a>(
    configs: impl IntoIterator<Item = &'a mut WebhookClientConfig>,
    ca_pem: &str,
) -> bool {
    let mut changed = false;
    for config in configs {
        if config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(ca_pem.as_bytes()) {
            config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
            changed = true;
        }
    }
    changed
}

/// Where [`bootstrap_tls`] keeps things.
#[derive(Debug, Clone)]
pub struct TlsTarget {
    /// The serving certificate Secret mounted by the Deployment.
    pub secret: SecretRef,
    /// The CA Secret (certificate and key), kept so renewals keep the same `caBundle`.
    pub ca_secret: SecretRef,
    /// The API server's client certificate Secret (`kubernetes.io/tls` with `ca.crt`).
    pub client_secret: SecretRef,
    /// The webhook Service name (in `secret.namespace`).
    pub service: String,
    /// Name of the Validating- and MutatingWebhookConfiguration to inject the CA into.
    pub webhook_configuration: String,
    pub validity_days: u32,
    pub renew_before: Duration,
}

/// What [`bootstrap_tls`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOutcome {
    pub ca_created: bool,
    /// Why the serving certificate was issued, `None` when kept.
    pub issued: Option<&'static str>,
    /// Why the API server's client certificate was issued, `None` when kept.
    pub client_issued: Option<&'static str>,
    pub validating_patched: bool,
    pub mutating_patched: bool,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

async fn ensure_ca(api: &Api<Secret>, at: &SecretRef, now: i64) -> Result<(Pem, bool)> {
    if let Some(existing) = api.get_opt(&at.name).await? {
        if !is_managed(&existing) {
            return Err(bootstrap_error(format!(
                "secret {at} is not managed by helmop-bootstrap; not touching it"
            )));
        }
        return pem_from_secret(&existing)
            .map(|pem| (pem, false))
            .ok_or_else(|| {
                bootstrap_error(format!(
                    "CA secret {at} is incomplete; delete it and run again"
                ))
            });
    }
    let ca = generate_ca(now)?;
    let secret = tls_secret(&at.name, &ca, &ca.cert, &[]);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok((ca, true)),
        Err(e) if is_conflict(&e) => {
            let existing = api.get(&at.name).await?;
            pem_from_secret(&existing)
                .map(|pem| (pem, false))
                .ok_or_else(|| {
                    bootstrap_error(format!(
                        "CA secret {at} is incomplete; delete it and run again"
                    ))
                })
        }
        Err(e) => Err(e.into()),
    }
}

/// Issues the certificate of Secret `at` (for `names`) when [`renewal_reason`] says so; the reason (`None`
/// when kept) and the `ca.crt` it now holds. With `trusted` (the `caBundle` the API server trusts now, for the
/// serving certificate) `ca.crt` is [`next_bundle`] of it, so the webhook's `--client-ca` also accepts a
/// replaced CA until the rotation has settled; without, just the CA.
///
/// Two pods' initContainers may run this at the same moment (a fresh install starts both replicas): the
/// loser of a create or replace re-reads and decides again, so it keeps the winner's certificate instead
/// of failing or overwriting it.
async fn ensure_leaf(
    client: &Client,
    at: &SecretRef,
    ca: &Pem,
    names: &[String],
    target: &TlsTarget,
    trusted: Option<&str>,
    issue: impl Fn(&Pem, i64, u32) -> Result<Pem>,
) -> Result<(Option<&'static str>, String)> {
    for _ in 0..5 {
        match ensure_leaf_once(client, at, ca, names, target, trusted, &issue).await {
            Err(Error::Kube(e)) if is_conflict(&e) => {
                tracing::info!(secret = %at, "written meanwhile by another run; reading it again");
            }
            other => return other,
        }
    }
    Err(bootstrap_error(format!(
        "secret {at} kept changing; run again"
    )))
}

async fn ensure_leaf_once(
    client: &Client,
    at: &SecretRef,
    ca: &Pem,
    names: &[String],
    target: &TlsTarget,
    trusted: Option<&str>,
    issue: &impl Fn(&Pem, i64, u32) -> Result<Pem>,
) -> Result<(Option<&'static str>, String)> {
    let now = unix_now();
    let api: Api<Secret> = Api::namespaced(client.clone(), &at.namespace);
    let existing = api.get_opt(&at.name).await?;
    let reason = match &existing {
        Some(s) if !is_managed(s) => {
            return Err(bootstrap_error(format!(
                "secret {at} is not managed by helmop-bootstrap; not touching it"
            )));
        }
        Some(s) => renewal_reason(s, &ca.cert, names, now, target.renew_before),
        None => Some("no certificate yet"),
    };
    let settled = reason.is_none() && existing.as_ref().is_some_and(|s| settled(s, now));
    let ca_crt = match trusted {
        Some(bundle) => next_bundle(bundle, &ca.cert, settled),
        None => ca.cert.clone(),
    };
    if let Some(reason) = reason {
        let pem = issue(ca, now, target.validity_days)?;
        let mut secret = tls_secret(&at.name, &pem, &ca_crt, names);
        match existing {
            // Replace with the read resourceVersion: a concurrent run makes this fail instead of interleaving.
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version;
                api.replace(&at.name, &PostParams::default(), &secret)
                    .await?;
            }
            None => {
                api.create(&PostParams::default(), &secret).await?;
            }
        }
        tracing::info!(secret = %at, reason, not_after = pem.not_after, "certificate issued");
    } else if let Some(mut secret) = existing
        && data_str(&secret, "ca.crt") != Some(ca_crt.as_str())
    {
        // Kept, but the CAs it vouches for changed (a replaced CA added or, settled, removed).
        if let Some(data) = secret.data.as_mut() {
            data.insert("ca.crt".to_owned(), ByteString(ca_crt.clone().into_bytes()));
        }
        api.replace(&at.name, &PostParams::default(), &secret)
            .await?;
        tracing::info!(secret = %at, cas = pem_blocks(&ca_crt).len(), "ca.crt updated");
    }
    Ok((reason, ca_crt))
}

/// Fails when the serving certificate file this pod mounted is missing or empty. A Secret volume is filled
/// when the kubelet mounts it, before the initContainers run: on a fresh install the Secret they create
/// comes too late for this pod, and the kubelet fills the volume again before it restarts the failed
/// initContainer, so the webhook container never starts without a certificate.
pub fn require_mounted(path: &std::path::Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > 0 => Ok(()),
        Ok(_) | Err(_) => Err(bootstrap_error(format!(
            "{} is not mounted yet (the certificate Secret was created after this pod started); \
             exiting so the kubelet mounts it before the retry",
            path.display()
        ))),
    }
}

/// Whether the certificate in `secret` has been out for [`ROTATION_GRACE`] (certificates from before
/// the annotation count as settled).
fn settled(secret: &Secret, now: i64) -> bool {
    let grace = i64::try_from(ROTATION_GRACE.as_secs()).unwrap_or(i64::MAX);
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ISSUED_AT))
        .and_then(|t| t.parse::<i64>().ok())
        .is_none_or(|issued| now.saturating_sub(issued) >= grace)
}

/// The `caBundle` the API server trusts now: the first one set on the webhook configurations (empty
/// when none is set yet).
async fn trusted_bundle(client: &Client, name: &str) -> Result<String> {
    let first = |configs: Vec<&WebhookClientConfig>| {
        configs
            .into_iter()
            .find_map(|c| c.ca_bundle.as_ref())
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    if let Some(v) = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(name)
        .await?
        && let Some(bundle) = first(
            v.webhooks
                .iter()
                .flatten()
                .map(|w| &w.client_config)
                .collect(),
        )
    {
        return Ok(bundle);
    }
    if let Some(m) = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(name)
        .await?
        && let Some(bundle) = first(
            m.webhooks
                .iter()
                .flatten()
                .map(|w| &w.client_config)
                .collect(),
        )
    {
        return Ok(bundle);
    }
    Ok(String::new())
}

/// Ensures CA, serving certificate and `caBundle`s; see the module documentation.
pub async fn bootstrap_tls(client: Client, target: &TlsTarget) -> Result<TlsOutcome> {
    let now = unix_now();
    let ca_api: Api<Secret> = Api::namespaced(client.clone(), &target.ca_secret.namespace);
    let (ca, ca_created) = ensure_ca(&ca_api, &target.ca_secret, now).await?;

    let dns_names = service_dns_names(&target.service, &target.secret.namespace);
    let trusted = trusted_bundle(&client, &target.webhook_configuration).await?;
    let (reason, bundle) = ensure_leaf(
        &client,
        &target.secret,
        &ca,
        &dns_names,
        target,
        Some(&trusted),
        |ca, now, days| issue_serving_cert(ca, &dns_names, now, days),
    )
    .await?;
    let client_names = [API_SERVER_CLIENT_NAME.to_owned()];
    let (client_issued, _) = ensure_leaf(
        &client,
        &target.client_secret,
        &ca,
        &client_names,
        target,
        None,
        |ca, now, days| issue_client_cert(ca, API_SERVER_CLIENT_NAME, now, days),
    )
    .await?;

    let validating_patched = inject::<ValidatingWebhookConfiguration>(
        &client,
        &target.webhook_configuration,
        &bundle,
        |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        },
    )
    .await?;
    let mutating_patched = inject::<MutatingWebhookConfiguration>(
        &client,
        &target.webhook_configuration,
        &bundle,
        |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        },
    )
    .await?;
    Ok(TlsOutcome {
        ca_created,
        issued: reason,
        client_issued,
        validating_patched,
        mutating_patched,
    })
}

async fn inject<K>(
    client: &Client,
    name: &str,
    ca_pem: &str,
    client_configs: impl Fn(&mut K) -> Vec<&mut WebhookClientConfig>,
) -> Result<bool>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    // A few attempts: another writer (kubectl apply, a second bootstrap run) may bump the resourceVersion.
    for _ in 0..5 {
        let Some(mut config) = api.get_opt(name).await? else {
            return Err(bootstrap_error(format!(
                "{} {name} not found; apply the manifests first",
                K::kind(&())
            )));
        };
        if !set_ca_bundle(client_configs(&mut config), ca_pem) {
            return Ok(false);
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => return Ok(true),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(bootstrap_error(format!(
        "{} {name} kept changing; run again",
        K::kind(&())
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_750_000_000;

    fn names() -> Vec<String> {
        service_dns_names("helmop-webhook", "helmop-system")
    }

    #[test]
    fn the_mounted_certificate_must_be_there_and_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let err = require_mounted(&cert).unwrap_err().to_string();
        assert!(err.contains("not mounted yet"), "{err}");
        std::fs::write(&cert, b"").unwrap();
        assert!(require_mounted(&cert).is_err());
        std::fs::write(&cert, b"-----BEGIN CERTIFICATE-----").unwrap();
        require_mounted(&cert).unwrap();
    }

    #[test]
    fn hash_key_secret_has_32_random_bytes_and_is_immutable() {
        let a = random_bytes(HASH_KEY_BYTES).unwrap();
        let b = random_bytes(HASH_KEY_BYTES).unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        let s = hash_key_secret("helmop-hash-key", a.clone());
        assert_eq!(s.immutable, Some(true));
        assert_eq!(s.data.as_ref().unwrap()["key"].0, a);
        let at = SecretRef {
            namespace: "helmop-system".into(),
            name: "helmop-hash-key".into(),
        };
        assert!(check_hash_key(&s, &at).is_ok());
        let short = hash_key_secret("helmop-hash-key", vec![1; 31]);
        assert!(
            check_hash_key(&short, &at)
                .unwrap_err()
                .to_string()
                .contains("31-byte")
        );
    }

    #[tokio::test]
    async fn issued_certificate_is_trusted_through_the_ca_for_the_service_name() {
        let ca = generate_ca(unix_now()).unwrap();
        let leaf = issue_serving_cert(&ca, &names(), unix_now(), 365).unwrap();
        let key =
            crate::tls::load_certified_key(leaf.cert.as_bytes(), leaf.key.as_bytes()).unwrap();
        let resolver = std::sync::Arc::new(crate::tls::CertResolver::new(key));
        let server = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(
            crate::tls::server_config(resolver, None).unwrap(),
        ));

        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.cert.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
        for name in [
            "helmop-webhook.helmop-system.svc",
            "helmop-webhook.helmop-system.svc.cluster.local",
        ] {
            let (a, b) = tokio::io::duplex(64 * 1024);
            let accept = tokio::spawn({
                let server = server.clone();
                async move { server.accept(a).await.map(|_| ()) }
            });
            let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
            let _client = connector
                .connect(server_name, b)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            accept.await.unwrap().unwrap();
        }
        // A name the certificate was not issued for is refused.
        let (a, b) = tokio::io::duplex(64 * 1024);
        let _accept = tokio::spawn({
            let server = server.clone();
            async move { server.accept(a).await.map(|_| ()) }
        });
        let other = rustls::pki_types::ServerName::try_from("evil.example.com").unwrap();
        assert!(connector.connect(other, b).await.is_err());
    }

    /// `--client-ca` with the bootstrap's CA lets the API server's client certificate through and refuses the
    /// serving certificate used as a client one (server-auth usage only).
    #[tokio::test]
    async fn only_the_client_certificate_passes_the_client_ca() {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let now = unix_now();
        let ca = generate_ca(now).unwrap();
        let serving = issue_serving_cert(&ca, &names(), now, 365).unwrap();
        let client = issue_client_cert(&ca, API_SERVER_CLIENT_NAME, now, 365).unwrap();
        let key = crate::tls::load_certified_key(serving.cert.as_bytes(), serving.key.as_bytes())
            .unwrap();
        let resolver = std::sync::Arc::new(crate::tls::CertResolver::new(key));
        let roots = crate::tls::load_client_ca(ca.cert.as_bytes()).unwrap();
        let server = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(
            crate::tls::server_config(
                resolver,
                Some(std::sync::Arc::new(
                    crate::tls::ClientCaVerifier::new(roots.clone()).unwrap(),
                )),
            )
            .unwrap(),
        ));
        for (who, leaf, accepted) in [("client", &client, true), ("serving", &serving, false)] {
            let chain = rustls::pki_types::CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap();
            let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_client_auth_cert(chain, key)
                .unwrap();
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let (a, b) = tokio::io::duplex(64 * 1024);
            let accept = tokio::spawn({
                let server = server.clone();
                async move { server.accept(a).await.map(|_| ()) }
            });
            let name = rustls::pki_types::ServerName::try_from("helmop-webhook.helmop-system.svc")
                .unwrap();
            let _client = connector.connect(name, b).await;
            assert_eq!(accept.await.unwrap().is_ok(), accepted, "{who} certificate");
        }
    }

    #[test]
    fn renewal_keeps_a_good_certificate_and_renews_otherwise() {
        let ca = generate_ca(NOW).unwrap();
        let leaf = issue_serving_cert(&ca, &names(), NOW, 365).unwrap();
        let secret = tls_secret("helmop-webhook-tls", &leaf, &ca.cert, &names());
        let month = Duration::from_secs(30 * 86_400);
        assert_eq!(
            renewal_reason(&secret, &ca.cert, &names(), NOW, month),
            None
        );
        assert_eq!(
            renewal_reason(&secret, &ca.cert, &names(), NOW + 340 * 86_400, month),
            Some("expires soon")
        );
        let other_ca = generate_ca(NOW).unwrap();
        assert_eq!(
            renewal_reason(&secret, &other_ca.cert, &names(), NOW, month),
            Some("issued by another CA")
        );
        let renamed = service_dns_names("other", "helmop-system");
        assert_eq!(
            renewal_reason(&secret, &ca.cert, &renamed, NOW, month),
            Some("issued for other DNS names")
        );
        let mut broken = secret.clone();
        broken.metadata.annotations = None;
        assert!(renewal_reason(&broken, &ca.cert, &names(), NOW, month).is_some());
        let mut mismatched = secret.clone();
        let stranger = issue_serving_cert(&ca, &names(), NOW, 365).unwrap();
        mismatched
            .data
            .as_mut()
            .unwrap()
            .insert("tls.key".into(), ByteString(stranger.key.into_bytes()));
        assert_eq!(
            renewal_reason(&mismatched, &ca.cert, &names(), NOW, month),
            Some("certificate and key do not load")
        );
        assert_eq!(leaf.not_after, NOW + 365 * 86_400);
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert!(is_managed(&secret));
    }

    #[test]
    fn a_new_ca_is_added_before_the_old_one_is_removed() {
        let (old, new) = (generate_ca(NOW).unwrap(), generate_ca(NOW).unwrap());
        let (old_pem, new_pem) = (old.cert.trim(), new.cert.trim());
        // Nothing trusted yet: the CA alone.
        assert_eq!(pem_blocks(&next_bundle("", &new.cert, false)), [new_pem]);
        // A new CA while the old one is trusted: both, the new first, settled or not.
        for settled in [false, true] {
            let added = next_bundle(&old.cert, &new.cert, settled);
            assert_eq!(pem_blocks(&added), [new_pem, old_pem], "{settled}");
            // Not settled yet: both stay.
            assert_eq!(
                pem_blocks(&next_bundle(&added, &new.cert, false)),
                [new_pem, old_pem]
            );
            // Settled: the old one goes.
            assert_eq!(pem_blocks(&next_bundle(&added, &new.cert, true)), [new_pem]);
        }
        // Stable: the same CA alone stays alone.
        let alone = next_bundle(&new.cert, &new.cert, false);
        assert_eq!(next_bundle(&alone, &new.cert, false), alone);
        assert_eq!(
            pem_blocks("junk -----BEGIN CERTIFICATE----- no end"),
            Vec::<&str>::new()
        );
        // The serving Secret's ca.crt may carry the old CA after the current one: not "another CA".
        let leaf = issue_serving_cert(&new, &names(), NOW, 365).unwrap();
        let both = next_bundle(&old.cert, &new.cert, false);
        let secret = tls_secret("helmop-webhook-tls", &leaf, &both, &names());
        let month = Duration::from_secs(30 * 86_400);
        assert_eq!(
            renewal_reason(&secret, &new.cert, &names(), NOW, month),
            None
        );
        assert_eq!(
            renewal_reason(&secret, &old.cert, &names(), NOW, month),
            Some("issued by another CA")
        );
    }

    #[test]
    fn ca_bundle_is_set_on_every_webhook_once() {
        let mut configs = [
            WebhookClientConfig::default(),
            WebhookClientConfig::default(),
        ];
        assert!(set_ca_bundle(configs.iter_mut(), "PEM"));
        assert!(
            configs
                .iter()
                .all(|c| c.ca_bundle.as_ref().unwrap().0 == b"PEM")
        );
        assert!(
            !set_ca_bundle(configs.iter_mut(), "PEM"),
            "unchanged: no write"
        );
        assert!(set_ca_bundle(configs.iter_mut(), "NEW"));
    }
}

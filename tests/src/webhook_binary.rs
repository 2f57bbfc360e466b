//! The real `helmop-webhook` binary as a test subject: the debug build the e2e suites build with
//! `cargo build --bins`, or the release build the images ship, pinned to one CPU as `limits.cpu: "1"`
//! leaves it (the hostile-tenant suites; docs/webhook-safety.md).
//!
//! Unlike [`crate::LocalWebhook`] nothing is shared with the test's process: the test sees what the API
//! server and an operator see (answers, `/metrics`, the logs).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::binaries::target_profile_dir;
use crate::{DEFAULT_TIMEOUT, test_certs, wait_until};

/// Which build of `helmop-webhook` runs, and on how many CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WebhookBuild {
    /// `target/debug/helmop-webhook`, on every CPU.
    Debug,
    /// `target/release/helmop-webhook` (what the images ship), pinned to one CPU with `taskset`.
    ReleaseOneCpu,
}

impl WebhookBuild {
    fn binary(self) -> anyhow::Result<PathBuf> {
        match self {
            WebhookBuild::Debug => crate::workspace_binary("helmop-webhook"),
            WebhookBuild::ReleaseOneCpu => {
                let target = target_profile_dir()?;
                let path = target
                    .parent()
                    .context("the target directory has no parent")?
                    .join("release")
                    .join("helmop-webhook");
                if !path.is_file() {
                    bail!(
                        "{} is missing: build it first with `cargo build --release -p helmop-webhook --bin helmop-webhook` (./dev test does)",
                        path.display()
                    );
                }
                Ok(path)
            }
        }
    }
}

/// The first CPU this process may run on (`Cpus_allowed_list` of /proc/self/status): CPU 0 need not be
/// among them in a container with a cpuset.
fn first_allowed_cpu() -> anyhow::Result<u32> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .context("no Cpus_allowed_list in /proc/self/status")?;
    let first = list
        .trim()
        .split([',', '-'])
        .next()
        .context("an empty Cpus_allowed_list")?;
    first
        .parse()
        .with_context(|| format!("Cpus_allowed_list {list:?}"))
}

fn free_port() -> anyhow::Result<u16> {
    // Bound and released at once: another process could take it meanwhile, which only fails the test loudly.
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `helmop-webhook` on loopback ports, with its stderr (the logs) in a file; killed when dropped.
pub struct WebhookBinary {
    child: tokio::process::Child,
    pub url: String,
    pub admin_url: String,
    /// The CA of the serving certificate, for a webhook configuration's `caBundle`.
    pub ca_pem: String,
    log: PathBuf,
    client_ca: Option<PathBuf>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl WebhookBinary {
    /// Starts the debug `helmop-webhook` against the cluster of `kubeconfig` with `RUST_LOG=rust_log`
    /// and waits until `/readyz` answers 200. Anyone may call it (no `--client-ca`).
    pub async fn start(
        kubeconfig: &Path,
        rust_log: &str,
        extra: &[&str],
    ) -> anyhow::Result<WebhookBinary> {
        Self::launch(WebhookBuild::Debug, kubeconfig, rust_log, extra, None).await
    }

    /// The release `helmop-webhook` on one CPU, requiring the client certificate the harness's API
    /// servers present (`--client-ca`), as the `client-auth` install does: what a tenant meets.
    pub async fn release_one_cpu(
        kubeconfig: &Path,
        extra: &[&str],
    ) -> anyhow::Result<WebhookBinary> {
        let client_ca = crate::certs::webhook_client_pki().ca_pem.clone();
        Self::release_one_cpu_trusting(kubeconfig, extra, &client_ca).await
    }

    /// [`WebhookBinary::release_one_cpu`] trusting the client CAs of `client_ca_pem` instead (its file
    /// is [`WebhookBinary::client_ca_file`]).
    pub async fn release_one_cpu_trusting(
        kubeconfig: &Path,
        extra: &[&str],
        client_ca_pem: &str,
    ) -> anyhow::Result<WebhookBinary> {
        Self::launch(
            WebhookBuild::ReleaseOneCpu,
            kubeconfig,
            "info",
            extra,
            Some(client_ca_pem),
        )
        .await
    }

    async fn launch(
        build: WebhookBuild,
        kubeconfig: &Path,
        rust_log: &str,
        extra: &[&str],
        client_ca: Option<&str>,
    ) -> anyhow::Result<WebhookBinary> {
        let certs = test_certs();
        let dir = tempfile::tempdir()?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &certs.cert_pem)?;
        std::fs::write(&key, &certs.key_pem)?;
        let log = dir.path().join("webhook.log");
        let (port, admin_port) = (free_port()?, free_port()?);
        let binary = build.binary()?;
        let mut command = match build {
            WebhookBuild::Debug => tokio::process::Command::new(&binary),
            // taskset sets the affinity before it execs the webhook, so every thread the webhook
            // starts inherits it; the process keeps taskset's pid.
            WebhookBuild::ReleaseOneCpu => {
                let mut c = tokio::process::Command::new("taskset");
                c.arg("-c")
                    .arg(first_allowed_cpu()?.to_string())
                    .arg(&binary);
                c
            }
        };
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key);
        let client_ca = match client_ca {
            Some(ca) => {
                let path = dir.path().join("client-ca.crt");
                std::fs::write(&path, ca)?;
                command.arg("--client-ca").arg(&path);
                Some(path)
            }
            None => None,
        };
        let child = command
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("stdout.log"))?)
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(certs.ca_pem.as_bytes())?)
            .timeout(Duration::from_secs(20))
            .build()?;
        let mut webhook = WebhookBinary {
            child,
            url: format!("https://127.0.0.1:{port}"),
            admin_url: format!("http://127.0.0.1:{admin_port}"),
            ca_pem: certs.ca_pem.clone(),
            log,
            client_ca,
            http,
            _dir: dir,
        };
        let ready = wait_until("helmop-webhook to be ready", DEFAULT_TIMEOUT, || async {
            Ok(webhook.readyz().await? == 200)
        })
        .await;
        if let Err(e) = ready {
            let exited = webhook.child.try_wait()?;
            bail!("{e:#} (exited: {exited:?}); logs:\n{}", webhook.logs());
        }
        Ok(webhook)
    }

    /// Status of `GET /readyz` on the admin port.
    pub async fn readyz(&self) -> anyhow::Result<u16> {
        let response = self
            .http
            .get(format!("{}/readyz", self.admin_url))
            .send()
            .await?;
        Ok(response.status().as_u16())
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self
            .http
            .get(format!("{}/metrics", self.admin_url))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// The value of one series of `/metrics`, e.g. `helmop_webhook_cache_objects{cache="secrets"}`; 0 for
    /// a series the text does not hold: the webhook's metrics library leaves out a family with no series
    /// yet (no request of that kind answered, no read of that kind sent) and a resolver that is off
    /// registers none. So a test asserting a 0 also asserts the same series positive somewhere, which
    /// proves the name.
    pub async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let text = self.metrics().await?;
        metric_value(&text, series)
    }

    /// `helmop_webhook_cache_objects{cache="..."}`.
    pub async fn cache_objects(&self, cache: &str) -> anyhow::Result<i64> {
        let value = self
            .metric(&format!(
                "helmop_webhook_cache_objects{{cache=\"{cache}\"}}"
            ))
            .await?;
        Ok(value as i64)
    }

    /// POSTs an AdmissionReview over TLS: the HTTP status and the JSON body (or the text as a JSON string).
    pub async fn post(&self, path: &str, review: &Value) -> anyhow::Result<(u16, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(review.to_string())
            .send()
            .await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, body))
    }

    /// Whether the process is still running (a crash or an OOM kill ends it).
    pub fn running(&mut self) -> anyhow::Result<bool> {
        Ok(self.child.try_wait()?.is_none())
    }

    /// The `--client-ca` file the webhook reads (and reloads when it changes), if it was given one.
    pub fn client_ca_file(&self) -> Option<&Path> {
        self.client_ca.as_deref()
    }

    /// Everything the webhook logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The value of `series` in the Prometheus text `text` (e.g. `/metrics` of a webhook), 0 when the text
/// does not hold it (see [`WebhookBinary::metric`]).
pub fn metric_value(text: &str, series: &str) -> anyhow::Result<f64> {
    let prefix = format!("{series} ");
    match text.lines().find_map(|l| l.strip_prefix(&prefix)) {
        Some(value) => value
            .trim()
            .parse()
            .with_context(|| format!("{series} is {value:?}")),
        None => Ok(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::metric_value;

    const TEXT: &str = "# TYPE helmop_webhook_live_gets counter\n\
                        helmop_webhook_live_gets_total{kind=\"secrets\"} 3\n\
                        # TYPE helmop_webhook_cache_bytes gauge\n\
                        helmop_webhook_cache_bytes{cache=\"digests\"} 4096\n";

    #[test]
    fn reads_a_series_and_zero_for_one_not_reported() {
        assert_eq!(
            metric_value(TEXT, "helmop_webhook_live_gets_total{kind=\"secrets\"}").unwrap(),
            3.0
        );
        assert_eq!(
            metric_value(TEXT, "helmop_webhook_cache_bytes{cache=\"digests\"}").unwrap(),
            4096.0
        );
        assert_eq!(
            metric_value(TEXT, "helmop_webhook_live_gets_total{kind=\"configmaps\"}").unwrap(),
            0.0
        );
        assert!(metric_value("x_total{} many\n", "x_total{}").is_err());
    }
}

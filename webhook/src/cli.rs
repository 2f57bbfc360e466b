//! The command line. The first seven flags (listen address, TLS files, guard and image modes, hash
//! key Secret, mutable tags) are the documented contract; the rest tune limits and timeouts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::config::{Config, GuardMode, ImageMode, SecretRef};

/// Admission webhook for Fleet HelmOps: rejects invalid HelmOps, guards referenced Secrets and ConfigMaps,
/// stamps content hashes and image digests into opted-in workloads.
///
/// Cluster access is found the way kubectl finds it: the in-cluster service account, else KUBECONFIG.
/// Log verbosity follows RUST_LOG (default `info`).
#[derive(Debug, Clone, Parser)]
#[command(name = "helmop-webhook", version)]
pub struct Cli {
    /// Address of the HTTPS admission endpoint.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,

    /// PEM certificate chain served on --listen; re-read when it changes on disk.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) for --tls-cert; re-read when it changes on disk.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,

    /// Address of the plain-HTTP admin endpoint: /healthz, /readyz, /metrics.
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: SocketAddr,

    /// What to do when a Secret or ConfigMap that a HelmOp lists is deleted.
    #[arg(long, value_enum, default_value_t = GuardMode::Enforce)]
    pub guard: GuardMode,

    /// How mutable image tags are handled in opted-in workloads: pin rewrites repo:tag to
    /// repo:tag@sha256:..., annotate records digests in helmop.dev/image-digests, off leaves images
    /// alone. A ceiling: the namespace's and workload's helmop.dev/image-mode may only lower it.
    #[arg(long, default_value_t = ImageMode::Pin, value_parser = image_mode_parser())]
    pub image_mode: ImageMode,

    /// Secret holding the hash key (data key `key`).
    #[arg(long, value_name = "NS/NAME", default_value = "helmop-system/helmop-hash-key", value_parser = clap::value_parser!(SecretRef))]
    pub hash_key_secret: SecretRef,

    /// Extra image tags treated as mutable besides `latest` and no tag (comma separated or repeated;
    /// interpreted by the image resolver).
    #[arg(long, value_name = "PATTERN", value_delimiter = ',')]
    pub mutable_tags: Vec<String>,

    /// Time budget for resolving image digests in one admission, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub image_budget_ms: u64,

    /// Registry configuration (mirrors, insecure registries) for the image resolver.
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,

    /// Address ranges the image resolver never connects to for a registry the registry config does not
    /// list, added to the config's `deny` (or its default): the cluster's pod and Service CIDRs, IPv4 and
    /// IPv6 (comma separated or repeated).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub registry_deny: Vec<helmop_images::policy::Cidr>,

    /// Bound of the content-digest cache, in entries.
    #[arg(long, value_name = "N", default_value_t = crate::state::DEFAULT_DIGEST_CACHE_ENTRIES)]
    pub digest_cache_entries: usize,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,

    /// Deadline for answering one admission request, in milliseconds; keep it below the smallest
    /// `timeoutSeconds` of the webhook configurations so the API server gets an answer, not a timeout.
    #[arg(long, value_name = "MS", default_value_t = 4000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// On SIGTERM, keep serving (while /readyz reports not ready) for this many seconds before draining, so
    /// endpoints drop the pod before it stops accepting connections.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub shutdown_delay_seconds: u64,

    /// PEM CA file: when set, only clients presenting a certificate it signed may connect to --listen (the API
    /// server, configured with a client certificate through its admission `kubeConfigFile`). Read at start.
    #[arg(long, value_name = "FILE")]
    pub client_ca: Option<PathBuf>,

    /// Admission requests decided at once; more are answered 429 at once (the API server then applies the
    /// webhook's failurePolicy).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_in_flight: u64,

    /// Bytes held at once across all admission requests: bodies as they arrive, then what each decoded
    /// review costs (its text twice more and 96 bytes per JSON value); a request that does not fit is
    /// answered 429. At least 45 MiB (the largest review: a 7 MiB body of 262,144 values).
    #[arg(long, value_name = "BYTES", default_value_t = crate::server::DEFAULT_MAX_IN_FLIGHT_BYTES as u64, value_parser = clap::value_parser!(u64).range(crate::admission::MAX_REVIEW_COST as u64..=1 << 40))]
    pub max_in_flight_bytes: u64,

    /// Live GETs (an object's version or content, a namespace missing from the cache) sent to the API server
    /// at once; more wait their turn. Concurrent GETs of one object share a single request.
    #[arg(long, value_name = "N", default_value_t = crate::state::DEFAULT_MAX_LIVE_GETS as u64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_live_gets: u64,

    /// How often the certificate and key files are checked for changes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub cert_poll_ms: u64,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// `--image-mode`: the modes `helmop-images` defines, listed by `--help`.
fn image_mode_parser() -> impl clap::builder::TypedValueParser<Value = ImageMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(ImageMode::ALL.map(ImageMode::as_str))
        .try_map(|s| s.parse::<ImageMode>())
}

impl Cli {
    pub fn config(&self) -> Config {
        Config {
            guard: self.guard,
            image_mode: self.image_mode,
            hash_key_secret: self.hash_key_secret.clone(),
            mutable_tags: self.mutable_tags.clone(),
            image_budget: Duration::from_millis(self.image_budget_ms),
            registry_config: self.registry_config.clone(),
            registry_deny: self.registry_deny.clone(),
        }
    }

    pub fn serve_options(&self) -> crate::server::ServeOptions {
        crate::server::ServeOptions {
            listen: self.listen,
            admin_listen: self.admin_listen,
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            cert_poll_interval: Duration::from_millis(self.cert_poll_ms),
            shutdown_delay: Duration::from_secs(self.shutdown_delay_seconds),
            client_ca: self.client_ca.clone(),
            limits: crate::server::Limits {
                max_in_flight: usize::try_from(self.max_in_flight).unwrap_or(usize::MAX),
                max_body_bytes_in_flight: usize::try_from(self.max_in_flight_bytes)
                    .unwrap_or(usize::MAX),
            },
            ..crate::server::ServeOptions::default()
        }
    }
}

/// `helmop-bootstrap`: install-time Jobs shipped in the webhook image (see `manifests/`).
#[derive(Debug, Clone, Parser)]
#[command(name = "helmop-bootstrap", version)]
pub struct BootstrapCli {
    #[command(subcommand)]
    pub command: BootstrapCommand,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BootstrapCommand {
    /// Create the hash-key Secret (32 random bytes under data key `key`) unless it exists; never overwrites.
    HashKey {
        #[arg(long, value_name = "NS/NAME", default_value = "helmop-system/helmop-hash-key", value_parser = clap::value_parser!(SecretRef))]
        secret: SecretRef,
    },
    /// Without cert-manager: keep a CA and a serving certificate for the webhook Service, renew it before
    /// expiry, and write the CA into the webhook configurations' caBundle. Safe to re-run.
    Tls {
        /// Serving certificate Secret (kubernetes.io/tls) mounted by the webhook Deployment.
        #[arg(long, value_name = "NS/NAME", default_value = "helmop-system/helmop-webhook-tls", value_parser = clap::value_parser!(SecretRef))]
        secret: SecretRef,
        /// CA Secret, kept so renewals keep the same caBundle.
        #[arg(long, value_name = "NS/NAME", default_value = "helmop-system/helmop-webhook-ca", value_parser = clap::value_parser!(SecretRef))]
        ca_secret: SecretRef,
        /// Client certificate Secret for the API server's admission kubeConfigFile (same CA, which the
        /// webhook trusts with `--client-ca /tls/ca.crt`).
        #[arg(long, value_name = "NS/NAME", default_value = "helmop-system/helmop-apiserver-client", value_parser = clap::value_parser!(SecretRef))]
        client_secret: SecretRef,
        /// The webhook Service, in the namespace of --secret.
        #[arg(long, default_value = "helmop-webhook")]
        service: String,
        /// Name of the Validating- and MutatingWebhookConfiguration.
        #[arg(long, default_value = "helmop-webhook")]
        webhook_configuration: String,
        #[arg(long, value_name = "DAYS", default_value_t = 365, value_parser = clap::value_parser!(u32).range(2..=3650))]
        validity_days: u32,
        /// Renew when fewer days than this remain.
        #[arg(long, value_name = "DAYS", default_value_t = 30)]
        renew_before_days: u32,
        /// As an initContainer: the serving certificate file as this pod mounted it (the --secret volume). The
        /// kubelet mounted the volume before this ran, so when the Secret did not exist yet the file is missing;
        /// then exit non-zero after writing the Secret, and the kubelet remounts the volume before the retry.
        #[arg(long, value_name = "PATH")]
        mounted_cert: Option<std::path::PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUIRED: [&str; 9] = [
        "helmop-webhook",
        "--listen",
        "127.0.0.1:8443",
        "--tls-cert",
        "/c.pem",
        "--tls-key",
        "/k.pem",
        "--admin-listen",
        "127.0.0.1:8080",
    ];

    #[test]
    fn contract_flags_and_defaults() {
        let cli = Cli::try_parse_from(REQUIRED).unwrap();
        assert_eq!(cli.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(cli.admin_listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(cli.config(), Config::default());
        assert_eq!(
            cli.digest_cache_entries,
            crate::state::DEFAULT_DIGEST_CACHE_ENTRIES
        );
        assert_eq!(cli.max_live_gets, 32);
        assert_eq!(cli.log_format, LogFormat::Json);
    }

    #[test]
    fn modes_and_secret_ref() {
        let mut args = REQUIRED.to_vec();
        args.extend([
            "--guard",
            "warn",
            "--image-mode",
            "annotate",
            "--hash-key-secret",
            "ops/key",
            "--mutable-tags",
            "main,dev-*",
        ]);
        let config = Cli::try_parse_from(args).unwrap().config();
        assert_eq!(config.guard, GuardMode::Warn);
        assert_eq!(config.image_mode, ImageMode::Annotate);
        assert_eq!(
            config.hash_key_secret,
            SecretRef {
                namespace: "ops".into(),
                name: "key".into()
            }
        );
        assert_eq!(config.mutable_tags, ["main", "dev-*"]);
    }

    #[test]
    fn registry_deny_ranges() {
        let mut args = REQUIRED.to_vec();
        args.extend([
            "--registry-deny",
            "10.244.0.0/16,fd00:10:244::/56",
            "--registry-deny",
            "2001:db8:96::/112",
        ]);
        let config = Cli::try_parse_from(args).unwrap().config();
        let shown: Vec<String> = config
            .registry_deny
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            ["10.244.0.0/16", "fd00:10:244::/56", "2001:db8:96::/112"]
        );
        for bad in ["10.0.0.0/33", "pods"] {
            let mut args = REQUIRED.to_vec();
            args.extend(["--registry-deny", bad]);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_secret_ref_without_a_namespace_is_refused_with_the_value() {
        let mut args = REQUIRED.to_vec();
        args.extend(["--hash-key-secret", "key"]);
        let err = Cli::try_parse_from(args).unwrap_err().to_string();
        assert!(
            err.contains(r#"expected NAMESPACE/NAME, got "key""#),
            "{err}"
        );
    }

    #[test]
    fn client_ca_and_limits_reach_the_serve_options() {
        let cli = Cli::try_parse_from(REQUIRED).unwrap();
        let defaults = cli.serve_options();
        assert_eq!(
            defaults.client_ca, None,
            "client certificates stay optional"
        );
        assert_eq!(defaults.limits, crate::server::Limits::default());
        let mut args = REQUIRED.to_vec();
        args.extend([
            "--client-ca",
            "/tls/ca.crt",
            "--max-in-flight",
            "8",
            "--max-in-flight-bytes",
            "67108864",
        ]);
        let options = Cli::try_parse_from(args).unwrap().serve_options();
        assert_eq!(options.client_ca, Some(PathBuf::from("/tls/ca.crt")));
        assert_eq!(options.limits.max_in_flight, 8);
        assert_eq!(options.limits.max_body_bytes_in_flight, 64 << 20);
        for bad in [
            ["--max-in-flight", "0"],
            ["--max-live-gets", "0"],
            // Below the largest review's cost: such a review could never be decided.
            ["--max-in-flight-bytes", "33554432"],
        ] {
            let mut args = REQUIRED.to_vec();
            args.extend(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            ["--guard", "off"],
            ["--image-mode", "digest"],
            ["--hash-key-secret", "no-namespace"],
            ["--hash-key-secret", "a/b/c"],
        ] {
            let mut args = REQUIRED.to_vec();
            args.extend(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} accepted");
        }
        assert!(
            Cli::try_parse_from(&REQUIRED[..7]).is_err(),
            "--admin-listen is required"
        );
    }

    #[test]
    fn bootstrap_subcommands() {
        let cli = BootstrapCli::try_parse_from(["helmop-bootstrap", "hash-key"]).unwrap();
        assert!(
            matches!(cli.command, BootstrapCommand::HashKey { secret } if secret.to_string() == "helmop-system/helmop-hash-key")
        );
        let cli = BootstrapCli::try_parse_from([
            "helmop-bootstrap",
            "tls",
            "--service",
            "wh",
            "--validity-days",
            "90",
        ])
        .unwrap();
        assert!(
            matches!(cli.command, BootstrapCommand::Tls { service, validity_days: 90, .. } if service == "wh")
        );
        let cli = BootstrapCli::try_parse_from([
            "helmop-bootstrap",
            "tls",
            "--mounted-cert",
            "/tls/tls.crt",
        ])
        .unwrap();
        assert!(
            matches!(cli.command, BootstrapCommand::Tls { mounted_cert: Some(p), .. } if p == std::path::Path::new("/tls/tls.crt"))
        );
        assert!(BootstrapCli::try_parse_from(["helmop-bootstrap"]).is_err());
        assert!(
            BootstrapCli::try_parse_from(["helmop-bootstrap", "tls", "--validity-days", "1"])
                .is_err()
        );
    }
}

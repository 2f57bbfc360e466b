use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use helmop_webhook::app;
use helmop_webhook::bootstrap::{self, TlsTarget};
use helmop_webhook::cli::{BootstrapCli, BootstrapCommand};

async fn run(cli: BootstrapCli) -> helmop_webhook::Result<()> {
    let client = kube::Client::try_default().await?;
    match cli.command {
        BootstrapCommand::HashKey { secret } => {
            let outcome = bootstrap::ensure_hash_key(client, &secret).await?;
            tracing::info!(secret = %secret, outcome = ?outcome, "hash key");
        }
        BootstrapCommand::Tls {
            secret,
            ca_secret,
            client_secret,
            service,
            webhook_configuration,
            validity_days,
            renew_before_days,
            mounted_cert,
        } => {
            let target = TlsTarget {
                secret,
                ca_secret,
                client_secret,
                service,
                webhook_configuration,
                validity_days,
                renew_before: Duration::from_secs(u64::from(renew_before_days) * 86_400),
            };
            let outcome = bootstrap::bootstrap_tls(client, &target).await?;
            tracing::info!(
                ca_created = outcome.ca_created,
                issued = outcome.issued.unwrap_or("kept"),
                client_issued = outcome.client_issued.unwrap_or("kept"),
                validating_patched = outcome.validating_patched,
                mutating_patched = outcome.mutating_patched,
                "webhook tls"
            );
            if let Some(path) = mounted_cert {
                bootstrap::require_mounted(&path)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = BootstrapCli::parse();
    app::init_tracing(cli.log_format);
    app::install_panic_hook();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "helmop-bootstrap failed");
            ExitCode::FAILURE
        }
    }
}

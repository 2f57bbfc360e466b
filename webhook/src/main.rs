use clap::Parser;
use helmop_webhook::{app, cli::Cli};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    app::init_tracing(cli.log_format);
    app::install_panic_hook();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(app::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "helmop-webhook stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

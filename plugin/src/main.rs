//! `kubectl-helmop`: the kubectl plugin (`kubectl helmop ...`). This file only wires the
//! command line to the commands (library `kubectl_helmop`, src/lib.rs) and turns their outcome
//! into an exit code.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use kubectl_helmop::cli::{Cli, Command, argv, cmd};
use kubectl_helmop::error::{self, ExitStatus};
use kubectl_helmop::run::propagate;

fn main() -> ExitCode {
    // kubectl_complete-helmop's protocol; not a clap subcommand, so it never shows in help.
    let mut raw = std::env::args_os().skip(1);
    if raw
        .next()
        .is_some_and(|a| a == cmd::completion::COMPLETE_ARG)
    {
        let words = raw.map(|w| w.to_string_lossy().into_owned()).collect();
        return cmd::completion::run_complete(Cli::command(), words).into();
    }
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_else(|| "kubectl-helmop".into());
    let args = argv::hoist_connection_flags(args.collect());
    let cli = match Cli::try_parse_from(std::iter::once(program).chain(args)) {
        Ok(cli) => cli,
        Err(e) => {
            // clap's own exit code for usage errors is 2, which helmop's exit codes reserve for
            // partial failure; a bad command line is invalid input (1). Help and --version stay 0.
            let _ = e.print();
            return if e.use_stderr() {
                ExitStatus::Invalid.into()
            } else {
                ExitStatus::Ok.into()
            };
        }
    };
    init_tracing();
    let status = match cli.command {
        Command::Validate(args) => cmd::validate::run(&args),
        // A one-shot run ends on SIGTERM/SIGINT only after finishing the recreates it started;
        // `--watch` handles those signals itself.
        Command::Propagate(args) if !args.watch.watch => {
            match block_on(until_signalled(cmd::propagate::run(&args))) {
                Ok(Err(signal_exit)) => return ExitCode::from(signal_exit),
                Ok(Ok(status)) => Ok(status),
                Err(e) => Err(e),
            }
        }
        Command::Propagate(args) => block_on(cmd::propagate::run(&args)),
        Command::Status(args) => block_on(cmd::status::run(&args)),
        Command::Prune(args) => block_on(cmd::prune::run(&args)),
        Command::Rollout(args) => block_on(cmd::rollout::run(&args)),
        Command::Images(args) => block_on(cmd::images::run(&args)),
        Command::Check(args) => block_on(cmd::check::run(&args)),
        Command::Completion(args) => cmd::completion::run(&args, Cli::command()),
    };
    match status {
        Ok(status) => status.into(),
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_status().into()
        }
    }
}

/// Logs go to stderr (stdout carries the command's output), filtered by `HELMOP_LOG`.
fn init_tracing() {
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("HELMOP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    for directive in helmop_core::text::LOG_DIRECTIVES {
        if let Ok(d) = directive.parse() {
            filter = filter.add_directive(d);
        }
    }
    // Colour only on a terminal, as for the command's own output: a log file or a pod's log
    // gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `command`'s result, or the exit code of the SIGTERM (143) or SIGINT (130) that stopped it
/// first (the command is dropped there; what it started in tasks of its own, [`block_on`] waits
/// for).
async fn until_signalled<T>(
    command: impl std::future::Future<Output = Result<T, error::PluginError>>,
) -> Result<Result<T, u8>, error::PluginError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return command.await.map(Ok);
    };
    tokio::select! {
        result = command => result.map(Ok),
        _ = term.recv() => Ok(Err(143)),
        _ = int.recv() => Ok(Err(130)),
    }
}

/// Runs an async command on one thread. The cluster commands talk to many clusters at once, but
/// that is waiting, not computing: with a second worker thread a watcher spent a tenth of its CPU
/// in the kernel handing tasks and wakeups between threads (and more in glibc's allocator freeing
/// across arenas), and its edit over 1,000 clusters took 1.2 x as long (docs/performance.md, "One
/// thread"; docs/decisions.md).
fn block_on<T>(
    command: impl std::future::Future<Output = Result<T, error::PluginError>>,
) -> Result<T, error::PluginError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| error::PluginError::Usage(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        let status = command.await;
        // A copy deleted to be recreated is created before the process ends, however it ends.
        let left = propagate::drain_recreates(propagate::RECREATE_DRAIN).await;
        if left > 0 {
            tracing::error!(
                left,
                "copies deleted to be recreated may be missing: the next run creates them"
            );
        }
        status
    })
}

//! `kubectl_complete-helmop`: what kubectl (>= 1.26) runs to complete `kubectl helmop ...`. It is
//! called with the plugin's words (the last one being completed, possibly empty) and must print
//! candidates in Cobra's `__complete` format. The logic lives in `kubectl-helmop __complete`, which
//! this forwards to: first the `kubectl-helmop` next to this executable, else the one on PATH.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

const PLUGIN: &str = "kubectl-helmop";

fn main() -> ExitCode {
    let Some(plugin) = find_plugin() else {
        // Cobra's "error" directive: the shell completes nothing and says nothing.
        println!(":1");
        return ExitCode::SUCCESS;
    };
    let mut cmd = Command::new(plugin);
    cmd.arg("__complete").args(std::env::args_os().skip(1));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Only returns on failure.
        let _ = cmd.exec();
        println!(":1");
        ExitCode::SUCCESS
    }
    #[cfg(not(unix))]
    match cmd.status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        _ => {
            println!(":1");
            ExitCode::SUCCESS
        }
    }
}

fn find_plugin() -> Option<PathBuf> {
    let exe_name = format!("{PLUGIN}{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.canonicalize().ok().or(Some(exe)))
        .and_then(|exe| exe.parent().map(|dir| dir.join(&exe_name)))
        .filter(|p| p.is_file());
    beside.or_else(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(&exe_name))
            .find(|p| p.is_file())
    })
}

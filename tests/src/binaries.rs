//! Running the workspace's real binaries (`kubectl-helmop`, `kubectl_complete-helmop`) as the
//! tests' subjects: one-shot runs, and long-running processes (`propagate --watch`) whose stdout
//! events (JSON Lines) a test can wait for.
//!
//! The binaries are not built by `cargo test -p helmop-tests` (a test crate cannot depend on
//! another crate's binaries): `cargo build --bins` first (`./dev test` does).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::wait::wait_for;

/// `target/<profile>/` of the workspace: where this test binary's `deps/` directory lives.
pub(crate) fn target_profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the test executable")?;
    // target/debug/deps/e2e-<hash> -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("the test executable is not inside a cargo target directory")
}

/// Path of a workspace binary; an error says how to build it when it is missing.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = target_profile_dir()?.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.is_file() {
        bail!(
            "{} is missing: build the binaries first with `cargo build --workspace --bins --features kubectl-helmop/test-hooks` (./dev test does)",
            path.display()
        );
    }
    Ok(path)
}

/// `target/debug/kubectl-helmop`.
pub fn plugin_binary() -> anyhow::Result<PathBuf> {
    workspace_binary("kubectl-helmop")
}

/// Runs `kubectl-helmop ARGS` to completion (at most `timeout`), with `NO_COLOR` set and these
/// extra environment variables.
pub async fn run_plugin(
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> anyhow::Result<Output> {
    let mut cmd = tokio::process::Command::new(plugin_binary()?);
    cmd.args(args)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().context("running kubectl-helmop")?;
    tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .with_context(|| format!("kubectl-helmop {args:?} did not finish within {timeout:?}"))?
        .context("waiting for kubectl-helmop")
}

/// A running `kubectl-helmop` whose stdout lines are collected (JSON lines parsed) and whose
/// stderr is kept for failure messages. Killed when dropped.
pub struct PluginProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

/// Whether `event` (a line of `propagate --watch -o json`) is a run one of whose reasons
/// contains `reason`.
pub fn is_run_for(event: &Value, reason: &str) -> bool {
    event["event"] == "run"
        && event["reasons"].as_array().is_some_and(|r| {
            r.iter()
                .any(|x| x.as_str().is_some_and(|s| s.contains(reason)))
        })
}

impl PluginProcess {
    /// Starts `kubectl-helmop ARGS` with these extra environment variables.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<PluginProcess> {
        Self::spawn_binary(&plugin_binary()?, args, env)
    }

    /// [`PluginProcess::spawn`] of a given `kubectl-helmop` (e.g. a release build the benchmarks drive).
    pub fn spawn_binary(
        binary: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<PluginProcess> {
        let mut child = Command::new(binary)
            .args(args)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(out) = child.stdout.take() {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut l) = lines.lock() {
                        l.push(line);
                    }
                }
            });
        }
        if let Some(mut err) = child.stderr.take() {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut s) = stderr.lock() {
                        s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        Ok(PluginProcess {
            child,
            lines,
            stderr,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every stdout line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Every stdout line so far that is a JSON object.
    pub fn events(&self) -> Vec<Value> {
        self.lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(Value::is_object)
            .collect()
    }

    /// Events whose `event` field is `name`.
    pub fn events_named(&self, name: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits for the first event (in order) matching `pred` that comes after the first `skip`
    /// events; fails early when the process exits.
    pub async fn wait_event(
        &mut self,
        what: &str,
        timeout: Duration,
        skip: usize,
        pred: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let result = wait_for(what, timeout, || {
            let found = self.events().into_iter().skip(skip).find(|e| pred(e));
            let exited = self.child.try_wait().ok().flatten();
            async move {
                match (found, exited) {
                    (Some(e), _) => Ok(Some(e)),
                    (None, Some(status)) => bail!("kubectl-helmop exited ({status})"),
                    (None, None) => Ok(None),
                }
            }
        })
        .await;
        result.with_context(|| self.context())
    }

    /// Sends a signal (e.g. `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        let pid = i32::try_from(self.child.id()).context("pid out of range")?;
        // SAFETY: kill(2) with the pid of our own, not yet reaped, child.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            bail!(
                "kill({pid}, {signal}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let result = wait_for("kubectl-helmop to exit", timeout, || {
            let status = self.child.try_wait();
            async move { Ok(status?) }
        })
        .await;
        result.with_context(|| self.context())
    }

    /// Output so far, for failure messages.
    pub fn context(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.lines().join("\n"),
            self.stderr()
        )
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

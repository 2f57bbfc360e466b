//! The README demo script (`tests/demo.sh`, run by `./dev demo`) without running the demo: it
//! parses, passes shellcheck where installed, and its `--down` mode (what `./dev down` runs)
//! stops exactly the webhook processes it recorded. The demo itself (a real node, images, a few
//! minutes, root) is run by hand (`./dev demo`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn demo_script() -> PathBuf {
    repo().join("tests/demo.sh")
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scripts_parse_and_pass_shellcheck() {
    for script in [demo_script(), repo().join("dev")] {
        let out = output(Command::new("bash").arg("-n").arg(&script));
        assert_success(&out, &format!("bash -n {}", script.display()));
    }
    match Command::new("shellcheck")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
    {
        Ok(true) => {
            let out = output(
                Command::new("shellcheck")
                    .arg(demo_script())
                    .arg(repo().join("dev")),
            );
            assert_success(&out, "shellcheck tests/demo.sh dev");
        }
        _ => eprintln!("shellcheck is not installed: only `bash -n` was checked"),
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [&[][..], &["-x"][..], &["--down"][..], &["a", "b"][..]] {
        let out = output(Command::new(demo_script()).args(args));
        assert_eq!(out.status.code(), Some(2), "demo.sh {args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("tests/demo.sh DIR"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A stand-in for a webhook: `sleep` leading its own process group, as demo.sh starts them.
fn spawn_group_leader() -> Child {
    Command::new("setsid")
        .args(["sleep", "600"])
        .spawn()
        .expect("setsid sleep")
}

/// Field 22 of /proc/PID/stat (start time), as demo.sh records it.
fn start_time(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(") ").unwrap() + 2..];
    after_comm.split_whitespace().nth(19).unwrap().to_string()
}

fn exited_within(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn down_stops_recorded_webhooks_only() {
    let dir = tempfile::tempdir().unwrap();
    let webhooks = dir.path().join("webhooks");
    std::fs::create_dir(&webhooks).unwrap();
    let mut ours = spawn_group_leader();
    // Same pid file format, but a start time that is not the process's: a recycled pid.
    let mut stranger = spawn_group_leader();
    std::fs::write(
        webhooks.join("upstream.pid"),
        format!("{} {}\n", ours.id(), start_time(ours.id())),
    )
    .unwrap();
    std::fs::write(webhooks.join("down1.pid"), format!("{} 1\n", stranger.id())).unwrap();

    // `./dev down` with the demo directory pointing here: no control plane, two pid files. Its own
    // cache, so that the registry a real demo started (pid in the cache) is not stopped.
    let out = output(
        Command::new(repo().join("dev"))
            .arg("down")
            .env("HELMOP_DEMO_DIR", dir.path())
            .env("HELMOP_CACHE", dir.path().join("cache")),
    );
    assert_success(&out, "./dev down");
    assert!(
        exited_within(&mut ours, Duration::from_secs(15)),
        "the recorded webhook is still running"
    );
    assert!(
        !exited_within(&mut stranger, Duration::from_millis(300)),
        "a process whose start time differs was stopped"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("stopped webhook upstream"));
    assert!(!webhooks.join("upstream.pid").exists());
    assert!(!webhooks.join("down1.pid").exists());
    let _ = stranger.kill();
    let _ = stranger.wait();

    // Nothing to stop is fine too.
    let out = output(Command::new(demo_script()).args([
        "--down".as_ref(),
        dir.path().join("never-created").as_os_str(),
    ]));
    assert_success(&out, "demo.sh --down on a missing directory");
}

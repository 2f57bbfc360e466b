//! Writing command output: stdout only carries results (logs go to stderr), and a reader that
//! goes away early (`| head`) is not an error. The rows and reports of the cluster-facing commands
//! are in [`report`].

pub mod report;

use std::io::Write;

use serde::Serialize;

use crate::error::PluginError;

/// Writes `text` to stdout; a closed pipe is ignored.
pub fn emit(text: &str) -> Result<(), PluginError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Pretty JSON with a trailing newline.
pub fn json<T: Serialize>(value: &T) -> Result<String, PluginError> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    Ok(s)
}

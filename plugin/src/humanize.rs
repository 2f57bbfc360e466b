//! Durations as flags take them: what error messages and progress lines print.

use std::time::Duration;

/// `1m30s`, `45s`, `500ms`.
pub fn humanize(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    let (m, s) = (secs / 60, secs % 60);
    match (m, s) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(humanize(Duration::from_millis(250)), "250ms");
        assert_eq!(humanize(Duration::from_secs(45)), "45s");
        assert_eq!(humanize(Duration::from_secs(120)), "2m");
        assert_eq!(humanize(Duration::from_secs(90)), "1m30s");
    }
}

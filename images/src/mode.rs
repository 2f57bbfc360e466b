//! How much image work a workload gets, and the one rule that decides it: the webhook's
//! `--image-mode` is a ceiling that the namespace's `helmop.dev/image-mode` annotation may lower, and
//! the workload's may lower further, never raise. The webhook and `kubectl helmop images` both ask
//! [`effective_mode`], so a namespace set to `off` is off for both whatever its workloads say.

use std::fmt;
use std::str::FromStr;

/// What happens to mutable image tags. Ordered by how much is done: `Off` < `Annotate` < `Pin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ImageMode {
    /// Leave images alone: nothing reaches a registry.
    Off,
    /// Record digests in the `helmop.dev/image-digests` pod-template annotation.
    Annotate,
    /// Rewrite `repo:tag` to `repo:tag@sha256:...`.
    Pin,
}

impl ImageMode {
    /// Every mode, in the order the command line lists them.
    pub const ALL: [ImageMode; 3] = [ImageMode::Pin, ImageMode::Annotate, ImageMode::Off];

    pub fn as_str(self) -> &'static str {
        match self {
            ImageMode::Pin => "pin",
            ImageMode::Annotate => "annotate",
            ImageMode::Off => "off",
        }
    }

    /// An annotation value as users write it (surrounding blanks ignored, case kept: `Pin` is not a
    /// mode, as Kubernetes' own enums are case-sensitive).
    pub fn parse(value: &str) -> Option<ImageMode> {
        let value = value.trim();
        ImageMode::ALL.into_iter().find(|m| m.as_str() == value)
    }
}

impl fmt::Display for ImageMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that names no mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown image mode {0:?}: expected pin, annotate or off")]
pub struct UnknownMode(pub String);

impl FromStr for ImageMode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ImageMode::parse(s).ok_or_else(|| UnknownMode(s.chars().take(64).collect()))
    }
}

/// The mode for one workload: `process` lowered by the namespace's annotation, then by the
/// workload's (an absent or unreadable annotation lowers nothing).
pub fn effective_mode(
    process: ImageMode,
    namespace: Option<ImageMode>,
    workload: Option<ImageMode>,
) -> ImageMode {
    [namespace, workload]
        .into_iter()
        .flatten()
        .fold(process, std::cmp::min)
}

#[cfg(test)]
mod tests {
    use super::ImageMode::{Annotate, Off, Pin};
    use super::*;

    #[test]
    fn parses_what_users_write() {
        assert_eq!(ImageMode::parse(" pin"), Some(Pin));
        assert_eq!(ImageMode::parse("annotate"), Some(Annotate));
        assert_eq!(ImageMode::parse("off\n"), Some(Off));
        assert_eq!(ImageMode::parse("Pin"), None);
        assert_eq!(ImageMode::parse(""), None);
        for mode in ImageMode::ALL {
            assert_eq!(mode.to_string().parse::<ImageMode>(), Ok(mode));
        }
        let err = "x".repeat(1000).parse::<ImageMode>().unwrap_err();
        assert_eq!(err.0.len(), 64);
        assert!(err.to_string().contains("expected pin, annotate or off"));
    }

    #[test]
    fn annotations_only_lower_the_process_mode() {
        // The namespace's, then the workload's, may lower; nothing raises.
        assert_eq!(effective_mode(Off, Some(Pin), Some(Pin)), Off);
        assert_eq!(effective_mode(Off, None, Some(Annotate)), Off);
        assert_eq!(effective_mode(Annotate, None, Some(Pin)), Annotate);
        assert_eq!(effective_mode(Pin, None, Some(Annotate)), Annotate);
        assert_eq!(effective_mode(Pin, Some(Off), Some(Pin)), Off);
        assert_eq!(effective_mode(Pin, Some(Annotate), Some(Pin)), Annotate);
        assert_eq!(effective_mode(Pin, Some(Annotate), Some(Off)), Off);
        assert_eq!(effective_mode(Pin, None, None), Pin);
        for process in ImageMode::ALL {
            for ns in [None, Some(Off), Some(Annotate), Some(Pin)] {
                for w in [None, Some(Off), Some(Annotate), Some(Pin)] {
                    let m = effective_mode(process, ns, w);
                    assert!(m <= process);
                    assert!(ns.is_none_or(|n| m <= n));
                    assert!(w.is_none_or(|w| m <= w));
                    // The lowest of what was asked is what is done.
                    let lowest = [Some(process), ns, w].into_iter().flatten().min();
                    assert_eq!(Some(m), lowest);
                }
            }
        }
    }
}

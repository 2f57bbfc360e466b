//! Fleet's `rolloutStrategy`, as far as it decides which matched clusters ever get a
//! BundleDeployment and when the whole Bundle fails (rancher/fleet v0.16.1
//! `internal/cmd/controller/reconciler/bundle_status.go` `resetStatus`,
//! `target/partition.go` `UpdatePartitions`, `target/rollout.go`, `target/status.go` `limit`):
//!
//! - With `partitions`, BundleDeployments are made only inside the loop over partitions: a
//!   matched cluster that no partition holds never gets one. A partition's criteria are the
//!   targets' (`matcher.NewClusterMatcher`): ANDed, and none at all matches nothing.
//! - Every value is read only when there is something to apply it to, and one Fleet cannot read
//!   fails the reconcile before any BundleDeployment is made or updated, on every cluster:
//!   `maxUnavailable` when any cluster matched, a partition's `maxUnavailable` (else the root's)
//!   when that partition holds a cluster, `maxUnavailablePartitions` when there is a partition,
//!   `autoPartitionSize` when automatic partitions apply (no `partitions`, at least
//!   `autoPartitionThreshold` (200) clusters, and the size not an integer of 0 or less); a
//!   partition selector Fleet cannot compile fails it as soon as any cluster matched.
//! - An int-or-string is readable when it is an integer, or a string whose integer value is
//!   positive, or a string ending in `%` whose rest Go's `strconv.ParseFloat` reads (`"25 %"`
//!   is not).
//!
//! Not modelled: how many BundleDeployments a reconcile creates (`maxNew`) and the staging of
//! later partitions until earlier ones are ready; both delay a cluster, never exclude one.

use serde_json::Value;

use super::{ClusterView, Criteria, TargetingError, group_views, labels_of};
use crate::model::{Cluster, ClusterGroup, RolloutStrategy};

/// Fleet's `defAutoPartitionThreshold`.
const AUTO_PARTITION_THRESHOLD: i64 = 200;

/// Why Fleet's Bundle controller fails the whole Bundle, worded as it words it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    #[error("failed to reset bundle status from targets: {0}")]
    MaxUnavailable(String),
    #[error("failed to update partitions: {0}")]
    Partitions(String),
    #[error("failed to update partitions: {0}")]
    Selector(TargetingError),
}

/// Which of the `matched` clusters (those a target selects for deployment) get a
/// BundleDeployment: `true` at the index of each, or the error that fails the whole Bundle.
pub fn deployable(
    strategy: Option<&RolloutStrategy>,
    matched: &[&Cluster],
    groups: &[ClusterGroup],
) -> Result<Vec<bool>, RolloutError> {
    let everyone = vec![true; matched.len()];
    // Fleet reads the strategy from the first target, so with none it reads nothing.
    let (Some(rollout), false) = (strategy, matched.is_empty()) else {
        return Ok(everyone);
    };
    check_limit(matched.len(), &[rollout.max_unavailable.as_ref()])
        .map_err(RolloutError::MaxUnavailable)?;
    let partitions = rollout.partitions.as_deref().unwrap_or_default();
    if partitions.is_empty() {
        let auto_disabled = rollout
            .auto_partition_size
            .as_ref()
            .and_then(Value::as_i64)
            .is_some_and(|size| size <= 0);
        let threshold = rollout
            .auto_partition_threshold
            .unwrap_or(AUTO_PARTITION_THRESHOLD);
        let automatic = !auto_disabled && threshold > 0 && matched.len() as i64 >= threshold;
        if automatic {
            check_limit(matched.len(), &[rollout.auto_partition_size.as_ref()])
                .map_err(RolloutError::Partitions)?;
        }
        // One partition "All", or automatic ones of consecutive clusters: each holds some.
        check_limit(1, &[rollout.max_unavailable_partitions.as_ref()])
            .map_err(RolloutError::Partitions)?;
        return Ok(everyone);
    }
    let mut in_some = vec![false; matched.len()];
    for (i, partition) in partitions.iter().enumerate() {
        let path = format!("spec.rolloutStrategy.partitions[{i}]");
        let criteria = Criteria::compile(
            path,
            partition.cluster_name.as_deref(),
            partition.cluster_group.as_deref(),
            partition.cluster_selector.as_ref(),
            partition.cluster_group_selector.as_ref(),
        )
        .map_err(RolloutError::Selector)?;
        let mut members = 0;
        for (cluster, slot) in matched.iter().zip(in_some.iter_mut()) {
            let view = ClusterView {
                name: cluster.metadata.name.as_deref().unwrap_or_default(),
                labels: labels_of(&cluster.metadata),
            };
            if group_views(cluster, groups)
                .iter()
                .any(|g| criteria.matches(&view, g))
            {
                members += 1;
                *slot = true;
            }
        }
        check_limit(
            members,
            &[
                partition.max_unavailable.as_ref(),
                rollout.max_unavailable.as_ref(),
            ],
        )
        .map_err(RolloutError::Partitions)?;
    }
    check_limit(
        partitions.len(),
        &[rollout.max_unavailable_partitions.as_ref()],
    )
    .map_err(RolloutError::Partitions)?;
    Ok(in_some)
}

/// Whether Fleet's `limit(count, values...)` can read the first value present (JSON `null` is
/// absent): the error it returns, if any. With nothing to apply it to, nothing is read.
fn check_limit(count: usize, values: &[Option<&Value>]) -> Result<(), String> {
    if count == 0 {
        return Ok(());
    }
    let Some(value) = values.iter().flatten().find(|v| !v.is_null()) else {
        return Ok(());
    };
    match value {
        Value::String(s) => unreadable_limit(s).map_or(Ok(()), Err),
        // An integer (the schema admits nothing else).
        _ => Ok(()),
    }
}

/// Why Fleet's `limit` cannot read the string form of an int-or-string rollout value, worded
/// as Fleet words it; `None` when it can.
pub fn unreadable_limit(s: &str) -> Option<String> {
    if go_atoi(s) > 0 {
        return None;
    }
    let Some(number) = s.strip_suffix('%') else {
        return Some(format!(
            "invalid maxUnavailable, must be int or percentage (ending with %): {s}"
        ));
    };
    (!go_parse_float_ok(number)).then(|| {
        format!("failed to parse {s}: strconv.ParseFloat: parsing {number:?}: invalid syntax")
    })
}

/// Go's `strconv.Atoi` as `IntOrString.IntValue` uses it: 0 on a syntax error, the nearest
/// bound on overflow.
fn go_atoi(s: &str) -> i64 {
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    match s.parse::<i64>() {
        Ok(n) => n,
        Err(_) if negative => i64::MIN,
        Err(_) => i64::MAX,
    }
}

/// Whether Go's `strconv.ParseFloat(s, 64)` reads `s`: decimal (no `_`), hexadecimal with a
/// `p` exponent (`_` allowed between digits), `inf`/`infinity` with a sign or not, `nan`
/// without one, case-insensitively. An out-of-range value is an error in Go too.
fn go_parse_float_ok(s: &str) -> bool {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = unsigned.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return true;
    }
    if lower == "nan" {
        return unsigned.len() == s.len();
    }
    if let Some(hex) = lower.strip_prefix("0x") {
        return go_hex_float_ok(hex);
    }
    if unsigned.contains('_') || !unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return false;
    }
    unsigned.parse::<f64>().is_ok_and(f64::is_finite)
}

/// `mantissa p exponent` after `0x`: hex digits with at most one `.` and at least one digit,
/// then a decimal exponent; underscores only between digits.
fn go_hex_float_ok(hex: &str) -> bool {
    let Some((mantissa, exponent)) = hex.split_once('p') else {
        return false;
    };
    let exponent = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    let digits_ok = |s: &str, hex: bool| {
        let ok_digit = |c: char| {
            if hex {
                c.is_ascii_hexdigit()
            } else {
                c.is_ascii_digit()
            }
        };
        !s.starts_with('_')
            && !s.ends_with('_')
            && !s.contains("__")
            && s.chars().all(|c| c == '_' || ok_digit(c))
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // One underscore may also sit between the `0x` prefix and the first digit.
    let whole = whole
        .strip_prefix('_')
        .filter(|w| !w.is_empty())
        .unwrap_or(whole);
    !exponent.is_empty()
        && digits_ok(exponent, false)
        && !(whole.is_empty() && fraction.is_empty())
        && digits_ok(whole, true)
        && digits_ok(fraction, true)
}

#[cfg(test)]
mod tests;

//! Caps on what one admission may ask of the webhook, so a hostile or runaway object cannot turn into
//! hundreds of API requests: a HelmOp above the reference cap is denied (it cannot be checked), a workload
//! above it is admitted without a config stamp, with a warning (mutation never blocks).

use crate::error::Error;
use crate::verdict::Verdict;

/// Distinct Secrets and ConfigMaps one admission may reference. Each is one existence check (HelmOp) or one
/// lookup (workload stamp); real objects reference a handful. The rollout watcher skips workloads above it
/// by the same constant.
pub const MAX_REFERENCES: usize = helmop_core::rollout::MAX_REFERENCES;

/// The denial of a HelmOp listing more than [`MAX_REFERENCES`] downstream resources.
pub fn helmop_references(name: &str, count: usize) -> Option<Verdict> {
    (count > MAX_REFERENCES).then(|| {
        Verdict::deny(format!(
            "helmop webhook: HelmOp {name} references {count} Secrets and ConfigMaps, more than the {MAX_REFERENCES} \
             one admission may check; split it or list fewer downstreamResources"
        ))
    })
}

/// Why a workload referencing `count` Secrets and ConfigMaps gets no config stamp, if it is above the cap.
pub fn workload_references(count: usize) -> Result<(), Error> {
    if count > MAX_REFERENCES {
        return Err(Error::TooManyReferences {
            count,
            limit: MAX_REFERENCES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_passes_above_it_does_not() {
        assert!(helmop_references("ns/app", MAX_REFERENCES).is_none());
        assert!(workload_references(MAX_REFERENCES).is_ok());
        match helmop_references("ns/app", MAX_REFERENCES + 1) {
            Some(Verdict::Deny { message, code, .. }) => {
                assert!(
                    message.contains("ns/app") && message.contains("257"),
                    "{message}"
                );
                assert!(code < 500, "a policy denial, not an outage: {code}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            workload_references(MAX_REFERENCES + 1)
                .unwrap_err()
                .to_string()
                .contains("257")
        );
    }
}

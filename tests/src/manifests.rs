//! Where the shipped manifests are, and paths to them as kustomizations written by tests refer to
//! them.

use std::path::{Path, PathBuf};

/// `manifests/` of this repository.
pub fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// `to` relative to the directory `from` (both must exist): kustomize refuses absolute paths to
/// other kustomizations.
pub fn relative_path(from: &Path, to: &Path) -> anyhow::Result<PathBuf> {
    let from = from.canonicalize()?;
    let to = to.canonicalize()?;
    let mut rel = PathBuf::new();
    for _ in from.components().skip(1) {
        rel.push("..");
    }
    Ok(rel.join(to.strip_prefix("/")?))
}

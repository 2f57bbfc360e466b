//! What the walk over `spec` collects for the cross-reference rules: built by [`super::spec`],
//! read by [`super::resources`].

use super::{EntryPath, helm};
use crate::resource::ResourceRef;

/// A well-formed list entry and where it is.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub at: EntryPath,
    pub reference: ResourceRef,
}

/// What the cross-reference rules need from the spec.
pub(crate) struct SpecModel {
    /// The release namespace downstream, where the spec states it (`namespace`, else
    /// `defaultNamespace`); `None` leaves it to the agent's default.
    pub root_dest: Option<String>,
    pub root_entries: Vec<Entry>,
    pub root_values_from: Vec<helm::ValuesFromRef>,
    pub targets: Vec<TargetModel>,
    pub helm_secret_name: Option<String>,
}

pub(crate) struct TargetModel {
    /// As `SpecModel::root_dest`, with this target's options merged over the root's.
    pub dest: Option<String>,
    pub entries: Vec<Entry>,
    pub values_from: Vec<helm::ValuesFromRef>,
}

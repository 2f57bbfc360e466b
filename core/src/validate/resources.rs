//! `downstreamResources` lists and the rules that relate them to the rest of the spec.

use std::collections::HashMap;

use super::model::{Entry, SpecModel};
use super::{Ctx, EntryPath, JsonView, Map, Path, field, field_of, q, sorted_entries};
use crate::name_rules as names;
use crate::resource::{ResourceKind, ResourceRef};

/// Checks `base.downstreamResources` (of the root when `target` is `None`, else of that target)
/// and returns its well-formed entries.
pub(crate) fn check_list(
    cx: &mut Ctx,
    obj: &Map<'_>,
    base: &Path<'_>,
    target: Option<usize>,
) -> Vec<Entry> {
    let mut out = Vec::new();
    let Some(list) = super::array(obj, "downstreamResources") else {
        return out;
    };
    let list_path = base.key("downstreamResources");
    for (i, item) in list.iter().enumerate() {
        let path = list_path.index(i);
        let Some(item) = item.as_object() else {
            continue;
        };
        let kind = check_kind(cx, item, &path);
        let name = check_name(cx, item, &path);
        let extra = item.keys().any(|k| !matches!(k, "kind" | "name"));
        for (key, _) in extra
            .then(|| sorted_entries(item))
            .into_iter()
            .flatten()
            .filter(|(k, _)| !matches!(*k, "kind" | "name"))
        {
            let message = if key == "namespace" {
                "a downstream resource has no namespace: the API server drops this field and Fleet always copies from the HelmOp's own namespace; remove it".to_string()
            } else {
                format!(
                    "unknown field {key:?}: a downstream resource has only kind and name, the API server drops the rest"
                )
            };
            cx.warn(&path.key(key), message);
        }
        if let (Some(kind), Some(name)) = (kind, name) {
            out.push(Entry {
                at: EntryPath { target, index: i },
                reference: ResourceRef::new(kind, name),
            });
        }
    }
    out
}

fn check_kind(cx: &mut Ctx, item: &Map<'_>, path: &Path<'_>) -> Option<ResourceKind> {
    let kpath = &path.key("kind");
    match field(item, "kind") {
        None | Some(JsonView::Null) => {
            cx.deny(kpath, "kind is missing: use Secret or ConfigMap");
            None
        }
        Some(JsonView::Str(kind)) => match ResourceKind::parse(kind) {
            Some(parsed) => {
                if kind != parsed.as_str() {
                    cx.warn(
                        kpath,
                        format!(
                            "kind {} works (Fleet compares kinds case-insensitively), but write {:?}",
                            q(kind),
                            parsed.as_str()
                        ),
                    );
                }
                Some(parsed)
            }
            None => {
                cx.deny(
                    kpath,
                    format!("kind {} is not allowed: use Secret or ConfigMap", q(kind)),
                );
                None
            }
        },
        // A wrong type is the CRD's to report (schema.rs).
        Some(_) => None,
    }
}

fn check_name(cx: &mut Ctx, item: &Map<'_>, path: &Path<'_>) -> Option<String> {
    let npath = &path.key("name");
    match field(item, "name") {
        None | Some(JsonView::Null) => {
            cx.deny(
                npath,
                "name is missing: give the name of the Secret or ConfigMap to copy",
            );
            None
        }
        Some(JsonView::Str(name)) => match names::dns1123_subdomain_error(name) {
            None => Some(name.to_string()),
            Some(problem) => {
                cx.deny(
                    npath,
                    format!(
                        "name {} is not a valid Secret/ConfigMap name: it {problem}",
                        q(name)
                    ),
                );
                None
            }
        },
        Some(_) => None,
    }
}

/// The well-formed entries of a raw `downstreamResources` value (of the root when `target` is
/// `None`, else of that target), without reporting anything.
pub(crate) fn well_formed_entries(
    list: Option<&JsonView<'_>>,
    target: Option<usize>,
) -> Vec<Entry> {
    let Some(list) = list.and_then(JsonView::as_array) else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .filter_map(|(i, item)| {
            let kind = ResourceKind::parse(field_of(item, "kind")?.as_str()?)?;
            let name = field_of(item, "name")?.as_str()?;
            names::is_dns1123_subdomain(name).then(|| Entry {
                at: EntryPath { target, index: i },
                reference: ResourceRef::new(kind, name),
            })
        })
        .collect()
}

/// Duplicates after the root/target merge, helmSecretName listed again, and valuesFrom entries
/// that name a downstream resource in another namespace.
pub(crate) fn check_cross_references(cx: &mut Ctx, model: &SpecModel) {
    // Fleet merges by `lower(kind)|name` (rancher/fleet internal/cmd/controller/options
    // `downstreamResourceKey`); ResourceRef equality is exactly that key.
    let mut root_seen: HashMap<&ResourceRef, EntryPath> = HashMap::new();
    for e in &model.root_entries {
        match root_seen.get(&e.reference) {
            Some(first) => cx.warn(
                &e.at,
                format!("duplicate of {first} ({}): remove one", e.reference),
            ),
            None => {
                root_seen.insert(&e.reference, e.at);
            }
        }
    }
    for t in &model.targets {
        let mut seen: HashMap<&ResourceRef, EntryPath> = HashMap::new();
        for e in &t.entries {
            if let Some(first) = seen.get(&e.reference) {
                cx.warn(
                    &e.at,
                    format!("duplicate of {first} ({}): remove one", e.reference),
                );
            } else if let Some(root) = root_seen.get(&e.reference) {
                cx.warn(
                    &e.at,
                    format!(
                        "{} is already listed in {root}, which applies to every target: remove it here",
                        e.reference
                    ),
                );
            } else {
                seen.insert(&e.reference, e.at);
            }
        }
    }

    if let Some(secret) = &model.helm_secret_name {
        let all = model
            .root_entries
            .iter()
            .chain(model.targets.iter().flat_map(|t| t.entries.iter()));
        for e in all {
            if e.reference.kind == ResourceKind::Secret && &e.reference.name == secret {
                cx.warn(
                    &e.at,
                    format!("secret {} is also spec.helmSecretName, which Fleet already copies downstream; listing it again makes Fleet copy it twice: remove it here", q(secret)),
                );
            }
        }
    }

    // Root valuesFrom applies wherever the HelmOp deploys, so it meets every target's list;
    // its release namespace is the targets' when they all agree. Lookups go through maps of the
    // first entry per reference, so the cost is linear in entries plus valuesFrom, whatever the
    // number of targets (a list scanned per valuesFrom entry was seconds for a hostile HelmOp).
    fn first_of<'e>(
        entries: impl Iterator<Item = &'e Entry>,
    ) -> HashMap<&'e ResourceRef, &'e Entry> {
        let mut map = HashMap::new();
        for e in entries {
            map.entry(&e.reference).or_insert(e);
        }
        map
    }
    // Nothing below is about anything but valuesFrom; without any, no map is built.
    if model.root_values_from.is_empty() && model.targets.iter().all(|t| t.values_from.is_empty()) {
        return;
    }
    let root = first_of(model.root_entries.iter());
    let everything = first_of(
        model
            .root_entries
            .iter()
            .chain(model.targets.iter().flat_map(|t| t.entries.iter())),
    );
    let root_dest = if model.targets.is_empty() {
        model.root_dest.as_deref()
    } else {
        let first = model.targets[0].dest.as_deref();
        model
            .targets
            .iter()
            .all(|t| t.dest.as_deref() == first)
            .then_some(first)
            .flatten()
    };
    for v in &model.root_values_from {
        check_values_from(cx, v, |r| everything.get(r).copied(), root_dest);
    }
    for t in &model.targets {
        if t.values_from.is_empty() {
            continue;
        }
        let own = first_of(t.entries.iter());
        for v in &t.values_from {
            let scope = |r: &ResourceRef| root.get(r).or_else(|| own.get(r)).copied();
            check_values_from(cx, v, scope, t.dest.as_deref());
        }
    }
}

/// Fleet's agent reads a `valuesFrom` ConfigMap/Secret on the downstream cluster; when the name
/// is one of the HelmOp's downstream resources (or no namespace is given) it reads it from the
/// release namespace, where the copy lands, and ignores the entry's namespace
/// (rancher/fleet v0.16.1 `internal/helmdeployer/install.go` `getValues`,
/// `isInDownstreamResources`). A namespace there is harmless only when it is that namespace.
fn check_values_from<'e>(
    cx: &mut Ctx,
    v: &super::helm::ValuesFromRef,
    scope: impl Fn(&ResourceRef) -> Option<&'e Entry>,
    dest: Option<&str>,
) {
    let Some(ns) = v.namespace.as_deref() else {
        return;
    };
    if Some(ns) == dest {
        return;
    }
    let reference = ResourceRef::new(v.kind, v.name.clone());
    if let Some(entry) = scope(&reference) {
        let release = match dest {
            Some(d) => format!("namespace {}", q(d)),
            None => {
                "namespace, else defaultNamespace, else the agent's default namespace (default)"
                    .to_string()
            }
        };
        cx.warn(
            &format!("{}.namespace", v.path),
            format!(
                "{reference} is a downstream resource ({}): Fleet's agent reads it on each downstream cluster from the copy in the release namespace ({release}) and ignores namespace {} here: remove namespace",
                entry.at,
                q(ns)
            ),
        );
    }
}

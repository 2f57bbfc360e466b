//! The state of one simulated cluster and the API semantics `kubectl-helmop` relies on: create (409 when the
//! object exists), server-side apply with field ownership per manager (force, removal of fields the applier
//! alone owned, `metadata.uid`/`resourceVersion` preconditions in the body), JSON merge patch (same
//! preconditions, ownership moves to the patcher's `Update` entry), delete with UID/resourceVersion
//! preconditions, lists with label selectors and `limit`/`continue`, metadata-only views. Pure: no I/O.
//!
//! Field ownership is tracked at the granularity helmop can observe: one field per label, annotation and
//! `data`/`binaryData` key, one per other top-level field (`type`, `immutable`, `spec`, ...).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::route::Kind;

/// An API error as the API server words it (`Status` object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }

    fn not_found(kind: &Kind, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.plural),
        )
    }

    fn conflict(kind: &Kind, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                kind.plural
            ),
        )
    }
}

type Field = Vec<String>;

#[derive(Debug, Clone)]
struct Owner {
    manager: String,
    operation: &'static str,
    fields: BTreeSet<Field>,
}

#[derive(Debug, Clone)]
struct Object {
    value: Value,
    owners: Vec<Owner>,
}

/// One simulated cluster's objects.
#[derive(Debug)]
pub struct Store {
    seed: u64,
    next_uid: u64,
    revision: u64,
    /// (plural, namespace or "", name) -> object.
    objects: BTreeMap<(String, String, String), Object>,
}

const MAP_SECTIONS: [&str; 2] = ["data", "binaryData"];
const SERVER_META: [&str; 6] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "generation",
    "deletionTimestamp",
];

/// The fields an object (or an apply body) sets, at the granularity described in the module docs.
fn fields_of(value: &Value) -> BTreeSet<Field> {
    let mut out = BTreeSet::new();
    let Some(obj) = value.as_object() else {
        return out;
    };
    for (key, v) in obj {
        match key.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                for section in ["labels", "annotations"] {
                    for k in v
                        .get(section)
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                        .map(|(k, _)| k)
                    {
                        out.insert(vec!["metadata".into(), section.into(), k.clone()]);
                    }
                }
            }
            s if MAP_SECTIONS.contains(&s) => {
                for k in v.as_object().into_iter().flatten().map(|(k, _)| k) {
                    out.insert(vec![s.to_owned(), k.clone()]);
                }
            }
            _ if v.is_null() => {}
            _ => {
                out.insert(vec![key.clone()]);
            }
        }
    }
    out
}

fn get<'a>(value: &'a Value, field: &[String]) -> Option<&'a Value> {
    field.iter().try_fold(value, |v, k| v.get(k))
}

fn set(value: &mut Value, field: &[String], to: Value) {
    let mut at = value;
    for k in &field[..field.len() - 1] {
        if !at.get(k).is_some_and(Value::is_object) {
            at[k.as_str()] = json!({});
        }
        at = &mut at[k.as_str()];
    }
    at[field[field.len() - 1].as_str()] = to;
}

fn remove(value: &mut Value, field: &[String]) {
    let mut at = value;
    for k in &field[..field.len() - 1] {
        match at.get_mut(k) {
            Some(v) => at = v,
            None => return,
        }
    }
    if let Some(obj) = at.as_object_mut() {
        obj.remove(&field[field.len() - 1]);
    }
}

/// Empty maps are not stored (Go's `omitempty`).
fn normalise(value: &mut Value) {
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|_, v| !v.as_object().is_some_and(Map::is_empty) && !v.is_null());
    }
    if let Some(obj) = value.as_object_mut() {
        obj.retain(|k, v| {
            let empty_section =
                MAP_SECTIONS.contains(&k.as_str()) && v.as_object().is_some_and(Map::is_empty);
            !empty_section && !v.is_null()
        });
    }
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in patch {
        if v.is_null() {
            if let Some(obj) = target.as_object_mut() {
                obj.remove(k);
            }
        } else {
            merge(&mut target[k.as_str()], v);
        }
    }
}

/// `key=value`, `key==value`, `key!=value`, `key` and `!key` requirements, comma separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

pub fn parse_selector(selector: &str) -> Result<Vec<Requirement>, ApiError> {
    let mut out = Vec::new();
    for part in selector.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let req = if let Some((k, v)) = part.split_once("!=") {
            Requirement::NotEquals(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Requirement::Equals(k.trim().into(), v.trim().into())
        } else if part.contains(' ') || part.contains('(') {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!("fleetsim does not implement set-based label selectors: {part:?}"),
            ));
        } else if let Some(k) = part.strip_prefix('!') {
            Requirement::NotExists(k.trim().into())
        } else {
            Requirement::Exists(part.into())
        };
        out.push(req);
    }
    Ok(out)
}

fn matches(selector: &[Requirement], value: &Value) -> bool {
    let label = |k: &str| {
        value
            .pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
    };
    selector.iter().all(|r| match r {
        Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
        Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
        Requirement::Exists(k) => label(k).is_some(),
        Requirement::NotExists(k) => label(k).is_none(),
    })
}

/// What a list returns.
pub struct Page {
    pub items: Vec<Value>,
    pub resource_version: String,
    pub continue_token: Option<String>,
    pub remaining: usize,
}

/// `fieldsV1` of one owner: `{"f:metadata": {"f:labels": {"f:k": {}}}, "f:data": {"f:k": {}}, "f:type": {}}`.
fn fields_v1(fields: &BTreeSet<Field>) -> Value {
    let mut out = json!({});
    for f in fields {
        let path: Vec<String> = f.iter().map(|k| format!("f:{k}")).collect();
        set(&mut out, &path, json!({}));
    }
    out
}

impl Store {
    /// A cluster with `kube-system`, `kube-public` and `default`; `seed` makes its UIDs its own.
    pub fn new(seed: u64) -> Store {
        let mut store = Store {
            seed,
            next_uid: 0,
            revision: 1,
            objects: BTreeMap::new(),
        };
        for ns in ["kube-system", "kube-public", "default"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // Cannot fail: the store is empty and the names are distinct.
            let _ = store.create(&super::route::KINDS[0], None, body, "fleetsim");
        }
        store
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        let n = self.next_uid;
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (self.seed >> 32) as u32,
            (self.seed >> 16) as u16,
            self.seed as u16 & 0xfff,
            (n >> 48) as u16 & 0xfff,
            n & 0xffff_ffff_ffff
        )
    }

    fn bump(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    pub fn revision(&self) -> String {
        self.revision.to_string()
    }

    fn key(kind: &Kind, namespace: Option<&str>, name: &str) -> (String, String, String) {
        (
            kind.plural.to_owned(),
            namespace.unwrap_or("").to_owned(),
            name.to_owned(),
        )
    }

    fn require_namespace(&self, kind: &Kind, namespace: Option<&str>) -> Result<(), ApiError> {
        match (kind.namespaced, namespace) {
            (false, _) => Ok(()),
            (true, None) => Err(ApiError::new(
                400,
                "BadRequest",
                "a namespaced object needs a namespace in the path",
            )),
            (true, Some(ns))
                if self
                    .objects
                    .contains_key(&("namespaces".into(), String::new(), ns.into())) =>
            {
                Ok(())
            }
            (true, Some(ns)) => Err(ApiError::new(
                404,
                "NotFound",
                format!("namespaces \"{ns}\" not found"),
            )),
        }
    }

    /// The object as served (with `managedFields`).
    fn render(kind: &Kind, obj: &Object) -> Value {
        let mut v = obj.value.clone();
        let entries: Vec<Value> = obj
            .owners
            .iter()
            .filter(|o| !o.fields.is_empty())
            .map(|o| {
                json!({"manager": o.manager, "operation": o.operation, "apiVersion": kind.api_version(),
                       "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&o.fields)})
            })
            .collect();
        if !entries.is_empty() {
            v["metadata"]["managedFields"] = Value::Array(entries);
        }
        v
    }

    /// Checks the body names the object the path names and carries no server-set fields it must not.
    fn check_body(
        kind: &Kind,
        namespace: Option<&str>,
        name: Option<&str>,
        body: &Value,
    ) -> Result<String, ApiError> {
        let invalid = |m: String| ApiError::new(400, "BadRequest", m);
        if !body.is_object() {
            return Err(invalid("the body is not a JSON object".into()));
        }
        if body.get("stringData").is_some() {
            return Err(ApiError::new(
                501,
                "NotImplemented",
                "fleetsim does not implement stringData",
            ));
        }
        let body_name = body.pointer("/metadata/name").and_then(Value::as_str);
        let name = match (name, body_name) {
            (Some(p), Some(b)) if p != b => {
                return Err(invalid(format!(
                    "the name of the object ({b}) does not match the name on the URL ({p})"
                )));
            }
            (Some(p), _) => p,
            (None, Some(b)) => b,
            (None, None) => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.name: Required value",
                ));
            }
        };
        if let Some(ns) = body.pointer("/metadata/namespace").and_then(Value::as_str)
            && Some(ns) != namespace.filter(|_| kind.namespaced)
        {
            return Err(invalid(format!(
                "the namespace of the object ({ns}) does not match the namespace on the request"
            )));
        }
        Ok(name.to_owned())
    }

    fn fresh(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        mut body: Value,
    ) -> Value {
        let meta = body["metadata"]
            .as_object_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let mut meta: Map<String, Value> = meta
            .into_iter()
            .filter(|(k, _)| !SERVER_META.contains(&k.as_str()))
            .collect();
        meta.insert("name".into(), json!(name));
        if kind.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        }
        meta.insert("uid".into(), json!(self.uid()));
        meta.insert("resourceVersion".into(), json!(self.bump()));
        meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
        body["metadata"] = Value::Object(meta);
        body["apiVersion"] = json!(kind.api_version());
        body["kind"] = json!(kind.kind);
        match kind.kind {
            "Secret" if body.get("type").is_none_or(Value::is_null) => {
                body["type"] = json!("Opaque")
            }
            "Namespace" => body["status"] = json!({"phase": "Active"}),
            _ => {}
        }
        normalise(&mut body);
        body
    }

    /// POST: a new object; 409 AlreadyExists if one stands there.
    pub fn create(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        body: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        let name = Self::check_body(kind, namespace, None, &body)?;
        self.require_namespace(kind, namespace)?;
        let key = Self::key(kind, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.plural),
            ));
        }
        let value = self.fresh(kind, namespace, &name, body);
        let owners = vec![Owner {
            manager: manager.to_owned(),
            operation: "Update",
            fields: fields_of(&value),
        }];
        let obj = Object { value, owners };
        let out = Self::render(kind, &obj);
        self.objects.insert(key, obj);
        Ok(out)
    }

    pub fn get(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&Self::key(kind, namespace, name))
            .map(|o| Self::render(kind, o))
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// Objects of `kind` (in `namespace`, or everywhere), matching `selector`, in name order, at most
    /// `limit` after the `continue` token (the last key of the previous page).
    pub fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &[Requirement],
        limit: Option<usize>,
        after: Option<&str>,
    ) -> Result<Page, ApiError> {
        let after = after
            .map(|t| {
                let (ns, name) = t.split_once('/').ok_or_else(|| {
                    ApiError::new(400, "BadRequest", format!("invalid continue token {t:?}"))
                })?;
                Ok::<_, ApiError>((ns.to_owned(), name.to_owned()))
            })
            .transpose()?;
        let all: Vec<(&(String, String, String), &Object)> = self
            .objects
            .iter()
            .filter(|((plural, ns, name), _)| {
                plural == kind.plural
                    && namespace.is_none_or(|want| ns == want)
                    && after
                        .as_ref()
                        .is_none_or(|(a_ns, a_name)| (ns, name) > (a_ns, a_name))
            })
            .filter(|(_, o)| matches(selector, &o.value))
            .collect();
        let take = limit
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX)
            .min(all.len());
        let continue_token = (take < all.len()).then(|| {
            let (_, ns, name) = all[take - 1].0;
            format!("{ns}/{name}")
        });
        Ok(Page {
            items: all[..take]
                .iter()
                .map(|(_, o)| Self::render(kind, o))
                .collect(),
            resource_version: self.revision(),
            continue_token,
            remaining: all.len() - take,
        })
    }

    fn preconditions(
        kind: &Kind,
        name: &str,
        live: &Value,
        uid: Option<&str>,
        version: Option<&str>,
    ) -> Result<(), ApiError> {
        let live_uid = live
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        let live_version = live
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(uid) = uid.filter(|u| *u != live_uid) {
            return Err(ApiError::conflict(
                kind,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {live_uid}"
                ),
            ));
        }
        if version.is_some_and(|v| v != live_version) {
            return Err(ApiError::conflict(
                kind,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        Ok(())
    }

    fn check_immutable(
        kind: &Kind,
        name: &str,
        before: &Value,
        after: &Value,
    ) -> Result<(), ApiError> {
        let invalid = |what: &str| {
            Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "{} \"{name}\" is invalid: {what}: Invalid value: field is immutable",
                    kind.kind
                ),
            ))
        };
        if kind.kind == "Secret" && before.get("type") != after.get("type") {
            return invalid("type");
        }
        if before.get("immutable") == Some(&json!(true))
            && MAP_SECTIONS.iter().any(|s| before.get(*s) != after.get(*s))
        {
            return invalid("data");
        }
        Ok(())
    }

    /// Server-side apply by `manager` (`force` takes conflicting fields from other managers).
    pub fn apply(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        body: Value,
        manager: &str,
        force: bool,
    ) -> Result<(u16, Value), ApiError> {
        Self::check_body(kind, namespace, Some(name), &body)?;
        let key = Self::key(kind, namespace, name);
        let applied = fields_of(&body);
        let uid = body
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let version = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let Some(obj) = self.objects.get(&key) else {
            if uid.is_some() || version.is_some() {
                return Err(ApiError::not_found(kind, name));
            }
            self.require_namespace(kind, namespace)?;
            let value = self.fresh(kind, namespace, name, body);
            let obj = Object {
                owners: vec![Owner {
                    manager: manager.to_owned(),
                    operation: "Apply",
                    fields: applied,
                }],
                value,
            };
            let out = Self::render(kind, &obj);
            self.objects.insert(key, obj);
            return Ok((201, out));
        };
        Self::preconditions(kind, name, &obj.value, uid.as_deref(), version.as_deref())?;
        let mut obj = obj.clone();
        let is_me = |o: &Owner| o.manager == manager && o.operation == "Apply";
        let conflicts: Vec<String> = obj
            .owners
            .iter()
            .filter(|o| !is_me(o))
            .flat_map(|o| {
                applied
                    .iter()
                    .filter(|f| o.fields.contains(*f) && get(&obj.value, f) != get(&body, f))
                    .map(move |f| format!("conflict with \"{}\": .{}", o.manager, f.join(".")))
            })
            .collect();
        if !conflicts.is_empty() && !force {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Apply failed with {} conflicts: {}",
                    conflicts.len(),
                    conflicts.join(", ")
                ),
            ));
        }
        let before = obj.value.clone();
        let previous: BTreeSet<Field> = obj
            .owners
            .iter()
            .filter(|o| is_me(o))
            .flat_map(|o| o.fields.clone())
            .collect();
        for f in previous.difference(&applied) {
            if !obj.owners.iter().any(|o| !is_me(o) && o.fields.contains(f)) {
                remove(&mut obj.value, f);
            }
        }
        for f in &applied {
            if let Some(v) = get(&body, f) {
                set(&mut obj.value, f, v.clone());
            }
            if force && get(&before, f) != get(&body, f) {
                for o in obj.owners.iter_mut().filter(|o| !is_me(o)) {
                    o.fields.remove(f);
                }
            }
        }
        match obj.owners.iter_mut().find(|o| is_me(o)) {
            Some(o) => o.fields = applied,
            None => obj.owners.push(Owner {
                manager: manager.to_owned(),
                operation: "Apply",
                fields: applied,
            }),
        }
        normalise(&mut obj.value);
        Self::check_immutable(kind, name, &before, &obj.value)?;
        if obj.value != before {
            obj.value["metadata"]["resourceVersion"] = json!(self.bump());
        }
        let out = Self::render(kind, &obj);
        self.objects.insert(key, obj);
        Ok((200, out))
    }

    /// JSON merge patch by `manager`; `metadata.uid`/`resourceVersion` in the patch are preconditions.
    pub fn merge_patch(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        let key = Self::key(kind, namespace, name);
        let Some(obj) = self.objects.get(&key) else {
            return Err(ApiError::not_found(kind, name));
        };
        let uid = patch.pointer("/metadata/uid").and_then(Value::as_str);
        let version = patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        Self::preconditions(kind, name, &obj.value, uid, version)?;
        let mut obj = obj.clone();
        let before = obj.value.clone();
        let mut patch = patch;
        if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| {
                !SERVER_META.contains(&k.as_str()) && k != "name" && k != "namespace"
            });
        }
        merge(&mut obj.value, &patch);
        normalise(&mut obj.value);
        Self::check_immutable(kind, name, &before, &obj.value)?;
        let now = fields_of(&obj.value);
        let changed: BTreeSet<Field> = now
            .iter()
            .filter(|f| get(&before, f) != get(&obj.value, f))
            .cloned()
            .collect();
        for o in &mut obj.owners {
            o.fields.retain(|f| now.contains(f) && !changed.contains(f));
        }
        match obj
            .owners
            .iter_mut()
            .find(|o| o.manager == manager && o.operation == "Update")
        {
            Some(o) => o.fields.extend(changed),
            None => obj.owners.push(Owner {
                manager: manager.to_owned(),
                operation: "Update",
                fields: changed,
            }),
        }
        if obj.value != before {
            obj.value["metadata"]["resourceVersion"] = json!(self.bump());
        }
        let out = Self::render(kind, &obj);
        self.objects.insert(key, obj);
        Ok(out)
    }

    /// DELETE with optional UID/resourceVersion preconditions; answers the deleted object.
    pub fn delete(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
        version: Option<&str>,
    ) -> Result<Value, ApiError> {
        let key = Self::key(kind, namespace, name);
        let Some(obj) = self.objects.get(&key) else {
            return Err(ApiError::not_found(kind, name));
        };
        Self::preconditions(kind, name, &obj.value, uid, version)?;
        let out = Self::render(kind, obj);
        self.objects.remove(&key);
        self.bump();
        Ok(out)
    }

    /// Number of objects of `plural` (tests and the bench's sanity checks).
    pub fn count(&self, plural: &str) -> usize {
        self.objects.keys().filter(|(p, _, _)| p == plural).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::route::KINDS;
    use super::*;

    fn secrets() -> &'static Kind {
        &KINDS[1]
    }

    fn store_with_ns() -> Store {
        let mut s = Store::new(7);
        s.create(&KINDS[0], None, json!({"metadata": {"name": "ns"}}), "t")
            .unwrap();
        s
    }

    #[test]
    fn create_refuses_an_existing_object_and_a_missing_namespace() {
        let mut s = store_with_ns();
        let body = json!({"metadata": {"name": "a"}, "data": {"k": "dg=="}});
        s.create(secrets(), Some("ns"), body.clone(), "m").unwrap();
        assert_eq!(
            s.create(secrets(), Some("ns"), body.clone(), "m")
                .unwrap_err()
                .code,
            409
        );
        assert_eq!(
            s.create(secrets(), Some("nope"), body, "m")
                .unwrap_err()
                .code,
            404
        );
        let got = s.get(secrets(), Some("ns"), "a").unwrap();
        assert_eq!(got["type"], "Opaque");
        assert_eq!(
            got.pointer("/metadata/managedFields/0/operation"),
            Some(&json!("Update"))
        );
    }

    #[test]
    fn apply_removes_only_what_the_applier_alone_owned() {
        let mut s = store_with_ns();
        let first = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "dg==", "old": "dg=="}});
        assert_eq!(
            s.apply(secrets(), Some("ns"), "a", first, "m", false)
                .unwrap()
                .0,
            201
        );
        s.merge_patch(
            secrets(),
            Some("ns"),
            "a",
            json!({"metadata": {"annotations": {"theirs": "y"}}}),
            "other",
        )
        .unwrap();
        let (code, out) = s
            .apply(
                secrets(),
                Some("ns"),
                "a",
                json!({"metadata": {"name": "a"}, "data": {"k": "dw=="}}),
                "m",
                false,
            )
            .unwrap();
        assert_eq!(code, 200);
        assert_eq!(out["data"], json!({"k": "dw=="}));
        assert_eq!(out.pointer("/metadata/labels"), None);
        assert_eq!(
            out.pointer("/metadata/annotations/theirs"),
            Some(&json!("y"))
        );
    }

    #[test]
    fn apply_conflicts_without_force_and_checks_preconditions() {
        let mut s = store_with_ns();
        let created = s
            .create(
                secrets(),
                Some("ns"),
                json!({"metadata": {"name": "a"}, "data": {"k": "dg=="}}),
                "creator",
            )
            .unwrap();
        let body = json!({"metadata": {"name": "a"}, "data": {"k": "dw=="}});
        assert_eq!(
            s.apply(secrets(), Some("ns"), "a", body.clone(), "m", false)
                .unwrap_err()
                .code,
            409
        );
        let stale =
            json!({"metadata": {"name": "a", "resourceVersion": "1"}, "data": {"k": "dw=="}});
        assert_eq!(
            s.apply(secrets(), Some("ns"), "a", stale, "m", true)
                .unwrap_err()
                .code,
            409
        );
        let rv = created["metadata"]["resourceVersion"].clone();
        let guarded =
            json!({"metadata": {"name": "a", "resourceVersion": rv}, "data": {"k": "dw=="}});
        let (_, out) = s
            .apply(secrets(), Some("ns"), "a", guarded, "m", true)
            .unwrap();
        assert_ne!(out["metadata"]["resourceVersion"], rv);
        // A no-op apply keeps the resourceVersion.
        let (_, again) = s
            .apply(secrets(), Some("ns"), "a", body, "m", true)
            .unwrap();
        assert_eq!(
            again["metadata"]["resourceVersion"],
            out["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn secret_type_is_immutable_and_delete_honours_uid() {
        let mut s = store_with_ns();
        let out = s
            .create(
                secrets(),
                Some("ns"),
                json!({"metadata": {"name": "a"}}),
                "m",
            )
            .unwrap();
        let typed = json!({"metadata": {"name": "a"}, "type": "kubernetes.io/tls"});
        assert_eq!(
            s.apply(secrets(), Some("ns"), "a", typed, "m", true)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            s.delete(secrets(), Some("ns"), "a", Some("other"), None)
                .unwrap_err()
                .code,
            409
        );
        let uid = out["metadata"]["uid"].as_str().unwrap();
        s.delete(secrets(), Some("ns"), "a", Some(uid), None)
            .unwrap();
        assert_eq!(s.count("secrets"), 0);
    }

    #[test]
    fn lists_select_and_page() {
        let mut s = store_with_ns();
        for i in 0..5 {
            let labels = if i % 2 == 0 {
                json!({"m": "h"})
            } else {
                json!({})
            };
            s.create(
                secrets(),
                Some("ns"),
                json!({"metadata": {"name": format!("s{i}"), "labels": labels}}),
                "m",
            )
            .unwrap();
        }
        let sel = parse_selector("m=h").unwrap();
        let p1 = s.list(secrets(), None, &sel, Some(2), None).unwrap();
        assert_eq!(p1.items.len(), 2);
        let p2 = s
            .list(secrets(), None, &sel, Some(2), p1.continue_token.as_deref())
            .unwrap();
        assert_eq!((p2.items.len(), p2.continue_token), (1, None));
        assert_eq!(
            s.list(
                secrets(),
                Some("ns"),
                &parse_selector("!m").unwrap(),
                None,
                None
            )
            .unwrap()
            .items
            .len(),
            2
        );
        assert_eq!(parse_selector("m in (a)").unwrap_err().code, 400);
    }

    #[test]
    fn clusters_have_distinct_kube_system_uids() {
        let a = Store::new(1).get(&KINDS[0], None, "kube-system").unwrap();
        let b = Store::new(2).get(&KINDS[0], None, "kube-system").unwrap();
        assert_ne!(a["metadata"]["uid"], b["metadata"]["uid"]);
    }
}

//! The AdmissionReview v1 wire format: decoding requests, encoding [`Verdict`]s.
//!
//! Requests are decoded in one parse of the body into one borrowed JSON tree, which the request's objects point
//! into (what the rules read), with the request's fields and each object's metadata typed from that tree. A body
//! that does not decode that way is decoded again the typed way, only to say why with the position.
//!
//! kube's `AdmissionReview<DynamicObject>` is not used: its flattened fields go through serde's buffered `Content`
//! (the body is parsed twice) and the handlers had to serialize the object back into a `Value`, which together
//! cost more than the rest of a validation. Responses are encoded with our own structs:
//! kube 5's `AdmissionResponse` serializes `patch` as a JSON array of numbers (a `Vec<u8>`), while the API server
//! wants the base64 string of the JSON patch, and it emits the whole `metav1.Status` even on success.
//!
//! Decoding errors never quote the input: a serde message such as `invalid type: string "hunter2"` would copy
//! object data (possibly a Secret's) into the 400 body and the log line, so only the error class, the position and
//! field names from the schema are reported.

use base64::Engine;
use kube::api::ObjectMeta;
use kube::core::admission::Operation;
use kube::core::{GroupVersionKind, GroupVersionResource};
use std::sync::{Arc, OnceLock};

use helmop_core::validate::{JsonView, OwnedValue};
use serde::de;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::verdict::Verdict;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// Largest accepted request body. The API server caps objects at 3 MiB (etcd's default limit) and a review
/// carries the object and the old object, plus framing.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// Most JSON values (scalars, lists and objects, at any depth) one review may hold. A parsed tree costs
/// tens of bytes per value however short its text is: 2.9 MB of `[0,0,...]` in a HelmOp's `helm.values`
/// parsed into 163 MiB, about 48 times the body, so bytes alone bound nothing. Real reviews hold a few
/// thousand values; a HelmOp with the values of the largest public charts a few tens of thousands.
pub const MAX_VALUES: usize = 262_144;

/// Bytes charged per JSON value of a review against the in-flight budget (a borrowed tree node with its
/// share of its list's or object's growth, and the handlers' `serde_json::Value` of a workload).
pub const VALUE_COST: usize = 96;

/// Copies of a review's text its decision may hold besides the body: the objects' text the parsed trees
/// borrow from, and the strings typed decoding copies out of it (`metadata`, a HelmOp's model).
pub const TEXT_COPIES: usize = 2;

/// What one review may hold at most while it is decided, charged against `--max-in-flight-bytes`: its
/// body, [`TEXT_COPIES`] more of its text, and [`MAX_VALUES`] values.
pub const MAX_REVIEW_COST: usize = (1 + TEXT_COPIES) * MAX_BODY_BYTES + MAX_VALUES * VALUE_COST;

/// What a counting pass over a body found (see [`count_values`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// A JSON document of this many values.
    Values(usize),
    /// More than the limit: counting stopped there.
    TooMany,
    /// Not JSON (or nested past serde_json's 128 levels): [`decode`] says why.
    Invalid,
}

/// Counts the JSON values in `body` without building any of them, stopping past `limit`: one pass of
/// serde_json's parser with nothing allocated, so the cost of a review is known before it is decoded.
pub fn count_values(body: &[u8], limit: usize) -> Counted {
    let mut n = 0usize;
    let mut de = serde_json::Deserializer::from_slice(body);
    let seed = Count { n: &mut n, limit };
    match de::DeserializeSeed::deserialize(seed, &mut de).and_then(|()| de.end()) {
        Ok(()) => Counted::Values(n),
        Err(_) if n > limit => Counted::TooMany,
        Err(_) => Counted::Invalid,
    }
}

/// At least as many JSON values as `body` holds, from one scan of its bytes: every value but the first
/// follows a `[`, `,` or `:` of its own (an array's first element, a later one, a member's value), and
/// those bytes inside strings or before object keys only raise the bound. For a small review this is
/// the cost to charge without a parse: [`count_values`] is a full pass of the parser, tighter by a few
/// kilobytes of charge, and a body of `n` bytes cannot hold [`MAX_VALUES`] values before `n` does.
pub fn values_at_most(body: &[u8]) -> usize {
    // Counted in byte-wide sums over chunks of 255 (no sum can overflow), which the compiler turns into
    // vector code: a count per byte was 2% of a validation's CPU.
    1 + body
        .chunks(255)
        .map(|chunk| {
            let n = chunk.iter().fold(0u8, |n, &b| {
                n + u8::from(b == b'[') + u8::from(b == b',') + u8::from(b == b':')
            });
            usize::from(n)
        })
        .sum::<usize>()
}

struct Count<'c> {
    n: &'c mut usize,
    limit: usize,
}

impl Count<'_> {
    fn bump<E: de::Error>(&mut self) -> Result<(), E> {
        *self.n += 1;
        if *self.n > self.limit {
            return Err(E::custom("too many values"));
        }
        Ok(())
    }
}

impl<'de> de::DeserializeSeed<'de> for Count<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Count<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.bump()
    }
    fn visit_i64<E: de::Error>(mut self, _: i64) -> Result<(), E> {
        self.bump()
    }
    fn visit_u64<E: de::Error>(mut self, _: u64) -> Result<(), E> {
        self.bump()
    }
    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.bump()
    }
    fn visit_str<E: de::Error>(mut self, _: &str) -> Result<(), E> {
        self.bump()
    }
    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.bump()
    }
    fn visit_seq<A: de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.bump()?;
        let limit = self.limit;
        while seq
            .next_element_seed(Count {
                n: &mut *self.n,
                limit,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.bump()?;
        let limit = self.limit;
        while map.next_key::<de::IgnoredAny>()?.is_some() {
            map.next_value_seed(Count {
                n: &mut *self.n,
                limit,
            })?;
        }
        Ok(())
    }
}

/// The `request.uid` of a review, read without building anything else (to answer one that is not decoded).
pub fn review_uid(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Uid {
        uid: String,
    }
    #[derive(Deserialize)]
    struct Review {
        request: Option<Uid>,
    }
    serde_json::from_slice::<Review>(body)
        .ok()
        .and_then(|r| r.request)
        .map(|r| r.uid)
}

/// Why a body is not an AdmissionReview v1 this webhook can answer (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed AdmissionReview: not valid JSON (line {line}, column {column})")]
    Syntax { line: usize, column: usize },
    #[error("malformed AdmissionReview: body ends early (line {line}, column {column})")]
    Eof { line: usize, column: usize },
    #[error("malformed AdmissionReview: {detail} (line {line}, column {column})")]
    Schema {
        detail: String,
        line: usize,
        column: usize,
    },
    #[error(
        "unsupported review {api_version:?} kind {kind:?}: this webhook speaks {API_VERSION} {KIND} only"
    )]
    WrongVersion { api_version: String, kind: String },
    #[error("AdmissionReview has no request")]
    MissingRequest,
}

/// Only `apiVersion` and `kind`, to name the version of a body that failed to decode as v1.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

fn truncated(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

fn check_header(api_version: &str, kind: &str) -> Result<(), DecodeError> {
    if api_version == API_VERSION && kind == KIND {
        Ok(())
    } else {
        Err(DecodeError::WrongVersion {
            api_version: truncated(api_version),
            kind: truncated(kind),
        })
    }
}

fn from_serde(e: &serde_json::Error) -> DecodeError {
    let (line, column) = (e.line(), e.column());
    match e.classify() {
        serde_json::error::Category::Eof => DecodeError::Eof { line, column },
        serde_json::error::Category::Syntax | serde_json::error::Category::Io => {
            DecodeError::Syntax { line, column }
        }
        serde_json::error::Category::Data => {
            // Messages that name schema fields only are safe to pass on; anything else may quote the input.
            let msg = e.to_string();
            let detail = ["missing field `", "duplicate field `"]
                .iter()
                .find(|prefix| msg.starts_with(*prefix))
                .and_then(|_| msg.split(" at line ").next())
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    "a field has the wrong type or value for AdmissionReview v1".to_owned()
                });
            DecodeError::Schema {
                detail,
                line,
                column,
            }
        }
    }
}

/// One admission request of an AdmissionReview v1, as the handlers read it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(deserialize_with = "operation")]
    pub operation: Operation,
    /// Required by the v1 schema (the API server always sends it). Only the user name is kept: the
    /// delete guard tells the garbage collector by it.
    pub user_info: UserInfo,
    /// Filled from the review's tree by [`decode`], not by this type's own decoding.
    #[serde(skip)]
    pub object: Option<Object>,
    #[serde(skip)]
    pub old_object: Option<Object>,
    #[serde(default)]
    pub dry_run: bool,
}

/// `operation` read as a string, then as kube's enum: the tree's deserializer has no enums of its own.
fn operation<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Operation, D::Error> {
    struct Name;
    impl de::Visitor<'_> for Name {
        type Value = Operation;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an admission operation")
        }
        fn visit_str<E: de::Error>(self, name: &str) -> Result<Operation, E> {
            Operation::deserialize(de::value::StrDeserializer::<E>::new(name))
        }
    }
    deserializer.deserialize_str(Name)
}

/// Who sent the request, as the API server authenticated them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
}

/// An object of a review: its JSON parsed once into a tree that borrows from the object's own text (what the
/// HelmOp rules read), its `metadata` decoded (and so type-checked) from that tree, and a `serde_json::Value` of it
/// made only for a handler that asks (the workload stages patch one).
#[derive(Clone)]
pub struct Object {
    pub metadata: ObjectMeta,
    /// The tree the object is part of: the whole review's (shared with the request's other object), or
    /// the object's own.
    tree: Arc<OwnedValue>,
    place: Place,
    value: OnceLock<Value>,
}

/// Where in its tree an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The tree is the object.
    Whole,
    /// `request.<key>` of a review.
    Request(&'static str),
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The object only, not the rest of the review its tree may hold.
        f.debug_struct("Object")
            .field("metadata", &self.metadata)
            .field("view", self.view())
            .finish()
    }
}

impl Object {
    /// The object in `json`, which must be a JSON object whose `metadata` (if any) is a valid `ObjectMeta`. The
    /// error never quotes the input.
    pub fn parse(json: String) -> Result<Self, DecodeError> {
        let view = OwnedValue::from_string(json).map_err(|e| {
            match e
                .into_inner()
                .and_then(|e| e.downcast::<serde_json::Error>().ok())
            {
                Some(e) => from_serde(&e),
                None => DecodeError::Syntax { line: 0, column: 0 },
            }
        })?;
        Object::at(Arc::new(view), Place::Whole)
    }

    /// The object at `place` of `tree`, which must be a JSON object whose `metadata` (if any) is a valid
    /// `ObjectMeta`.
    fn at(tree: Arc<OwnedValue>, place: Place) -> Result<Self, DecodeError> {
        let Some(fields) = place.find(tree.get_value()).as_object() else {
            return Err(schema("an object of the review is not a JSON object"));
        };
        let metadata = match fields.get("metadata") {
            None | Some(JsonView::Null) => ObjectMeta::default(),
            // The deserializer's messages may quote the input: only the fact is passed on.
            Some(meta) => ObjectMeta::deserialize(meta)
                .map_err(|_| schema("an object's metadata has a field of the wrong type"))?,
        };
        Ok(Object {
            metadata,
            tree,
            place,
            value: OnceLock::new(),
        })
    }

    /// The object as a borrowed JSON tree, as sent.
    pub fn view(&self) -> &JsonView<'_> {
        self.place.find(self.tree.get_value())
    }

    /// The object as a `serde_json::Value`, made from [`Object::view`] on first use.
    pub fn value(&self) -> &Value {
        self.value.get_or_init(|| Value::from(self.view()))
    }
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.view() == other.view()
    }
}

impl Place {
    fn find<'t>(self, tree: &'t JsonView<'t>) -> &'t JsonView<'t> {
        match self {
            Place::Whole => tree,
            Place::Request(key) => tree.get("request").get(key),
        }
    }
}

fn schema(detail: &str) -> DecodeError {
    DecodeError::Schema {
        detail: detail.to_owned(),
        line: 0,
        column: 0,
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The object's text is kept (one copy) and parsed by `Object::parse`; a failure becomes a schema error at
        // the object's end in the body, whose message `from_serde` never passes on.
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Object::parse(String::from(Box::<str>::from(raw))).map_err(de::Error::custom)
    }
}

/// The review around the request; no `#[serde(flatten)]`, so the body is parsed once.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    api_version: String,
    kind: String,
    #[serde(default)]
    request: Option<Request>,
}

/// The objects of a review, for [`typed`]: a second pass over the body that only types them.
#[derive(Deserialize)]
struct ObjectsIn {
    #[serde(default)]
    request: Option<Objects>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Objects {
    #[serde(default)]
    object: Option<Object>,
    #[serde(default)]
    old_object: Option<Object>,
}

/// Decodes a request body into the request of an AdmissionReview v1.
pub fn decode(body: &[u8]) -> Result<Request, DecodeError> {
    match in_one_tree(body) {
        Some(request) => Ok(request),
        // Whatever one tree does not decode, the typed passes decode or say why, where, and without quoting the
        // input. They are the only source of an error, so every error reads as before the tree.
        None => typed(body),
    }
}

/// The review parsed once into one tree that its objects point into: the objects' text is neither scanned
/// twice nor copied twice (the typed way keeps each object's text, then parses it). `None` for anything but a
/// v1 review with a request, decoded without a doubt (a key given twice is a doubt: serde's typed decoding and
/// a tree's lookups pick different ones).
fn in_one_tree(body: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(body).ok()?.to_owned();
    let tree = Arc::new(OwnedValue::from_string(text).ok()?);
    let root = tree.get_value();
    if has_duplicate_keys(root)?
        || root.get("apiVersion").as_str()? != API_VERSION
        || root.get("kind").as_str()? != KIND
    {
        return None;
    }
    let request = root.get("request");
    if has_duplicate_keys(request)? {
        return None;
    }
    let mut decoded = Request::deserialize(request).ok()?;
    for (key, slot) in [
        ("object", &mut decoded.object),
        ("oldObject", &mut decoded.old_object),
    ] {
        if !request.get(key).is_null() {
            *slot = Some(Object::at(Arc::clone(&tree), Place::Request(key)).ok()?);
        }
    }
    Some(decoded)
}

/// Whether a key appears twice in `object` (a review's top levels hold a dozen keys); `None` for anything
/// but an object.
fn has_duplicate_keys(object: &JsonView<'_>) -> Option<bool> {
    let entries = object.as_object()?.as_vec();
    Some(
        entries
            .iter()
            .enumerate()
            .any(|(i, (key, _))| entries[i + 1..].iter().any(|(other, _)| other == key)),
    )
}

/// The review decoded the typed way: the request's fields, then its objects, each pass straight from the
/// body, so a failure has its position in the body.
fn typed(body: &[u8]) -> Result<Request, DecodeError> {
    let review: ReviewIn = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => {
            // A v1beta1 (or other) review may fail the v1 schema before its version is looked at; name the version
            // when it is the real problem.
            if let Ok(header) = serde_json::from_slice::<Header>(body)
                && !(header.api_version.is_empty() && header.kind.is_empty())
            {
                check_header(&header.api_version, &header.kind)?;
            }
            return Err(from_serde(&e));
        }
    };
    check_header(&review.api_version, &review.kind)?;
    let mut request = review.request.ok_or(DecodeError::MissingRequest)?;
    let objects: ObjectsIn = serde_json::from_slice(body).map_err(|e| from_serde(&e))?;
    if let Some(objects) = objects.request {
        request.object = objects.object;
        request.old_object = objects.old_object;
    }
    Ok(request)
}

/// The short name of an operation, for logs and metric labels.
pub fn operation_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

/// The subset of `metav1.Status` the API server reads from a denial.
#[derive(Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    message: &'a str,
}

/// A denial code the API server can pass on: an HTTP error status, else 403.
fn denial_code(code: u16) -> u16 {
    if (400..=599).contains(&code) {
        code
    } else {
        403
    }
}

fn reason(code: u16) -> Option<&'static str> {
    Some(match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => return None,
    })
}

/// What an encoded response did, for the log line and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    pub allowed: bool,
    /// Operations in the patch sent (0 when none was sent).
    pub patch_ops: usize,
    /// The denial code sent (0 when allowed).
    pub code: u16,
}

/// Encodes the AdmissionReview v1 response to the request `uid`. Patches are sent only by mutating webhooks and
/// only when non-empty; a patch that cannot be serialized turns into a 500 denial (never a silent allow).
pub fn encode(uid: &str, verdict: &Verdict, mutating: bool) -> (Vec<u8>, Encoded) {
    let (status, patch, warnings) = match verdict {
        Verdict::Allow { patch, warnings } => {
            let patch = patch.as_ref().filter(|p| mutating && !p.0.is_empty());
            match patch
                .map(|p| serde_json::to_vec(p).map(|json| (json, p.0.len())))
                .transpose()
            {
                Ok(patch) => (None, patch, warnings),
                Err(_) => (
                    Some((500, "helmop webhook could not encode its patch")),
                    None,
                    warnings,
                ),
            }
        }
        Verdict::Deny {
            message,
            code,
            warnings,
        } => (Some((denial_code(*code), message.as_str())), None, warnings),
    };
    let summary = Encoded {
        allowed: status.is_none(),
        patch_ops: patch.as_ref().map_or(0, |(_, ops)| *ops),
        code: status.map_or(0, |(code, _)| code),
    };
    let review = ReviewOut {
        api_version: API_VERSION,
        kind: KIND,
        response: ResponseOut {
            uid,
            allowed: status.is_none(),
            status: status.map(|(code, message)| StatusOut {
                status: "Failure",
                code,
                reason: reason(code),
                message,
            }),
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch: patch.map(|(json, _)| base64::engine::general_purpose::STANDARD.encode(json)),
            warnings,
        },
    };
    // Serializing these plain structs cannot fail (only strings, bools and integers).
    let body = serde_json::to_vec(&review).unwrap_or_default();
    (body, summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn review(api_version: &str, request: Option<Value>) -> Vec<u8> {
        let mut v = json!({"apiVersion": api_version, "kind": "AdmissionReview"});
        if let Some(r) = request {
            v["request"] = r;
        }
        serde_json::to_vec(&v).unwrap()
    }

    fn request() -> Value {
        json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "resource": {"group": "", "version": "v1", "resource": "secrets"},
            "namespace": "team-a", "name": "db", "operation": "DELETE",
            "userInfo": {"username": "alice"},
            "oldObject": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "team-a"},
                          "data": {"password": "aHVudGVyMg=="}},
            "dryRun": true
        })
    }

    #[test]
    fn one_tree_decodes_what_the_typed_passes_decode_and_leaves_every_doubt_to_them() {
        let mut full = request();
        full["object"] = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "labels": {"a": "b"}}, "data": {"k": "dg=="}});
        let body = review(API_VERSION, Some(full));
        let tree = in_one_tree(&body).expect("a plain review decodes in one tree");
        assert_eq!(tree, typed(&body).unwrap());
        assert_eq!(tree.object.as_ref().unwrap().value()["kind"], "Secret");
        assert_eq!(
            tree.old_object.as_ref().unwrap().metadata.name.as_deref(),
            Some("db")
        );
        // A key twice, at the top or in the request: the typed passes decide (and refuse).
        let twice = String::from_utf8(body.clone()).unwrap().replacen(
            "\"request\":{",
            "\"request\":{\"dryRun\":false,",
            1,
        );
        assert!(in_one_tree(twice.as_bytes()).is_none());
        assert!(matches!(
            decode(twice.as_bytes()),
            Err(DecodeError::Schema { .. })
        ));
        // Not a v1 review, no request, invalid UTF-8: the typed passes say why.
        assert!(in_one_tree(&review("admission.k8s.io/v1beta1", Some(request()))).is_none());
        assert!(in_one_tree(&review(API_VERSION, None)).is_none());
        assert!(in_one_tree(b"{\"a\": \"\xff\"}").is_none());
    }

    proptest::proptest! {
        /// Whatever is planted in a field, a review that decodes decodes alike both ways.
        #[test]
        fn one_tree_agrees_with_the_typed_passes(
            field in "(uid|name|namespace|operation|dryRun|userInfo|object|oldObject|subResource)",
            planted in proptest::prop_oneof![
                proptest::strategy::Just(json!(null)),
                proptest::strategy::Just(json!("CREATE")),
                proptest::strategy::Just(json!(true)),
                proptest::strategy::Just(json!({"metadata": {"name": "x"}})),
                proptest::strategy::Just(json!({"username": "u"})),
                proptest::strategy::Just(json!(["a"])),
            ],
        ) {
            let mut r = request();
            r[field.as_str()] = planted;
            let body = review(API_VERSION, Some(r));
            let typed = typed(&body);
            match in_one_tree(&body) {
                Some(tree) => proptest::prop_assert_eq!(Ok(tree), typed),
                None => proptest::prop_assert!(typed.is_err()),
            }
        }
    }

    #[test]
    fn decodes_v1_and_keeps_dry_run() {
        let req = decode(&review(API_VERSION, Some(request()))).unwrap();
        assert_eq!(req.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert!(req.dry_run);
        assert_eq!(operation_name(&req.operation), "DELETE");
        let old = req.old_object.unwrap();
        assert_eq!(old.value()["data"]["password"], "aHVudGVyMg==");
        assert_eq!(old.metadata.name.as_deref(), Some("db"));
    }

    #[test]
    fn objects_keep_their_json_as_sent_and_their_metadata_is_type_checked() {
        let mut with_object = request();
        with_object["object"] = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "labels": {"a": "b"}, "futureField": 1}, "data": {"k": "dg=="}});
        let req = decode(&review(API_VERSION, Some(with_object.clone()))).unwrap();
        let object = req.object.unwrap();
        // Unknown metadata fields stay in the JSON the rules read (nothing is re-serialized through ObjectMeta).
        assert_eq!(*object.value(), with_object["object"]);
        assert_eq!(
            object.metadata.labels.unwrap().get("a").map(String::as_str),
            Some("b")
        );
        let mut no_metadata = request();
        no_metadata["oldObject"] = json!({"kind": "Secret"});
        let old = decode(&review(API_VERSION, Some(no_metadata)))
            .unwrap()
            .old_object
            .unwrap();
        assert_eq!(old.metadata, ObjectMeta::default());
        for (field, bad) in [
            ("object", json!("PLANTED-s3cr3t")),
            ("object", json!([1])),
            ("oldObject", json!({"metadata": "PLANTED-s3cr3t"})),
            (
                "oldObject",
                json!({"metadata": {"labels": {"a": ["PLANTED-s3cr3t"]}}}),
            ),
        ] {
            let mut r = request();
            r[field] = bad;
            let err = decode(&review(API_VERSION, Some(r))).unwrap_err();
            assert!(
                matches!(&err, DecodeError::Schema { detail, .. } if detail.contains("wrong type")),
                "{field}: {err}"
            );
            assert!(!err.to_string().contains("PLANTED"), "{err}");
        }
        let mut no_user = request();
        no_user.as_object_mut().unwrap().remove("userInfo");
        let err = decode(&review(API_VERSION, Some(no_user))).unwrap_err();
        assert!(
            err.to_string().contains("missing field `userInfo`"),
            "{err}"
        );
    }

    #[test]
    fn rejects_other_versions_kinds_and_missing_request() {
        let err = decode(&review("admission.k8s.io/v1beta1", Some(request()))).unwrap_err();
        assert!(
            matches!(&err, DecodeError::WrongVersion { api_version, .. } if api_version == "admission.k8s.io/v1beta1")
        );
        let mut wrong_kind: Value =
            serde_json::from_slice(&review(API_VERSION, Some(request()))).unwrap();
        wrong_kind["kind"] = json!("ConversionReview");
        assert!(matches!(
            decode(&serde_json::to_vec(&wrong_kind).unwrap()),
            Err(DecodeError::WrongVersion { .. })
        ));
        assert_eq!(
            decode(&review(API_VERSION, None)).unwrap_err(),
            DecodeError::MissingRequest
        );
        // Version is named even when the body also fails the v1 schema.
        assert!(matches!(
            decode(br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":1}}"#),
            Err(DecodeError::WrongVersion { .. })
        ));
    }

    #[test]
    fn malformed_bodies_name_the_problem_without_quoting_input() {
        assert!(matches!(
            decode(b"{not json"),
            Err(DecodeError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            decode(br#"{"apiVersion":"#),
            Err(DecodeError::Eof { .. })
        ));
        assert!(matches!(decode(b""), Err(DecodeError::Eof { .. })));
        assert!(matches!(decode(b"[]"), Err(DecodeError::Schema { .. })));
        let mut missing_uid = request();
        missing_uid.as_object_mut().unwrap().remove("uid");
        let err = decode(&review(API_VERSION, Some(missing_uid))).unwrap_err();
        assert!(err.to_string().contains("missing field `uid`"), "{err}");

        // A wrongly typed field holding a secret value must not be echoed.
        let mut leaky = request();
        leaky["operation"] = json!("s3cr3t-value-XYZ");
        let err = decode(&review(API_VERSION, Some(leaky)))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
        let mut leaky = request();
        leaky["name"] = json!({"nested": "s3cr3t-value-XYZ"});
        let err = decode(&review(API_VERSION, Some(leaky)))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
        let long = "v".repeat(1000);
        let err = decode(&review(&long, Some(request())))
            .unwrap_err()
            .to_string();
        assert!(err.len() < 300, "{err}");
    }

    #[test]
    fn values_are_counted_without_building_them_and_counting_stops_at_the_limit() {
        assert_eq!(
            count_values(br#"{"a": [1, 2, {"b": null}], "c": "x"}"#, 100),
            Counted::Values(7)
        );
        assert_eq!(count_values(b"[0,0,0,0]", 4), Counted::TooMany);
        assert_eq!(count_values(b"[0,0,0,0]", 5), Counted::Values(5));
        assert_eq!(count_values(b"{\"a\": ", 100), Counted::Invalid);
        assert_eq!(count_values(b"[1] [2]", 100), Counted::Invalid);
        // Nested past serde_json's recursion limit: left to decode, which reports it.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(count_values(deep.as_bytes(), 1000), Counted::Invalid);
        // Dense values: 2 bytes each in the body, stopped at the limit however long the body.
        let dense = format!("[{}0]", "0,".repeat(1_000_000));
        assert_eq!(count_values(dense.as_bytes(), MAX_VALUES), Counted::TooMany);
    }

    #[test]
    fn the_byte_scan_bounds_the_values_from_above_and_is_exact_for_dense_lists() {
        for body in [
            &br#"{"a": [1, 2, {"b": null}], "c": "x"}"#[..],
            br#"{"commas, colons: [and brackets]": "in [strings], too:"}"#,
            br#"[[], {}, [[]], "", 0]"#,
            b"7",
            b"[0,0,0,0]",
        ] {
            let Counted::Values(n) = count_values(body, MAX_VALUES) else {
                panic!("{}", String::from_utf8_lossy(body));
            };
            assert!(
                values_at_most(body) >= n,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(values_at_most(b"[0,0,0,0]"), 5);
        // Past one chunk of the scan: exact for a dense list of any length.
        let dense = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(values_at_most(dense.as_bytes()), 1002);
        assert_eq!(
            count_values(dense.as_bytes(), MAX_VALUES),
            Counted::Values(1002)
        );
        let review = review(API_VERSION, Some(request()));
        let Counted::Values(n) = count_values(&review, MAX_VALUES) else {
            panic!("a review counts");
        };
        assert!((n..=2 * n + 8).contains(&values_at_most(&review)), "{n}");
    }

    #[test]
    fn the_uid_is_read_from_a_review_that_is_not_decoded() {
        let body = review(API_VERSION, Some(request()));
        assert_eq!(
            review_uid(&body).as_deref(),
            Some("705ab4f5-6393-11e8-b7cc-42010a800002")
        );
        assert_eq!(review_uid(b"[]"), None);
    }

    fn parse(body: &[u8]) -> Value {
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn allow_is_minimal() {
        let (body, summary) = encode("u1", &Verdict::allow(), true);
        assert_eq!(
            parse(&body),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "u1", "allowed": true}})
        );
        assert_eq!(
            summary,
            Encoded {
                allowed: true,
                patch_ops: 0,
                code: 0
            }
        );
    }

    #[test]
    fn patch_is_base64_of_the_json_patch_and_only_when_mutating_and_non_empty() {
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/annotations/helmop.dev~1config-hash", "value": "v1:abc"}
        ]))
        .unwrap();
        let verdict = Verdict::Allow {
            patch: Some(patch.clone()),
            warnings: vec!["w".into()],
        };
        let (body, summary) = encode("u2", &verdict, true);
        let v = parse(&body);
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(v["response"]["patch"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<json_patch::Patch>(&decoded).unwrap(),
            patch
        );
        assert_eq!(v["response"]["warnings"], json!(["w"]));
        assert_eq!(summary.patch_ops, 1);

        let (body, summary) = encode("u2", &verdict, false);
        assert!(
            parse(&body)["response"].get("patch").is_none(),
            "validating webhooks never patch"
        );
        assert_eq!(summary.patch_ops, 0);

        let empty = Verdict::Allow {
            patch: Some(json_patch::Patch(vec![])),
            warnings: vec![],
        };
        let v = parse(&encode("u3", &empty, true).0);
        assert!(
            v["response"].get("patch").is_none() && v["response"].get("patchType").is_none(),
            "{v}"
        );
    }

    #[test]
    fn deny_carries_status_and_warnings() {
        let verdict = Verdict::Deny {
            message: "two problems".into(),
            code: 403,
            warnings: vec!["w1".into()],
        };
        let (body, summary) = encode("u4", &verdict, false);
        assert_eq!(
            parse(&body)["response"],
            json!({"uid": "u4", "allowed": false, "warnings": ["w1"],
                   "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "two problems"}})
        );
        assert_eq!(
            summary,
            Encoded {
                allowed: false,
                patch_ops: 0,
                code: 403
            }
        );
        let odd = Verdict::Deny {
            message: "m".into(),
            code: 200,
            warnings: vec![],
        };
        assert_eq!(
            parse(&encode("u5", &odd, false).0)["response"]["status"]["code"],
            403
        );
        let internal = Verdict::Deny {
            message: "m".into(),
            code: 500,
            warnings: vec![],
        };
        assert_eq!(
            parse(&encode("u5", &internal, false).0)["response"]["status"]["reason"],
            "InternalError"
        );
    }

    #[test]
    fn kube_helper_still_emits_a_byte_array_patch() {
        // Why we encode ourselves: if this starts failing, kube fixed the bug and our structs could be dropped.
        let review: kube::core::admission::AdmissionReview<kube::core::DynamicObject> =
            serde_json::from_slice(&review(API_VERSION, Some(request()))).unwrap();
        let req: kube::core::admission::AdmissionRequest<_> = review.try_into().unwrap();
        let mut resp = kube::core::admission::AdmissionResponse::from(&req);
        resp.patch = Some(br#"[{"op":"remove","path":"/x"}]"#.to_vec());
        let resp = resp.into_review();
        let v = serde_json::to_value(&resp).unwrap();
        assert!(v["response"]["patch"].is_array(), "{v}");
    }

    proptest::proptest! {
        #[test]
        fn the_byte_scan_counts_every_bracket_comma_and_colon(
            bytes in proptest::collection::vec(proptest::sample::select(b"[,:a\"{".to_vec()), 0..2000),
        ) {
            let each = bytes.iter().filter(|b| matches!(b, b'[' | b',' | b':')).count();
            proptest::prop_assert_eq!(values_at_most(&bytes), 1 + each);
        }

        #[test]
        fn decoding_never_panics_and_never_echoes_values(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            field in "(uid|name|namespace|operation|kind|resource|dryRun|userInfo|object|options)",
            cut in 0usize..600,
        ) {
            let _ = decode(&bytes);
            // A planted value in any field, with the body possibly truncated: the error never quotes it.
            let mut v: Value = serde_json::from_slice(&review(API_VERSION, Some(request()))).unwrap();
            v["request"][field.as_str()] = json!("PLANTED-s3cr3t");
            let body = serde_json::to_vec(&v).unwrap();
            let body = &body[..cut.min(body.len())];
            if let Err(e) = decode(body) {
                proptest::prop_assert!(!e.to_string().contains("PLANTED"), "{}", e);
            }
        }
    }
}

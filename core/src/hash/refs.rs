//! The `helmop.dev/config-refs` annotation: what went into a `config-hash`, for people.
//!
//! ```text
//! refs  = "" / entry *("," entry)
//! entry = kind "/" token ["[" [token *("," token)] "]"] [state]
//! kind  = "configmap" / "secret"
//! state = "?"      ; absent, and every reference to it is optional
//!       / "!"      ; absent although required: the pod cannot start
//! token = 1*(ALPHA / DIGIT / "." / "_" / "-" / "%" HEXDIG HEXDIG)
//! ```
//!
//! Keys in brackets are the only keys the pod reads; no brackets means every key. Valid
//! Kubernetes names and keys only use the plain characters; any other byte (possible before the
//! API server has validated an object) is written as `%XX`, so the grammar stays unambiguous.
//!
//! A value longer than its budget (at most [`CONFIG_REFS_LIMIT`] bytes, less when the pod
//! template's other annotations leave less room under the API server's limit on all of them) is
//! summarised by [`bounded_config_refs`]: the first entries in full, then the next one's first
//! keys followed by `+N` (N keys not shown) and a last element `+M` (M entries not shown):
//! `configmap/app[a,b,+1148],+3`. The config hash still covers every reference; only the
//! annotation for people is cut. [`parse_config_refs`] refuses a summarised value.

use std::collections::BTreeSet;

use crate::podrefs::Keys;
use crate::resource::{ResourceKind, ResourceRef};

/// Whether a referenced object was there when the stamp was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefState {
    Present,
    /// Absent, and the pod does not need it.
    AbsentOptional,
    /// Absent although a reference to it is required.
    AbsentRequired,
}

/// One entry of `config-refs`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConfigRef {
    pub resource: ResourceRef,
    pub keys: Keys,
    pub state: RefState,
}

/// Why a `config-refs` value could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid config-refs at byte {at}: {reason}")]
pub struct ConfigRefsError {
    pub at: usize,
    pub reason: &'static str,
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

fn push_token(out: &mut String, token: &str) {
    for &b in token.as_bytes() {
        if is_plain(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// Formats entries in the order given.
pub fn format_config_refs(refs: &[ConfigRef]) -> String {
    let mut out = String::new();
    for (i, r) in refs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_entry(&mut out, r);
    }
    out
}

fn push_entry(out: &mut String, r: &ConfigRef) {
    push_head(out, r);
    if let Keys::Some(keys) = &r.keys {
        out.push('[');
        for (j, k) in keys.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            push_token(out, k);
        }
        out.push(']');
    }
    push_state(out, r.state);
}

fn push_head(out: &mut String, r: &ConfigRef) {
    out.push_str(r.resource.kind.lower());
    out.push('/');
    push_token(out, &r.resource.name);
}

fn push_state(out: &mut String, state: RefState) {
    match state {
        RefState::Present => {}
        RefState::AbsentOptional => out.push('?'),
        RefState::AbsentRequired => out.push('!'),
    }
}

/// The API server's limit on the total size of one object's annotations, keys plus values
/// (apimachinery `totalAnnotationSizeLimitB`); a pod template's metadata is held to it too.
pub const ANNOTATIONS_LIMIT: usize = 256 * 1024;

/// The most bytes `config-refs` ever holds; longer values are summarised.
pub const CONFIG_REFS_LIMIT: usize = 16 * 1024;

/// Room kept for the closing `,+N]` of a cut key list or a final `,+M` (`u64` has 20 digits).
const MORE_RESERVE: usize = 24;

/// The smallest budget [`bounded_config_refs`] honours (a bare `+N`).
pub const MIN_CONFIG_REFS_BUDGET: usize = MORE_RESERVE;

/// The bytes `config-refs` may take on a pod template whose other annotations (all but
/// `config-hash` and `config-refs`) take `others` bytes, with a `config-hash` value of
/// `hash_len` bytes: [`CONFIG_REFS_LIMIT`], or less so the whole set stays within
/// [`ANNOTATIONS_LIMIT`]. `None` when not even [`MIN_CONFIG_REFS_BUDGET`] is left.
pub fn config_refs_budget(others: usize, hash_len: usize) -> Option<usize> {
    let stamp =
        crate::names::ANN_CONFIG_HASH.len() + hash_len + crate::names::ANN_CONFIG_REFS.len();
    let left = ANNOTATIONS_LIMIT.checked_sub(others)?.checked_sub(stamp)?;
    (left >= MIN_CONFIG_REFS_BUDGET).then_some(left.min(CONFIG_REFS_LIMIT))
}

/// [`format_config_refs`] when it fits in `limit` bytes, else the summary the module describes;
/// never longer than `limit` when `limit` is at least [`MIN_CONFIG_REFS_BUDGET`].
pub fn bounded_config_refs(refs: &[ConfigRef], limit: usize) -> String {
    let full = format_config_refs(refs);
    if full.len() <= limit {
        return full;
    }
    let mut out = String::new();
    for (i, r) in refs.iter().enumerate() {
        let sep = if out.is_empty() { "" } else { "," };
        let mut entry = String::from(sep);
        push_entry(&mut entry, r);
        // Room for this entry and a final `,+M` for those after it.
        if out.len() + entry.len() + MORE_RESERVE <= limit {
            out.push_str(&entry);
            continue;
        }
        let mut shown = i;
        if let Keys::Some(keys) = &r.keys {
            let mut head = String::from(sep);
            push_head(&mut head, r);
            head.push('[');
            // Room for the head, some keys, `,+N]` and the state, and a final `,+M`.
            if out.len() + head.len() + 2 * MORE_RESERVE <= limit {
                let mut listed = 0;
                for k in keys {
                    let mut token = String::from(if listed > 0 { "," } else { "" });
                    push_token(&mut token, k);
                    if out.len() + head.len() + token.len() + 2 * MORE_RESERVE > limit {
                        break;
                    }
                    head.push_str(&token);
                    listed += 1;
                }
                if listed > 0 {
                    head.push(',');
                }
                head.push_str(&format!("+{}]", keys.len() - listed));
                push_state(&mut head, r.state);
                out.push_str(&head);
                shown = i + 1;
            }
        }
        let rest = refs.len() - shown;
        if rest > 0 {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&format!("+{rest}"));
        }
        break;
    }
    out
}

struct Parser<'s> {
    s: &'s [u8],
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, reason: &'static str) -> ConfigRefsError {
        ConfigRefsError {
            at: self.pos,
            reason,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn token(&mut self) -> Result<String, ConfigRefsError> {
        if self.peek() == Some(b'+') {
            return Err(self.err("a summarised value (`+N`: entries or keys not shown)"));
        }
        let start = self.pos;
        let mut bytes = Vec::new();
        while let Some(b) = self.peek() {
            if is_plain(b) {
                bytes.push(b);
                self.pos += 1;
            } else if b == b'%' {
                let hex = self
                    .s
                    .get(self.pos + 1..self.pos + 3)
                    .ok_or_else(|| self.err("truncated %-escape"))?;
                let hex = std::str::from_utf8(hex).map_err(|_| self.err("bad %-escape"))?;
                let byte = u8::from_str_radix(hex, 16).map_err(|_| self.err("bad %-escape"))?;
                bytes.push(byte);
                self.pos += 3;
            } else {
                break;
            }
        }
        if bytes.is_empty() {
            return Err(self.err("expected a name or key"));
        }
        String::from_utf8(bytes).map_err(|_| ConfigRefsError {
            at: start,
            reason: "escaped bytes are not UTF-8",
        })
    }

    fn entry(&mut self) -> Result<ConfigRef, ConfigRefsError> {
        if self.peek() == Some(b'+') {
            return Err(self.err("a summarised value (`+N`: entries or keys not shown)"));
        }
        let kind = if self.s[self.pos..].starts_with(b"configmap/") {
            self.pos += "configmap/".len();
            ResourceKind::ConfigMap
        } else if self.s[self.pos..].starts_with(b"secret/") {
            self.pos += "secret/".len();
            ResourceKind::Secret
        } else {
            return Err(self.err("expected `configmap/` or `secret/`"));
        };
        let name = self.token()?;
        let keys = if self.eat(b'[') {
            let mut keys = BTreeSet::new();
            if !self.eat(b']') {
                loop {
                    keys.insert(self.token()?);
                    if self.eat(b']') {
                        break;
                    }
                    if !self.eat(b',') {
                        return Err(self.err("expected `,` or `]`"));
                    }
                }
            }
            Keys::Some(keys)
        } else {
            Keys::All
        };
        let state = if self.eat(b'?') {
            RefState::AbsentOptional
        } else if self.eat(b'!') {
            RefState::AbsentRequired
        } else {
            RefState::Present
        };
        Ok(ConfigRef {
            resource: ResourceRef::new(kind, name),
            keys,
            state,
        })
    }
}

/// Reads a `config-refs` value back.
pub fn parse_config_refs(s: &str) -> Result<Vec<ConfigRef>, ConfigRefsError> {
    let mut p = Parser {
        s: s.as_bytes(),
        pos: 0,
    };
    let mut refs = Vec::new();
    if s.is_empty() {
        return Ok(refs);
    }
    loop {
        refs.push(p.entry()?);
        if p.peek().is_none() {
            return Ok(refs);
        }
        if !p.eat(b',') {
            return Err(p.err("expected `,` between entries"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(resource: ResourceRef, keys: &[&str], state: RefState) -> ConfigRef {
        let keys = if keys.is_empty() {
            Keys::All
        } else {
            Keys::Some(keys.iter().map(|k| k.to_string()).collect())
        };
        ConfigRef {
            resource,
            keys,
            state,
        }
    }

    #[test]
    fn formats_the_documented_examples() {
        let refs = vec![
            entry(ResourceRef::config_map("app"), &[], RefState::Present),
            entry(
                ResourceRef::secret("db"),
                &["user", "password"],
                RefState::Present,
            ),
            entry(ResourceRef::secret("tls"), &[], RefState::AbsentOptional),
            entry(
                ResourceRef::secret("gone"),
                &["k"],
                RefState::AbsentRequired,
            ),
        ];
        let s = format_config_refs(&refs);
        assert_eq!(
            s,
            "configmap/app,secret/db[password,user],secret/tls?,secret/gone[k]!"
        );
        assert_eq!(parse_config_refs(&s).unwrap(), refs);
        assert_eq!(format_config_refs(&[]), "");
        assert_eq!(parse_config_refs("").unwrap(), vec![]);
    }

    #[test]
    fn escapes_what_the_grammar_uses() {
        let refs = vec![entry(
            ResourceRef::config_map("a,b"),
            &["x]y", "p%q", "ü"],
            RefState::Present,
        )];
        let s = format_config_refs(&refs);
        assert_eq!(s, "configmap/a%2Cb[p%25q,x%5Dy,%C3%BC]");
        assert_eq!(parse_config_refs(&s).unwrap(), refs);
    }

    #[test]
    fn empty_key_list_round_trips() {
        let refs = vec![ConfigRef {
            resource: ResourceRef::secret("s"),
            keys: Keys::Some(BTreeSet::new()),
            state: RefState::Present,
        }];
        assert_eq!(format_config_refs(&refs), "secret/s[]");
        assert_eq!(parse_config_refs("secret/s[]").unwrap(), refs);
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [
            ",",
            "secret/",
            "pod/x",
            "Secret/x",
            "secret/x[",
            "secret/x[a",
            "secret/x[a,]",
            "secret/x,",
            "secret/x?!",
            "secret/x y",
            "secret/%zz",
            "secret/%4",
            "secret/%FF",
        ] {
            assert!(parse_config_refs(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            parse_config_refs("secret/x;").unwrap_err().to_string(),
            "invalid config-refs at byte 8: expected `,` between entries"
        );
    }
}

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
        out.push_str(r.resource.kind.lower());
        out.push('/');
        push_token(&mut out, &r.resource.name);
        if let Keys::Some(keys) = &r.keys {
            out.push('[');
            for (j, k) in keys.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                push_token(&mut out, k);
            }
            out.push(']');
        }
        match r.state {
            RefState::Present => {}
            RefState::AbsentOptional => out.push('?'),
            RefState::AbsentRequired => out.push('!'),
        }
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

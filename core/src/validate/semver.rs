//! Whether a chart `version` is a constraint Fleet can resolve.
//!
//! Fleet v0.16.1 resolves `spec.helm.version` with `github.com/Masterminds/semver/v3`'s
//! `NewConstraint` (go.mod pins v3.5.0): for OCI repos in `bundlereader.GetOCITag`
//! (rancher/fleet `internal/bundlereader/charturl.go`), for HTTP(S) repos through Helm's
//! `repo/v1.IndexFile.Get`, which parses the constraint before it looks at any version. A string
//! it cannot parse makes the HelmOp fail in Fleet's controller ("could not get a chart version").
//!
//! This module reproduces what `NewConstraint` accepts, step by step, as read from
//! Masterminds/semver (`constraints.go`, `version.go`; the grammar has not changed between
//! v3.4.0 and the newest commit on master, which is after v3.4.0 and which Fleet's v3.5.0 follows):
//!
//! 1. Hyphen ranges are rewritten first, on the whole string: every non-overlapping
//!    `\s*CV\s+-\s+CV\s*` becomes `>= A, <= B ` (a trailing space; the leading whitespace
//!    is swallowed, so `>=1 1.2 - 1.4` becomes `>=1>= 1.2, <= 1.4 ` and is rejected while
//!    `1 - 2>=3` becomes `>= 1, <= 2 >=3` and is accepted).
//! 2. The result is split on `||`; every group must be one or more `OP\s*CV`, the first one
//!    after optional whitespace, the next ones after whitespace or a comma. `OP` is one of
//!    `= != > < >= => <= =< ~ ~> ^` or nothing.
//! 3. `CV` is `v?P(.P)?(.P)?(-PRE)?(+META)?` where each `P` is a run of `0-9`, `x`, `X`, `*`
//!    *and `|`* (the character class is `[0-9|x|X|\*]`), `PRE`/`META` dot-separated runs of
//!    `[0-9A-Za-z-]`.
//! 4. Each constraint is then turned into a version: the first part that is exactly `x`, `X`
//!    or `*` (or missing) ends it, the parts before it must be decimal numbers that fit an
//!    unsigned 64-bit integer (leading zeros are fine: `NewVersion` coerces), the parts after it
//!    are never looked at; a numeric pre-release identifier must not have a leading zero.
//!
//! An empty string is not a constraint (step 2 needs at least one `CV`): Helm substitutes `*`
//! for an empty version, Fleet's OCI path does not (see `validate::helm`).

use std::borrow::Cow;

use super::Error;

/// Longest version constraint checked, in bytes (npm's semver has the same bound). The range rewrite
/// below follows Masterminds' (a scan from every position, a replace per range), which is quadratic
/// in the length: 600,000 digits cost a minute of CPU. No chart's constraint comes near.
pub const MAX_CONSTRAINT_LEN: usize = 256;

/// `None` if `s` parses as a Masterminds semver v3 constraint, else a short reason.
pub fn constraint_error(s: &str) -> Option<String> {
    if s.len() > MAX_CONSTRAINT_LEN {
        return Some(format!(
            "a version constraint of {} bytes; helmop checks constraints up to {MAX_CONSTRAINT_LEN} bytes (e.g. 1.2.3, ^1.2, >= 1.0, < 2.0)",
            s.len()
        ));
    }
    masterminds_error(s)
}

/// [`constraint_error`] without the length bound: Masterminds' own verdict.
///
/// Allocates nothing for a constraint it accepts without a hyphen range (the webhook checks one per
/// HelmOp admission): each group is scanned once for its shape, then again for its versions,
/// instead of collecting them.
pub(crate) fn masterminds_error(s: &str) -> Option<String> {
    let rewritten = rewrite_ranges(s);
    for group in rewritten.split("||") {
        if split_group(group.as_bytes(), |_| Ok(())).is_none() {
            return Some(format!("improper constraint: {}", super::q(group.trim())));
        }
        if let Some(Err(problem)) = split_group(group.as_bytes(), check_version) {
            return Some(problem.to_string());
        }
    }
    None
}

/// Go's regexp `\s` (RE2, ASCII only): space, \t, \n, \f, \r. Not \v.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0c' | b'\r')
}

fn is_part(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'x' | b'X' | b'*' | b'|')
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

fn is_op(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'>' | b'<' | b'~' | b'^')
}

fn skip_ws(s: &[u8], mut at: usize) -> usize {
    while at < s.len() && is_ws(s[at]) {
        at += 1;
    }
    at
}

fn run(s: &[u8], mut at: usize, class: fn(u8) -> bool) -> usize {
    while at < s.len() && class(s[at]) {
        at += 1;
    }
    at
}

/// A version in a constraint, as Masterminds' `cvRegex` captures it.
#[derive(Debug)]
struct Cv<'a> {
    /// Major, minor, patch: the first `len` are there.
    parts: [&'a str; 3],
    len: usize,
    pre: Option<&'a str>,
    end: usize,
}

impl<'a> Cv<'a> {
    fn parts(&self) -> &[&'a str] {
        &self.parts[..self.len]
    }
}

/// The greedy `cvRegex` match starting exactly at `at`. Greedy is the only parse that can
/// matter: whatever follows a version must be whitespace, a comma or the end, none of which a
/// version contains.
fn scan_cv(s: &[u8], at: usize) -> Option<Cv<'_>> {
    let text = |a: usize, b: usize| std::str::from_utf8(&s[a..b]).unwrap_or_default();
    let mut pos = at;
    if s.get(pos) == Some(&b'v') {
        pos += 1;
    }
    let end = run(s, pos, is_part);
    if end == pos {
        return None;
    }
    let mut parts = [text(pos, end), "", ""];
    let mut len = 1;
    pos = end;
    while len < 3 && s.get(pos) == Some(&b'.') {
        let end = run(s, pos + 1, is_part);
        if end == pos + 1 {
            break;
        }
        parts[len] = text(pos + 1, end);
        len += 1;
        pos = end;
    }
    let mut pre = None;
    if s.get(pos) == Some(&b'-')
        && let Some(end) = scan_idents(s, pos + 1)
    {
        pre = Some(text(pos + 1, end));
        pos = end;
    }
    if s.get(pos) == Some(&b'+')
        && let Some(end) = scan_idents(s, pos + 1)
    {
        pos = end;
    }
    Some(Cv {
        parts,
        len,
        pre,
        end: pos,
    })
}

/// `[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*` at `at`; the end, if at least one identifier.
fn scan_idents(s: &[u8], at: usize) -> Option<usize> {
    let mut end = run(s, at, is_ident);
    if end == at {
        return None;
    }
    while s.get(end) == Some(&b'.') {
        let next = run(s, end + 1, is_ident);
        if next == end + 1 {
            break;
        }
        end = next;
    }
    Some(end)
}

/// `rewriteRange`: every leftmost, non-overlapping `\s*CV\s+-\s+CV\s*` of the original string,
/// each replaced (first occurrence of its text, in the string as rewritten so far) by
/// `>= A, <= B `.
fn rewrite_ranges(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at < b.len() {
        match range_at(b, at) {
            Some((end, a, z)) => {
                found.push((&s[at..end], format!(">= {a}, <= {z} ")));
                at = end;
            }
            None => at += 1,
        }
    }
    if found.is_empty() {
        return Cow::Borrowed(s);
    }
    let mut out = s.to_string();
    for (text, with) in found {
        out = out.replacen(text, &with, 1);
    }
    Cow::Owned(out)
}

fn range_at(s: &[u8], at: usize) -> Option<(usize, &str, &str)> {
    let text = |a: usize, b: usize| std::str::from_utf8(&s[a..b]).unwrap_or_default();
    let start = skip_ws(s, at);
    let first = scan_cv(s, start)?;
    let dash = skip_ws(s, first.end);
    if dash == first.end || s.get(dash) != Some(&b'-') {
        return None;
    }
    let second_start = skip_ws(s, dash + 1);
    if second_start == dash + 1 {
        return None;
    }
    let second = scan_cv(s, second_start)?;
    let end = skip_ws(s, second.end);
    Some((end, text(start, first.end), text(second_start, second.end)))
}

/// `validConstraintRegex` for one `||` group: `None` when the group does not match, else `each`
/// of its constraints' versions in order, up to the first error. `each` may be called on the
/// versions before a part of the group that does not match.
fn split_group<'a>(
    s: &'a [u8],
    mut each: impl FnMut(&Cv<'a>) -> Result<(), Error>,
) -> Option<Result<(), Error>> {
    let mut pos = skip_ws(s, 0);
    loop {
        // The operator must take every operator character before the version: a version never
        // starts with one, so a shorter operator cannot be followed by a version.
        let op_end = run(s, pos, is_op);
        let op = &s[pos..op_end];
        if !matches!(
            op,
            b"" | b"=" | b"!=" | b">" | b"<" | b">=" | b"=>" | b"<=" | b"=<" | b"~" | b"~>" | b"^"
        ) {
            return None;
        }
        let cv = scan_cv(s, skip_ws(s, op_end))?;
        let after = cv.end;
        if let Err(problem) = each(&cv) {
            return Some(Err(problem));
        }
        pos = skip_ws(s, after);
        if pos == s.len() {
            return Some(Ok(()));
        }
        if s[pos] == b',' {
            pos = skip_ws(s, pos + 1);
        } else if pos == after {
            return None;
        }
    }
}

/// `parseConstraint` + `NewVersion` (coercing): the parts up to the first wildcard must be
/// numbers that fit a u64; the pre-release must not have numeric identifiers with leading zeros.
fn check_version(cv: &Cv<'_>) -> Result<(), Error> {
    let wildcard = |p: &str| matches!(p, "x" | "X" | "*");
    let numeric = cv.parts().iter().take_while(|p| !wildcard(p));
    for part in numeric {
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::NotAVersionNumber {
                part: (*part).to_owned(),
            });
        }
        if part.parse::<u64>().is_err() {
            return Err(Error::VersionNumberTooLarge {
                part: (*part).to_owned(),
            });
        }
    }
    if let Some(pre) = cv.pre {
        for ident in pre.split('.') {
            if ident.len() > 1
                && ident.starts_with('0')
                && ident.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(Error::LeadingZero {
                    pre: pre.to_owned(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

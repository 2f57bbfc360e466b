//! Whether a chart `version` is a constraint Fleet can resolve.
//!
//! Fleet resolves `spec.helm.version` with `github.com/Masterminds/semver/v3`'s `NewConstraint`:
//! for OCI repos in `bundlereader.GetOCITag` (rancher/fleet `internal/bundlereader/charturl.go`),
//! for HTTP repos through Helm's `repo.IndexFile.Get`. A string it cannot parse makes the
//! HelmOp fail in Fleet's controller ("could not get a chart version"). This module accepts the
//! same language: `||`-separated groups of constraints, each an optional operator
//! (`= != > < >= => <= =< ~ ~> ^`) and a version `v?X[.Y[.Z]][-pre][+meta]` where each of X, Y, Z
//! is a number or a wildcard (`x`, `X`, `*`), separated by spaces or commas; hyphen ranges
//! (`1.2 - 1.4.5`) too.

/// `None` if `s` parses as a Masterminds semver v3 constraint, else a short reason.
pub fn constraint_error(s: &str) -> Option<String> {
    for group in s.split("||") {
        if let Err(problem) = parse_group(group) {
            return Some(problem);
        }
    }
    None
}

struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
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

    fn eat_str(&mut self, prefix: &str) -> bool {
        if self.s[self.pos..].starts_with(prefix.as_bytes()) {
            self.pos += prefix.len();
            true
        } else {
            false
        }
    }

    /// Skips whitespace (Go regexp `\s`: space, \t, \n, \f, \r); returns how much.
    fn skip_ws(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\x0c' | b'\r')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }
}

fn parse_group(group: &str) -> Result<(), String> {
    let mut c = Cursor {
        s: group.as_bytes(),
        pos: 0,
    };
    let improper = || format!("improper constraint: {}", super::q(group.trim()));
    c.skip_ws();
    loop {
        let op = parse_op(&mut c);
        c.skip_ws();
        parse_version(&mut c).map_err(|e| format!("{}: {e}", improper()))?;
        let ws = c.skip_ws();
        // `A - B` hyphen range (only valid without an operator on A).
        if ws > 0 && op.is_empty() && c.peek() == Some(b'-') {
            let save = c.pos;
            c.pos += 1;
            if c.skip_ws() > 0 {
                parse_version(&mut c).map_err(|e| format!("{}: {e}", improper()))?;
                let ws = c.skip_ws();
                if c.at_end() {
                    return Ok(());
                }
                if !c.eat(b',') && ws == 0 {
                    return Err(improper());
                }
                c.skip_ws();
                continue;
            }
            c.pos = save;
        }
        if c.at_end() {
            return Ok(());
        }
        if c.eat(b',') {
            c.skip_ws();
        } else if ws == 0 {
            return Err(improper());
        }
        if c.at_end() {
            return Err(improper());
        }
    }
}

fn parse_op<'a>(c: &mut Cursor<'a>) -> &'static str {
    for op in [">=", "=>", "<=", "=<", "!=", "~>", "=", ">", "<", "~", "^"] {
        if c.eat_str(op) {
            return op;
        }
    }
    ""
}

/// `v?X(.X)?(.X)?(-pre)?(+meta)?`, X a number or one of `x X *`.
fn parse_version(c: &mut Cursor<'_>) -> Result<(), String> {
    c.eat(b'v');
    parse_part(c)?;
    for _ in 0..2 {
        if c.peek() == Some(b'.') {
            c.pos += 1;
            parse_part(c)?;
        } else {
            break;
        }
    }
    if c.eat(b'-') {
        parse_idents(c, true)?;
    }
    if c.eat(b'+') {
        parse_idents(c, false)?;
    }
    Ok(())
}

fn parse_part(c: &mut Cursor<'_>) -> Result<(), String> {
    match c.peek() {
        Some(b'x' | b'X' | b'*') => {
            c.pos += 1;
            Ok(())
        }
        Some(b'0'..=b'9') => {
            let start = c.pos;
            while matches!(c.peek(), Some(b'0'..=b'9')) {
                c.pos += 1;
            }
            let digits = std::str::from_utf8(&c.s[start..c.pos]).unwrap_or_default();
            // Masterminds parses each segment as a uint64.
            digits
                .parse::<u64>()
                .map(|_| ())
                .map_err(|_| format!("version number {digits} is too large"))
        }
        _ => Err("expected a version number or x, X, *".into()),
    }
}

/// Dot-separated `[0-9A-Za-z-]+` identifiers; pre-release numeric ones must not have leading zeros.
fn parse_idents(c: &mut Cursor<'_>, prerelease: bool) -> Result<(), String> {
    loop {
        let start = c.pos;
        while matches!(c.peek(), Some(b) if b.is_ascii_alphanumeric() || b == b'-') {
            c.pos += 1;
        }
        let ident = &c.s[start..c.pos];
        if ident.is_empty() {
            return Err("empty pre-release or build identifier".into());
        }
        if prerelease && ident.len() > 1 && ident[0] == b'0' && ident.iter().all(u8::is_ascii_digit)
        {
            return Err("numeric pre-release identifiers must not have leading zeros".into());
        }
        if !c.eat(b'.') {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_masterminds_accepts() {
        for ok in [
            "1.2.3",
            "v1.2.3",
            "1.2",
            "1",
            "*",
            "x",
            "1.x",
            "1.2.x",
            "1.X",
            "^1.2.3",
            "~1.2",
            "~>1.2",
            ">=1.2.3",
            "=>1.2.3",
            "<=2",
            "=<2",
            "!=1.2.3",
            ">= 1.2.3",
            ">=1.2.3 <2.0.0",
            ">=1.2.3, <2.0.0",
            ">=1.2.3 , <2.0.0",
            "  >1 ",
            "1.2.3 || 2.x",
            ">=1.0 <2.0 || >=3.0",
            "1.2 - 1.4.5",
            "1.2.3-beta.1",
            "1.2.3-beta.1+build.5",
            "1.2.3+build",
            "=1.2.3",
            "0.1.0-rc.0",
        ] {
            assert_eq!(constraint_error(ok), None, "{ok:?} should be valid");
        }
    }

    #[test]
    fn rejects_what_masterminds_rejects() {
        for bad in [
            "latest",
            "stable",
            "1.2.3.4",
            "1..2",
            ">",
            "1.2.3 ||",
            "|| 1",
            ">=1.2.3<2",
            "1.2.3-",
            "1.2.3-01",
            "1.2.3+",
            "1x",
            "1.2.3,",
            "abc",
            "=>=1",
            "1.2 -1.4",
            ">1.2 - 1.4",
            "99999999999999999999",
            "V1.2.3",
        ] {
            assert!(constraint_error(bad).is_some(), "{bad:?} should be invalid");
        }
    }
}

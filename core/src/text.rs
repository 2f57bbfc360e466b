//! Text that comes from outside the process (whatever answers at a Cluster's URL) on its way to a
//! terminal, a report or an Event note: control characters escaped, length bounded.

/// Longest text kept from one foreign message, in characters; the rest is cut with `...`.
pub const MAX_FOREIGN_TEXT: usize = 1024;

/// `s` with every control character (C0, DEL, C1) and every bidirectional override or isolate
/// written as `\u{..}`, so it cannot move the cursor, clear a screen, set a title or reorder what
/// follows, and cut to [`MAX_FOREIGN_TEXT`] characters.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_FOREIGN_TEXT + 8));
    for (n, c) in s.chars().enumerate() {
        if n == MAX_FOREIGN_TEXT {
            out.push_str("...");
            break;
        }
        if c.is_control() || is_bidi_control(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// U+202A..U+202E (embeddings, overrides), U+2066..U+2069 (isolates), U+200E/U+200F (marks).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

/// Log filter directives every binary adds after its own level: kube's client logs a response
/// body it cannot parse (and, at debug, an error body) in full, which may hold a Secret's data.
/// Its TLS warnings (a CA bundle that cannot be reloaded) stay.
pub const LOG_DIRECTIVES: [&str; 2] =
    ["kube_client::client=error", "kube_client::client::tls=warn"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(printable("forbidden: nope"), "forbidden: nope");
        assert_eq!(
            printable("a\u{1b}[2J\u{1b}]0;title\u{7}b\r\nc\u{9b}d"),
            "a\\u{1b}[2J\\u{1b}]0;title\\u{7}b\\u{d}\\u{a}c\\u{9b}d"
        );
        assert_eq!(printable("x\u{202e}y\u{2066}z"), "x\\u{202e}y\\u{2066}z");
        assert_eq!(printable("é ✓"), "é ✓");
    }

    #[test]
    fn long_text_is_cut() {
        let s = "é".repeat(5000);
        let p = printable(&s);
        assert_eq!(p.chars().count(), MAX_FOREIGN_TEXT + 3);
        assert!(p.ends_with("..."));
    }
}

//! Go's `regexp` (RE2 syntax as Go parses it) on Rust's `regex` engine.
//!
//! Fleet checks Policy patterns with Go's `regexp.Compile`. Rust's `regex` reads almost the same
//! syntax with different meanings in places: its `\d \w \s \b` are Unicode-aware where Go's are
//! ASCII, it reads nested classes and `&&`/`--`/`~~` inside `[...]` where Go reads literals, `\<`
//! is a word boundary where Go reads `<`, it refuses `\Q...\E`, duplicate flags and names starting
//! with a digit, and it accepts `\u`, `(?x)`, `{2000}` and binary Unicode properties that Go
//! refuses. So the pattern is parsed here the way Go's `regexp/syntax` parses it (`parse.go` of
//! the Go release Fleet v0.16 builds with, go1.26), every rule Go checks is checked, and what is
//! left is printed in a form both engines read alike: literals as `\x{..}`, Perl classes as
//! explicit ASCII sets, groups non-capturing, flags normalised.
//!
//! Bounds: Go's own (a repeat count, and the product of nested counts, at most 1000; a tree at
//! most 1000 high; at most 3.3M program instructions), then Rust's compiled-size limit of
//! [`COMPILED_SIZE_LIMIT`] bytes, which refuses a few patterns Go accepts (`\pL{1000}`).

use std::fmt::Write as _;

#[cfg(test)]
mod tests;
mod unicode_names;

/// The largest compiled program accepted, in bytes (Rust's default): the bound on what one
/// pattern costs to compile and hold.
pub const COMPILED_SIZE_LIMIT: usize = 10 << 20;

/// Go's `maxRepeat`: the largest count in `x{n,m}`, and of the product of nested counts.
const MAX_REPEAT: u32 = 1000;
/// Go's `maxHeight`.
const MAX_HEIGHT: usize = 1000;
/// Go's `maxSize`: 128 MiB of 40-byte instructions.
const MAX_SIZE: u64 = (128 << 20) / 40;

/// Why Go refuses a pattern, worded as Go words it (`error parsing regexp: CODE: `EXPR``).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("error parsing regexp: {code}: `{expr}`")]
pub struct GoRegexError {
    pub code: &'static str,
    pub expr: String,
}

const INVALID_CHAR_RANGE: &str = "invalid character class range";
const INVALID_ESCAPE: &str = "invalid escape sequence";
const INVALID_NAMED_CAPTURE: &str = "invalid named capture";
const INVALID_PERL_OP: &str = "invalid or unsupported Perl syntax";
const INVALID_REPEAT_OP: &str = "invalid nested repetition operator";
const INVALID_REPEAT_SIZE: &str = "invalid repeat count";
const MISSING_BRACKET: &str = "missing closing ]";
const MISSING_PAREN: &str = "missing closing )";
const MISSING_REPEAT_ARGUMENT: &str = "missing argument to repetition operator";
const TRAILING_BACKSLASH: &str = "trailing backslash at end of expression";
const UNEXPECTED_PAREN: &str = "unexpected )";
const NESTING_DEPTH: &str = "expression nests too deeply";
const LARGE: &str = "expression too large";
/// Not Go's: a pattern Go reads that Rust's engine still refuses (a Unicode name newer than
/// the `regex` crate's tables).
const UNSUPPORTED: &str = "not supported by helmop's regular expression engine";

fn err(code: &'static str, expr: &str) -> GoRegexError {
    GoRegexError {
        code,
        expr: expr.to_owned(),
    }
}

/// Compiles `pattern` as Go's `regexp.Compile("^(?:" + pattern + ")$")` would, for whole-value
/// matching.
pub fn compile_anchored(pattern: &str) -> Result<regex::Regex, GoRegexError> {
    let rust = translate(pattern)?;
    regex::RegexBuilder::new(&format!("^(?:{rust})$"))
        .size_limit(COMPILED_SIZE_LIMIT)
        // Go's height bound is checked above; the printed form nests deeper (a group around
        // each repeated operand), so Rust's own limit must not refuse first.
        .nest_limit(4 * MAX_HEIGHT as u32)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => err(LARGE, pattern),
            other => err(UNSUPPORTED, &other.to_string()),
        })
}

/// Parses `pattern` with Go's rules and prints it for Rust's `regex`.
pub fn translate(pattern: &str) -> Result<String, GoRegexError> {
    let node = Parser::new(pattern).parse()?;
    if height(&node) > MAX_HEIGHT {
        return Err(err(NESTING_DEPTH, pattern));
    }
    if size(&node) > MAX_SIZE {
        return Err(err(LARGE, pattern));
    }
    let mut out = String::with_capacity(pattern.len() * 2);
    print(&node, &mut out);
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RepeatOp {
    Star,
    Plus,
    Quest,
    /// `{min}`, `{min,}` (max `None`) or `{min,max}`.
    Counted(u32, Option<u32>),
}

#[derive(Debug)]
enum Node {
    Empty,
    Literal(char),
    /// A class already printed for Rust (`[...]`).
    Class(String),
    /// `.`, `^`, `$`, `\A`, `\z`, `\b`, `\B`, printed as given.
    Op(&'static str),
    /// A flag change for the rest of the group: what it sets and clears (Rust's letters).
    Flags(String),
    Group {
        capture: bool,
        sub: Box<Node>,
    },
    Concat(Vec<Node>),
    Alternate(Vec<Node>),
    Repeat {
        op: RepeatOp,
        non_greedy: bool,
        sub: Box<Node>,
    },
}

impl Node {
    fn is_pseudo(&self) -> bool {
        matches!(self, Node::Flags(_))
    }
}

/// One open group on the parse stack: the branches so far and the concatenation being built.
struct Frame {
    /// Whether the group captures (it counts in Go's size and height bounds).
    capture: bool,
    branches: Vec<Node>,
    items: Vec<Node>,
    /// The flags in force when the group opened (restored at `)`).
    saved: FlagState,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct FlagState {
    fold: bool,
    multi_line: bool,
    dot_nl: bool,
    non_greedy: bool,
}

struct Parser<'a> {
    whole: &'a str,
    flags: FlagState,
    stack: Vec<Frame>,
}

impl<'a> Parser<'a> {
    fn new(whole: &'a str) -> Self {
        Parser {
            whole,
            flags: FlagState::default(),
            stack: vec![Frame {
                capture: false,
                branches: Vec::new(),
                items: Vec::new(),
                saved: FlagState::default(),
            }],
        }
    }

    fn top(&mut self) -> &mut Frame {
        // The bottom frame is never popped (an unmatched `)` is an error), so the stack is
        // never empty while parsing.
        let last = self.stack.len() - 1;
        &mut self.stack[last]
    }

    fn push(&mut self, node: Node) {
        self.top().items.push(node);
    }

    fn parse(mut self) -> Result<Node, GoRegexError> {
        let mut t = self.whole;
        // The text of the previous repetition operator when the previous token was one:
        // Go refuses a repetition of a repetition written back to back (`a**`, `a{2}*`).
        let mut last_repeat: Option<&str> = None;
        while let Some(c) = t.chars().next() {
            let mut repeat = None;
            match c {
                '(' if t[1..].starts_with('?') => {
                    t = self.parse_perl_flags(t)?;
                }
                '(' => {
                    self.open(true);
                    t = &t[1..];
                }
                '|' => {
                    let frame = self.top();
                    let items = std::mem::take(&mut frame.items);
                    frame.branches.push(concat(items));
                    t = &t[1..];
                }
                ')' => {
                    self.close()?;
                    t = &t[1..];
                }
                '^' => {
                    self.push(Node::Op("^"));
                    t = &t[1..];
                }
                '$' => {
                    self.push(Node::Op("$"));
                    t = &t[1..];
                }
                '.' => {
                    self.push(Node::Op("."));
                    t = &t[1..];
                }
                '[' => {
                    let (class, rest) = self.parse_class(t)?;
                    self.push(Node::Class(class));
                    t = rest;
                }
                '*' | '+' | '?' => {
                    let op = match c {
                        '*' => RepeatOp::Star,
                        '+' => RepeatOp::Plus,
                        _ => RepeatOp::Quest,
                    };
                    let after = self.repeat(op, t, &t[1..], last_repeat)?;
                    repeat = Some(t);
                    t = after;
                }
                '{' => match parse_repeat(t) {
                    None => {
                        // Not a repeat: `{` is a literal.
                        self.push(Node::Literal('{'));
                        t = &t[1..];
                    }
                    Some((min, max, after)) => {
                        let limit = i64::from(MAX_REPEAT);
                        if min < 0 || min > limit || max > limit || (max >= 0 && min > max) {
                            return Err(err(INVALID_REPEAT_SIZE, &t[..t.len() - after.len()]));
                        }
                        // In range by the check above.
                        let op = RepeatOp::Counted(min as u32, u32::try_from(max).ok());
                        let after = self.repeat(op, t, after, last_repeat)?;
                        repeat = Some(t);
                        t = after;
                    }
                },
                '\\' => {
                    t = self.parse_backslash(t)?;
                }
                _ => {
                    self.push(Node::Literal(c));
                    t = &t[c.len_utf8()..];
                }
            }
            last_repeat = repeat;
        }
        if self.stack.len() > 1 {
            return Err(err(MISSING_PAREN, self.whole));
        }
        let mut frame = self.stack.pop().ok_or_else(|| err(MISSING_PAREN, ""))?;
        Ok(alternate(&mut frame))
    }

    fn open(&mut self, capture: bool) {
        let saved = self.flags;
        self.stack.push(Frame {
            capture,
            branches: Vec::new(),
            items: Vec::new(),
            saved,
        });
    }

    fn close(&mut self) -> Result<(), GoRegexError> {
        if self.stack.len() < 2 {
            return Err(err(UNEXPECTED_PAREN, self.whole));
        }
        let mut frame = self
            .stack
            .pop()
            .ok_or_else(|| err(UNEXPECTED_PAREN, self.whole))?;
        self.flags = frame.saved;
        let sub = alternate(&mut frame);
        self.push(Node::Group {
            capture: frame.capture,
            sub: Box::new(sub),
        });
        Ok(())
    }

    /// Go's `repeat`: applies `op` to the last item, refusing a missing operand and a
    /// repetition written right after another.
    fn repeat<'t>(
        &mut self,
        op: RepeatOp,
        before: &'t str,
        mut after: &'t str,
        last_repeat: Option<&str>,
    ) -> Result<&'t str, GoRegexError> {
        let mut non_greedy = false;
        if after.starts_with('?') {
            after = &after[1..];
            non_greedy = true;
        }
        if let Some(last) = last_repeat {
            return Err(err(INVALID_REPEAT_OP, &last[..last.len() - after.len()]));
        }
        let operator = &before[..before.len() - after.len()];
        let items = &mut self.top().items;
        // A flag change pushes nothing in Go, so the operand is the item before it.
        let Some(pos) = items.iter().rposition(|n| !n.is_pseudo()) else {
            return Err(err(MISSING_REPEAT_ARGUMENT, operator));
        };
        let sub = items.remove(pos);
        let node = Node::Repeat {
            op,
            non_greedy,
            sub: Box::new(sub),
        };
        // Go checks the product of nested counts as each counted repeat of 2 or more is made.
        if let RepeatOp::Counted(min, max) = op
            && (min >= 2 || max.is_some_and(|m| m >= 2))
            && !repeat_is_valid(&node, MAX_REPEAT)
        {
            return Err(err(INVALID_REPEAT_SIZE, operator));
        }
        items.insert(pos, node);
        Ok(after)
    }

    /// Go's `parsePerlFlags`: `(?P<name>`, `(?<name>`, `(?flags)`, `(?flags:`.
    fn parse_perl_flags<'t>(&mut self, s: &'t str) -> Result<&'t str, GoRegexError> {
        let t = s;
        let starts_with_p = t.len() > 4 && t[2..].starts_with("P<");
        let starts_with_name = t.len() > 3 && t[2..].starts_with('<');
        if starts_with_p || starts_with_name {
            let start = if starts_with_p { 4 } else { 3 };
            let Some(end) = t.find('>') else {
                return Err(err(INVALID_NAMED_CAPTURE, s));
            };
            let name = &t[start..end];
            if name.is_empty() || !name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) {
                return Err(err(INVALID_NAMED_CAPTURE, &t[..=end]));
            }
            self.open(true);
            return Ok(&t[end + 1..]);
        }
        let mut flags = self.flags;
        let mut negated = false;
        let mut saw_flag = false;
        let mut rest = &t[2..];
        while let Some(c) = rest.chars().next() {
            rest = &rest[c.len_utf8()..];
            let on = !negated;
            match c {
                'i' => flags.fold = on,
                'm' => flags.multi_line = on,
                's' => flags.dot_nl = on,
                'U' => flags.non_greedy = on,
                '-' if !negated => {
                    negated = true;
                    saw_flag = false;
                    continue;
                }
                ':' | ')' if !negated || saw_flag => {
                    let change = flag_change(self.flags, flags);
                    if c == ':' {
                        self.open(false);
                        if !change.is_empty() {
                            self.push(Node::Flags(change));
                        }
                    } else if !change.is_empty() {
                        self.push(Node::Flags(change));
                    }
                    self.flags = flags;
                    return Ok(rest);
                }
                _ => break,
            }
            saw_flag = true;
        }
        Err(err(INVALID_PERL_OP, &s[..s.len() - rest.len()]))
    }

    /// A `\` outside a class: assertions and `\Q...\E` first, then Unicode and Perl classes,
    /// then a single-character escape, in Go's order.
    fn parse_backslash<'t>(&mut self, t: &'t str) -> Result<&'t str, GoRegexError> {
        let next = t[1..].chars().next();
        match next {
            Some('A') => return Ok(self.op("\\A", t)),
            Some('b') => return Ok(self.op("(?-u:\\b)", t)),
            Some('B') => return Ok(self.op("(?-u:\\B)", t)),
            Some('z') => return Ok(self.op("\\z", t)),
            Some('C') => return Err(err(INVALID_ESCAPE, &t[..2])),
            Some('Q') => {
                let body = &t[2..];
                let (lit, rest) = match body.find("\\E") {
                    Some(i) => (&body[..i], &body[i + 2..]),
                    None => (body, ""),
                };
                for c in lit.chars() {
                    self.push(Node::Literal(c));
                }
                return Ok(rest);
            }
            _ => {}
        }
        if let Some((class, rest)) = parse_unicode_class(t)? {
            self.push(Node::Class(format!("[{class}]")));
            return Ok(rest);
        }
        if let Some((class, rest)) = parse_perl_class(t) {
            self.push(Node::Class(format!("[{class}]")));
            return Ok(rest);
        }
        let (c, rest) = parse_escape(t)?;
        self.push(Node::Literal(c));
        Ok(rest)
    }

    fn op<'t>(&mut self, printed: &'static str, t: &'t str) -> &'t str {
        self.push(Node::Op(printed));
        &t[2..]
    }

    /// Go's `parseClass`: the class printed as Rust class items inside `[...]`.
    fn parse_class<'t>(&self, s: &'t str) -> Result<(String, &'t str), GoRegexError> {
        let mut t = &s[1..];
        let mut out = String::from("[");
        if t.starts_with('^') {
            out.push('^');
            t = &t[1..];
        }
        let mut first = true;
        loop {
            if t.is_empty() {
                return Err(err(MISSING_BRACKET, s));
            }
            if t.starts_with(']') && !first {
                break;
            }
            first = false;
            if t.len() > 2
                && t.starts_with("[:")
                && let Some((item, rest)) = parse_named_class(t)?
            {
                out.push_str(&item);
                t = rest;
                continue;
            }
            if let Some((item, rest)) = parse_unicode_class(t)? {
                out.push_str(&item);
                t = rest;
                continue;
            }
            if let Some((item, rest)) = parse_perl_class(t) {
                out.push_str(&item);
                t = rest;
                continue;
            }
            let range_start = t;
            let (lo, rest) = parse_class_char(t, s)?;
            t = rest;
            let mut hi = lo;
            // `[a-]` means a or -: a range needs something other than `]` after the `-`.
            if t.len() >= 2 && t.starts_with('-') && !t[1..].starts_with(']') {
                let (h, rest) = parse_class_char(&t[1..], s)?;
                t = rest;
                hi = h;
                if hi < lo {
                    let text = &range_start[..range_start.len() - t.len()];
                    return Err(err(INVALID_CHAR_RANGE, text));
                }
            }
            push_hex(&mut out, lo);
            if hi != lo {
                out.push('-');
                push_hex(&mut out, hi);
            }
        }
        out.push(']');
        Ok((out, &t[1..]))
    }
}

/// What changed between two flag states, as Rust flag letters (`i-s`), each once.
fn flag_change(from: FlagState, to: FlagState) -> String {
    let pairs = [
        ('i', from.fold, to.fold),
        ('m', from.multi_line, to.multi_line),
        ('s', from.dot_nl, to.dot_nl),
        ('U', from.non_greedy, to.non_greedy),
    ];
    let set: String = pairs
        .iter()
        .filter(|(_, a, b)| !a && *b)
        .map(|p| p.0)
        .collect();
    let cleared: String = pairs
        .iter()
        .filter(|(_, a, b)| *a && !b)
        .map(|p| p.0)
        .collect();
    match (set.is_empty(), cleared.is_empty()) {
        (true, true) => String::new(),
        (_, true) => set,
        _ => format!("{set}-{cleared}"),
    }
}

fn concat(mut items: Vec<Node>) -> Node {
    match items.len() {
        0 => Node::Empty,
        1 => items.pop().unwrap_or(Node::Empty),
        _ => Node::Concat(items),
    }
}

fn alternate(frame: &mut Frame) -> Node {
    let items = std::mem::take(&mut frame.items);
    let mut branches = std::mem::take(&mut frame.branches);
    if branches.is_empty() {
        return concat(items);
    }
    branches.push(concat(items));
    Node::Alternate(branches)
}

/// Go's `parseRepeat`: `{min}`, `{min,}` or `{min,max}` with no leading zeros, as
/// `(min, max, rest)` with max -1 for no upper bound and min -1 for a number too big to read.
/// `None` when the text is not of that form (then `{` is a literal).
fn parse_repeat(s: &str) -> Option<(i64, i64, &str)> {
    let t = s.strip_prefix('{')?;
    let (mut min, t) = parse_int(t)?;
    let (max, t) = match t.strip_prefix(',') {
        None => (min, t),
        Some(t) if t.starts_with('}') => (-1, t),
        Some(t) => {
            let (max, t) = parse_int(t)?;
            if max < 0 {
                min = -1;
            }
            (max, t)
        }
    };
    Some((min, max, t.strip_prefix('}')?))
}

/// Go's `parseInt`: decimal digits, no leading zero; -1 when the number reaches 1e8.
fn parse_int(s: &str) -> Option<(i64, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || (digits >= 2 && s.starts_with('0')) {
        return None;
    }
    let mut n: i64 = 0;
    for b in s[..digits].bytes() {
        if n >= 100_000_000 {
            n = -1;
            break;
        }
        n = n * 10 + i64::from(b - b'0');
    }
    Some((n, &s[digits..]))
}

/// Go's `parseEscape`: one character.
fn parse_escape(s: &str) -> Result<(char, &str), GoRegexError> {
    let t = &s[1..];
    let Some(c) = t.chars().next() else {
        return Err(err(TRAILING_BACKSLASH, ""));
    };
    let mut t = &t[c.len_utf8()..];
    let invalid = |t: &str| err(INVALID_ESCAPE, &s[..s.len() - t.len()]);
    let octal = |b: u8| (b'0'..=b'7').contains(&b);
    match c {
        '1'..='7' if !t.bytes().next().is_some_and(octal) => Err(invalid(t)),
        '0'..='7' => {
            // Up to three octal digits; a single non-zero digit would be a backreference.
            let mut r = c as u32 - '0' as u32;
            for _ in 1..3 {
                match t.bytes().next() {
                    Some(b) if octal(b) => {
                        r = r * 8 + u32::from(b - b'0');
                        t = &t[1..];
                    }
                    _ => break,
                }
            }
            char::from_u32(r).map(|c| (c, t)).ok_or_else(|| invalid(t))
        }
        'x' => {
            let Some(c) = t.chars().next() else {
                return Err(invalid(t));
            };
            t = &t[c.len_utf8()..];
            if c == '{' {
                let Some(end) = t.find('}') else {
                    return Err(invalid(""));
                };
                let hex = &t[..end];
                let value = (!hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()))
                    .then(|| u32::from_str_radix(hex, 16).ok())
                    .flatten()
                    .filter(|v| *v <= 0x10FFFF);
                let Some(v) = value else {
                    return Err(invalid(&t[end + 1..]));
                };
                // Go accepts a surrogate code point; no UTF-8 string holds one, so the escape
                // matches nothing: U+FFFD stands in for it only if a value could hold it, and
                // JSON strings cannot.
                return Ok((char::from_u32(v).unwrap_or('\u{FFFD}'), &t[end + 1..]));
            }
            let Some(d) = t.chars().next() else {
                return Err(invalid(t));
            };
            t = &t[d.len_utf8()..];
            match (c.to_digit(16), d.to_digit(16)) {
                (Some(x), Some(y)) => char::from_u32(x * 16 + y)
                    .map(|c| (c, t))
                    .ok_or_else(|| invalid(t)),
                _ => Err(invalid(t)),
            }
        }
        'a' => Ok(('\u{7}', t)),
        'f' => Ok(('\u{c}', t)),
        'n' => Ok(('\n', t)),
        'r' => Ok(('\r', t)),
        't' => Ok(('\t', t)),
        'v' => Ok(('\u{b}', t)),
        // Escaped ASCII punctuation is itself (`\_` too); an escaped letter or digit that is
        // none of the above is refused.
        c if c.is_ascii() && !c.is_ascii_alphanumeric() => Ok((c, t)),
        _ => Err(invalid(t)),
    }
}

/// Go's `parseClassChar`.
fn parse_class_char<'t>(s: &'t str, whole: &str) -> Result<(char, &'t str), GoRegexError> {
    match s.chars().next() {
        None => Err(err(MISSING_BRACKET, whole)),
        Some('\\') => parse_escape(s),
        Some(c) => Ok((c, &s[c.len_utf8()..])),
    }
}

/// Go's Perl classes (`perl_groups.go`): ASCII only.
fn parse_perl_class(s: &str) -> Option<(String, &str)> {
    let name = s.strip_prefix('\\')?.chars().next()?;
    let (set, negated) = match name {
        'd' => ("0-9", false),
        'D' => ("0-9", true),
        's' => (r"\t\n\x0C\r ", false),
        'S' => (r"\t\n\x0C\r ", true),
        'w' => ("0-9A-Za-z_", false),
        'W' => ("0-9A-Za-z_", true),
        _ => return None,
    };
    let item = if negated {
        format!("[^{set}]")
    } else {
        set.to_owned()
    };
    Some((item, &s[2..]))
}

/// Go's `parseNamedClass`: `[:alpha:]` and `[:^alpha:]`, ASCII, the same in Rust.
fn parse_named_class(s: &str) -> Result<Option<(String, &str)>, GoRegexError> {
    let Some(i) = s[2..].find(":]") else {
        return Ok(None);
    };
    let whole = &s[..i + 4];
    let name = &s[2..i + 2];
    const POSIX: [&str; 14] = [
        "alnum", "alpha", "ascii", "blank", "cntrl", "digit", "graph", "lower", "print", "punct",
        "space", "upper", "word", "xdigit",
    ];
    if POSIX.contains(&name.strip_prefix('^').unwrap_or(name)) {
        Ok(Some((whole.to_owned(), &s[i + 4..])))
    } else {
        Err(err(INVALID_CHAR_RANGE, whole))
    }
}

/// Go's `parseUnicodeClass`: `\pL`, `\p{Greek}`, `\P{...}`, `\p{^...}`, printed as a Rust class
/// item. Names are looked up as Go does: case, spaces, `_` and `-` ignored, among the
/// categories, their aliases, the scripts, `Any`, `Assigned`, `ASCII` and `LC`.
fn parse_unicode_class(s: &str) -> Result<Option<(String, &str)>, GoRegexError> {
    let Some(kind @ ('p' | 'P')) = s.strip_prefix('\\').and_then(|t| t.chars().next()) else {
        return Ok(None);
    };
    let mut negated = kind == 'P';
    let t = &s[2..];
    let (seq, mut name, rest) = match t.chars().next() {
        Some('{') => {
            let Some(end) = s.find('}') else {
                return Err(err(INVALID_CHAR_RANGE, s));
            };
            (&s[..=end], &s[3..end], &s[end + 1..])
        }
        Some(c) => (
            &s[..2 + c.len_utf8()],
            &t[..c.len_utf8()],
            &t[c.len_utf8()..],
        ),
        None => (s, "", ""),
    };
    if let Some(n) = name.strip_prefix('^') {
        negated = !negated;
        name = n;
    }
    let canonical = canonical_name(name);
    if canonical == "Cs" || canonical == "Surrogate" {
        // Surrogates never occur in UTF-8 text, which Rust's regex refuses to name.
        let item = if negated {
            r"\x{0}-\x{10FFFF}"
        } else {
            r"[^\x{0}-\x{10FFFF}]"
        };
        return Ok(Some((item.to_owned(), rest)));
    }
    if !unicode_names::is_known(&canonical) {
        return Err(err(INVALID_CHAR_RANGE, seq));
    }
    let p = if negated { 'P' } else { 'p' };
    Ok(Some((format!("\\{p}{{{canonical}}}"), rest)))
}

/// Go's `canonicalName`: first letter upper, the rest lower, no spaces, `_` or `-`.
fn canonical_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars().filter(|c| !matches!(c, '_' | '-' | ' ')) {
        if out.is_empty() {
            out.push(c.to_ascii_uppercase());
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

fn push_hex(out: &mut String, c: char) {
    // Writing to a String cannot fail.
    let _ = write!(out, "\\x{{{:X}}}", c as u32);
}

fn print(node: &Node, out: &mut String) {
    match node {
        Node::Empty => out.push_str("(?:)"),
        Node::Literal(c) if c.is_ascii_alphanumeric() => out.push(*c),
        Node::Literal(c) => push_hex(out, *c),
        Node::Class(class) => out.push_str(class),
        Node::Op(op) => out.push_str(op),
        Node::Flags(change) => {
            out.push_str("(?");
            out.push_str(change);
            out.push(')');
        }
        Node::Group { sub, .. } => {
            out.push_str("(?:");
            print(sub, out);
            out.push(')');
        }
        Node::Concat(items) => items.iter().for_each(|n| print(n, out)),
        Node::Alternate(branches) => {
            for (i, b) in branches.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                print(b, out);
            }
        }
        Node::Repeat {
            op,
            non_greedy,
            sub,
        } => {
            out.push_str("(?:");
            print(sub, out);
            out.push(')');
            match op {
                RepeatOp::Star => out.push('*'),
                RepeatOp::Plus => out.push('+'),
                RepeatOp::Quest => out.push('?'),
                RepeatOp::Counted(min, None) => {
                    let _ = write!(out, "{{{min},}}");
                }
                RepeatOp::Counted(min, Some(max)) => {
                    let _ = write!(out, "{{{min},{max}}}");
                }
            }
            if *non_greedy {
                out.push('?');
            }
        }
    }
}

/// Go's `repeatIsValid`: nested counted repeats multiply, and the product stays within `n`.
fn repeat_is_valid(node: &Node, mut n: u32) -> bool {
    if let Node::Repeat {
        op: RepeatOp::Counted(min, max),
        ..
    } = node
    {
        let m = max.unwrap_or(*min);
        if m == 0 {
            return true;
        }
        if m > n {
            return false;
        }
        n /= m;
    }
    children(node).iter().all(|c| repeat_is_valid(c, n))
}

fn children(node: &Node) -> Vec<&Node> {
    match node {
        Node::Group { sub, .. } | Node::Repeat { sub, .. } => vec![sub],
        Node::Concat(items) | Node::Alternate(items) => items.iter().collect(),
        _ => Vec::new(),
    }
}

/// The height of Go's tree: a non-capturing group adds no node there, and a run of literals
/// is one node.
fn height(node: &Node) -> usize {
    let below = children(node).into_iter().map(height).max().unwrap_or(0);
    match node {
        Node::Group { capture: false, .. } => below,
        Node::Concat(items) if items.iter().all(|n| matches!(n, Node::Literal(_))) => 1,
        _ => below + 1,
    }
}

/// Go's `calcSize`: the instructions the compiled program needs.
fn size(node: &Node) -> u64 {
    let s = match node {
        Node::Literal(_) => 1,
        Node::Group { capture: true, sub } => 2 + size(sub),
        Node::Group {
            capture: false,
            sub,
        } => size(sub),
        Node::Concat(items) => items.iter().map(size).sum(),
        Node::Alternate(items) => {
            items.iter().map(size).sum::<u64>() + items.len().saturating_sub(1) as u64
        }
        Node::Repeat { op, sub, .. } => {
            let sub = size(sub);
            match op {
                RepeatOp::Star => 2 + sub,
                RepeatOp::Plus | RepeatOp::Quest => 1 + sub,
                RepeatOp::Counted(0, None) => 2 + sub,
                RepeatOp::Counted(min, None) => 1 + u64::from(*min) * sub,
                RepeatOp::Counted(min, Some(max)) => u64::from(*max) * sub + u64::from(max - min),
            }
        }
        // A flag change is no node in Go's tree.
        Node::Flags(_) => return 0,
        _ => 0,
    };
    s.max(1)
}

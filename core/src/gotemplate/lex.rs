//! Go `text/template`'s lexer (Go's `text/template/parse/lex.go` of go1.26, behaviour only), for
//! the delimiters Fleet uses for helm values (`${` and `}`) or any others (Go's own `{{` `}}`, which
//! its test tables use).

/// Left and right delimiters Fleet sets with `Delims("${", "}")`.
pub const LEFT_DELIM: &str = "${";
pub const RIGHT_DELIM: &str = "}";
const LEFT_COMMENT: &str = "/*";
const RIGHT_COMMENT: &str = "*/";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemType {
    Error,
    Bool,
    Char,
    CharConstant,
    Comment,
    Assign,
    Declare,
    Eof,
    Field,
    Identifier,
    LeftDelim,
    LeftParen,
    Number,
    Pipe,
    RawString,
    RightDelim,
    RightParen,
    Space,
    String,
    Text,
    Variable,
    // Keywords (Go prints them as `<word>`).
    Block,
    Break,
    Continue,
    Dot,
    Define,
    Else,
    End,
    If,
    Nil,
    Range,
    Template,
    With,
}

impl ItemType {
    fn is_keyword(self) -> bool {
        matches!(
            self,
            ItemType::Block
                | ItemType::Break
                | ItemType::Continue
                | ItemType::Dot
                | ItemType::Define
                | ItemType::Else
                | ItemType::End
                | ItemType::If
                | ItemType::Nil
                | ItemType::Range
                | ItemType::Template
                | ItemType::With
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub typ: ItemType,
    /// Byte offset in the input.
    pub pos: usize,
    pub val: String,
    /// 1-based line the item starts on.
    pub line: usize,
}

impl std::fmt::Display for Item {
    /// Go's `item.String`, which its parser puts in "unexpected ..." messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.typ {
            ItemType::Eof => write!(f, "EOF"),
            ItemType::Error => write!(f, "{}", self.val),
            t if t.is_keyword() => write!(f, "<{}>", self.val),
            _ if self.val.chars().count() > 10 => {
                let head: String = self.val.chars().take(10).collect();
                write!(f, "{}...", go_quote(&head))
            }
            _ => write!(f, "{}", go_quote(&self.val)),
        }
    }
}

/// Go's `%q` for a string (strconv.Quote): printable runes as they are, the rest escaped.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%#U` for a rune: `U+0041 'A'`.
fn go_rune(r: char) -> String {
    if r.is_control() {
        format!("U+{:04X}", r as u32)
    } else {
        format!("U+{:04X} '{r}'", r as u32)
    }
}

fn is_space(r: char) -> bool {
    matches!(r, ' ' | '\t' | '\r' | '\n')
}

fn is_alphanumeric(r: char) -> bool {
    r == '_' || r.is_alphabetic() || r.is_numeric()
}

fn has_left_trim_marker(s: &str) -> bool {
    let mut it = s.chars();
    it.next() == Some('-') && it.next().is_some_and(is_space)
}

fn has_right_trim_marker(s: &str) -> bool {
    let mut it = s.chars();
    it.next().is_some_and(is_space) && it.next() == Some('-')
}

struct Lexer<'a> {
    input: &'a str,
    left: &'a str,
    right: &'a str,
    pos: usize,
    start: usize,
    line: usize,
    start_line: usize,
    paren_depth: i64,
    items: Vec<Item>,
}

/// Lexes the whole input with Fleet's delimiters; the last item is `Eof` or `Error`.
pub fn lex(input: &str) -> Vec<Item> {
    lex_with(input, LEFT_DELIM, RIGHT_DELIM)
}

/// Lexes the whole input with the delimiters `left` and `right` (Go's `Delims`; empty means
/// Go's default `{{` `}}`).
pub fn lex_with(input: &str, left: &str, right: &str) -> Vec<Item> {
    let left = if left.is_empty() { "{{" } else { left };
    let right = if right.is_empty() { "}}" } else { right };
    let mut l = Lexer {
        input,
        left,
        right,
        pos: 0,
        start: 0,
        line: 1,
        start_line: 1,
        paren_depth: 0,
        items: Vec::new(),
    };
    l.run();
    l.items
}

#[derive(Clone, Copy)]
enum State {
    Text,
    LeftDelim,
    InsideAction,
    Done,
}

impl<'a> Lexer<'a> {
    fn run(&mut self) {
        let mut state = State::Text;
        loop {
            state = match state {
                State::Text => self.lex_text(),
                State::LeftDelim => self.lex_left_delim(),
                State::InsideAction => self.lex_inside_action(),
                State::Done => return,
            };
        }
    }

    fn rest(&self) -> &'a str {
        &self.input[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn next(&mut self) -> Option<char> {
        let r = self.peek()?;
        self.pos += r.len_utf8();
        if r == '\n' {
            self.line += 1;
        }
        Some(r)
    }

    /// Steps back over the last rune read (only called after a successful `next`).
    fn backup(&mut self) {
        if let Some(r) = self.input[..self.pos].chars().next_back() {
            self.pos -= r.len_utf8();
            if r == '\n' {
                self.line -= 1;
            }
        }
    }

    fn emit(&mut self, typ: ItemType) {
        let val = self.input[self.start..self.pos].to_string();
        self.items.push(Item {
            typ,
            pos: self.start,
            val,
            line: self.start_line,
        });
        self.start = self.pos;
        self.start_line = self.line;
    }

    /// Drops the input since the last item (`line` always tracks `pos`).
    fn ignore(&mut self) {
        self.start = self.pos;
        self.start_line = self.line;
    }

    fn errorf(&mut self, message: String) -> State {
        self.items.push(Item {
            typ: ItemType::Error,
            pos: self.start,
            val: message,
            line: self.start_line,
        });
        State::Done
    }

    /// Moves `pos` to `to` counting the newlines passed.
    fn advance_to(&mut self, to: usize) {
        self.line += self.input[self.pos..to].matches('\n').count();
        self.pos = to;
    }

    fn lex_text(&mut self) -> State {
        if let Some(x) = self.rest().find(self.left) {
            let mut trim_len = 0;
            let after = self.pos + x + self.left.len();
            if has_left_trim_marker(&self.input[after..]) {
                let text = &self.input[self.pos..self.pos + x];
                trim_len = text.len() - text.trim_end_matches(is_space).len();
            }
            self.advance_to(self.pos + x);
            let text_end = self.pos - trim_len;
            if text_end > self.start {
                self.items.push(Item {
                    typ: ItemType::Text,
                    pos: self.start,
                    val: self.input[self.start..text_end].to_string(),
                    line: self.start_line,
                });
            }
            self.ignore();
            return State::LeftDelim;
        }
        let end = self.input.len();
        self.advance_to(end);
        if self.pos > self.start {
            self.emit(ItemType::Text);
        }
        self.emit(ItemType::Eof);
        State::Done
    }

    /// At the right delimiter (optionally with its trim marker): (found, trim).
    fn at_right_delim(&self) -> (bool, bool) {
        let rest = self.rest();
        if has_right_trim_marker(rest) && rest[2..].starts_with(self.right) {
            return (true, true);
        }
        (rest.starts_with(self.right), false)
    }

    fn lex_left_delim(&mut self) -> State {
        self.advance_to(self.pos + self.left.len());
        let trim = has_left_trim_marker(self.rest());
        let after_marker = if trim { 2 } else { 0 };
        if self.rest()[after_marker..].starts_with(LEFT_COMMENT) {
            self.advance_to(self.pos + after_marker);
            self.ignore();
            return self.lex_comment();
        }
        self.emit(ItemType::LeftDelim);
        self.advance_to(self.pos + after_marker);
        self.ignore();
        self.paren_depth = 0;
        State::InsideAction
    }

    fn lex_comment(&mut self) -> State {
        self.advance_to(self.pos + LEFT_COMMENT.len());
        let Some(x) = self.rest().find(RIGHT_COMMENT) else {
            return self.errorf("unclosed comment".into());
        };
        self.advance_to(self.pos + x + RIGHT_COMMENT.len());
        let (delim, trim) = self.at_right_delim();
        if !delim {
            return self.errorf("comment ends before closing delimiter".into());
        }
        self.emit(ItemType::Comment);
        if trim {
            self.advance_to(self.pos + 2);
        }
        self.advance_to(self.pos + self.right.len());
        if trim {
            self.skip_leading_space();
        }
        self.ignore();
        State::Text
    }

    fn skip_leading_space(&mut self) {
        let n = self.rest().len() - self.rest().trim_start_matches(is_space).len();
        self.advance_to(self.pos + n);
    }

    fn lex_right_delim(&mut self, trim: bool) -> State {
        if trim {
            self.advance_to(self.pos + 2);
            self.ignore();
        }
        self.advance_to(self.pos + self.right.len());
        self.emit(ItemType::RightDelim);
        if trim {
            self.skip_leading_space();
            self.ignore();
        }
        State::Text
    }

    fn lex_inside_action(&mut self) -> State {
        let (delim, trim) = self.at_right_delim();
        if delim {
            if self.paren_depth == 0 {
                return self.lex_right_delim(trim);
            }
            return self.errorf("unclosed left paren".into());
        }
        let Some(r) = self.next() else {
            return self.errorf("unclosed action".into());
        };
        match r {
            r if is_space(r) => {
                self.backup();
                return self.lex_space();
            }
            '=' => self.emit(ItemType::Assign),
            ':' => {
                if self.next() != Some('=') {
                    return self.errorf("expected :=".into());
                }
                self.emit(ItemType::Declare);
            }
            '|' => self.emit(ItemType::Pipe),
            '"' => return self.lex_quote(),
            '`' => return self.lex_raw_quote(),
            '$' => return self.lex_field_or_variable(ItemType::Variable),
            '\'' => return self.lex_char(),
            '.' if self.peek().is_some_and(|c| !c.is_ascii_digit()) => {
                return self.lex_field_or_variable(ItemType::Field);
            }
            '.' | '+' | '-' | '0'..='9' => {
                self.backup();
                return self.lex_number();
            }
            r if is_alphanumeric(r) => {
                self.backup();
                return self.lex_identifier();
            }
            '(' => {
                self.emit(ItemType::LeftParen);
                self.paren_depth += 1;
            }
            ')' => {
                self.emit(ItemType::RightParen);
                self.paren_depth -= 1;
                if self.paren_depth < 0 {
                    return self.errorf("unexpected right paren".into());
                }
            }
            r if r.is_ascii() && !r.is_ascii_control() => self.emit(ItemType::Char),
            r => return self.errorf(format!("unrecognized character in action: {}", go_rune(r))),
        }
        State::InsideAction
    }

    fn lex_space(&mut self) -> State {
        let mut spaces = 0;
        while self.peek().is_some_and(is_space) {
            self.next();
            spaces += 1;
        }
        // A space followed by "-}" belongs to the trim-marked closing delimiter.
        if has_right_trim_marker(&self.input[self.pos - 1..])
            && self.input[self.pos + 1..].starts_with(self.right)
        {
            self.backup();
            if spaces == 1 {
                return State::InsideAction;
            }
        }
        self.emit(ItemType::Space);
        State::InsideAction
    }

    fn lex_identifier(&mut self) -> State {
        while self.peek().is_some_and(is_alphanumeric) {
            self.next();
        }
        if !self.at_terminator() {
            let r = self.peek().unwrap_or(' ');
            return self.errorf(format!("bad character {}", go_rune(r)));
        }
        let word = &self.input[self.start..self.pos];
        let typ = match word {
            "block" => ItemType::Block,
            "break" => ItemType::Break,
            "continue" => ItemType::Continue,
            "define" => ItemType::Define,
            "else" => ItemType::Else,
            "end" => ItemType::End,
            "if" => ItemType::If,
            "range" => ItemType::Range,
            "nil" => ItemType::Nil,
            "template" => ItemType::Template,
            "with" => ItemType::With,
            "true" | "false" => ItemType::Bool,
            _ => ItemType::Identifier,
        };
        self.emit(typ);
        State::InsideAction
    }

    fn lex_field_or_variable(&mut self, typ: ItemType) -> State {
        if self.at_terminator() {
            self.emit(if typ == ItemType::Variable {
                ItemType::Variable
            } else {
                ItemType::Dot
            });
            return State::InsideAction;
        }
        while self.peek().is_some_and(is_alphanumeric) {
            self.next();
        }
        if !self.at_terminator() {
            let r = self.peek().unwrap_or(' ');
            return self.errorf(format!("bad character {}", go_rune(r)));
        }
        self.emit(typ);
        State::InsideAction
    }

    fn at_terminator(&self) -> bool {
        match self.peek() {
            None => true,
            Some(r) if is_space(r) => true,
            Some('.' | ',' | '|' | ':' | ')' | '(') => true,
            Some(_) => self.rest().starts_with(self.right),
        }
    }

    fn lex_char(&mut self) -> State {
        loop {
            match self.next() {
                Some('\\') => {
                    if matches!(self.next(), None | Some('\n')) {
                        return self.errorf("unterminated character constant".into());
                    }
                }
                None | Some('\n') => {
                    return self.errorf("unterminated character constant".into());
                }
                Some('\'') => break,
                Some(_) => {}
            }
        }
        self.emit(ItemType::CharConstant);
        State::InsideAction
    }

    fn lex_number(&mut self) -> State {
        if !self.scan_number() {
            let text = self.input[self.start..self.pos].to_string();
            return self.errorf(format!("bad number syntax: {}", go_quote(&text)));
        }
        // Complex numbers (`1+2i`) are numbers too.
        if matches!(self.peek(), Some('+' | '-'))
            && (!self.scan_number() || !self.input[..self.pos].ends_with('i'))
        {
            let text = self.input[self.start..self.pos].to_string();
            return self.errorf(format!("bad number syntax: {}", go_quote(&text)));
        }
        self.emit(ItemType::Number);
        State::InsideAction
    }

    fn accept(&mut self, valid: &str) -> bool {
        if self.peek().is_some_and(|c| valid.contains(c)) {
            self.next();
            return true;
        }
        false
    }

    fn accept_run(&mut self, valid: &str) {
        while self.accept(valid) {}
    }

    fn scan_number(&mut self) -> bool {
        self.accept("+-");
        let mut digits = "0123456789_";
        if self.accept("0") {
            if self.accept("xX") {
                digits = "0123456789abcdefABCDEF_";
            } else if self.accept("oO") {
                digits = "01234567_";
            } else if self.accept("bB") {
                digits = "01_";
            }
        }
        self.accept_run(digits);
        if self.accept(".") {
            self.accept_run(digits);
        }
        if digits.len() == 11 && self.accept("eE") {
            self.accept("+-");
            self.accept_run("0123456789_");
        }
        if digits.len() == 23 && self.accept("pP") {
            self.accept("+-");
            self.accept_run("0123456789_");
        }
        self.accept("i");
        !self.peek().is_some_and(is_alphanumeric) || {
            // Go consumes the offending rune so the message shows it.
            self.next();
            false
        }
    }

    fn lex_quote(&mut self) -> State {
        loop {
            match self.next() {
                Some('\\') => {
                    if matches!(self.next(), None | Some('\n')) {
                        return self.errorf("unterminated quoted string".into());
                    }
                }
                None | Some('\n') => return self.errorf("unterminated quoted string".into()),
                Some('"') => break,
                Some(_) => {}
            }
        }
        self.emit(ItemType::String);
        State::InsideAction
    }

    fn lex_raw_quote(&mut self) -> State {
        let Some(x) = self.rest().find('`') else {
            return self.errorf("unterminated raw quoted string".into());
        };
        self.advance_to(self.pos + x + 1);
        self.emit(ItemType::RawString);
        State::InsideAction
    }
}

//! Go `text/template`'s parser (behaviour of Go's `text/template/parse/parse.go` of go1.26, the
//! toolchain Fleet v0.16.1 builds with): accepts what Go accepts and refuses what it refuses, with
//! Go's messages, for one template named like Fleet's (`values`). Functions are checked against
//! Fleet's function map at parse time, as Go does. [`parse_with`] takes other delimiters and
//! another function map (Go's own test tables use `{{ }}` and theirs).

use std::collections::BTreeMap;

use super::funcs::is_defined;
use super::lex::{Item, ItemType, LEFT_DELIM, RIGHT_DELIM, go_quote, lex_with};

/// Deepest nesting of parenthesised pipelines and control structures we parse. Go allows
/// 10000; beyond ours the template is reported as too deep (callers treat that as unknown,
/// never as a refusal).
pub const MAX_DEPTH: usize = 200;

#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Text(String),
    Action(Pipe),
    If(Control),
    Range(Control),
    With(Control),
    Template {
        name: String,
        pipe: Option<Pipe>,
        pos: usize,
    },
    Break,
    Continue,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Control {
    pub pipe: Pipe,
    pub list: Vec<Node>,
    /// `None` without `{{else}}` (Go's nil `ElseList`). `{{else if ...}}` and
    /// `{{else with ...}}` are an else list holding one `if`/`with` that shares the outer `end`.
    pub else_list: Option<Vec<Node>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pipe {
    pub pos: usize,
    pub decl: Vec<String>,
    pub is_assign: bool,
    pub cmds: Vec<Cmd>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Cmd {
    pub pos: usize,
    pub args: Vec<Arg>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// `.A.B`: names without dots.
    Field {
        pos: usize,
        names: Vec<String>,
    },
    /// `$x.A.B`: `name` includes the `$`.
    Variable {
        pos: usize,
        name: String,
        fields: Vec<String>,
    },
    Dot {
        pos: usize,
    },
    Nil {
        pos: usize,
    },
    Bool {
        pos: usize,
        value: bool,
    },
    Number {
        pos: usize,
        text: String,
        value: Number,
    },
    /// A string constant: `quoted` as written (Go prints that), `value` unquoted.
    Str {
        pos: usize,
        quoted: String,
        value: String,
    },
    Ident {
        pos: usize,
        name: String,
    },
    Pipe(Box<Pipe>),
    /// `(pipeline).A.B`, positioned at the first chained field.
    Chain {
        pos: usize,
        node: Box<Arg>,
        fields: Vec<String>,
    },
}

impl Arg {
    /// Byte offset of the node in the template (Go's `Position()`).
    pub fn pos(&self) -> usize {
        match self {
            Arg::Field { pos, .. }
            | Arg::Variable { pos, .. }
            | Arg::Dot { pos }
            | Arg::Nil { pos }
            | Arg::Bool { pos, .. }
            | Arg::Number { pos, .. }
            | Arg::Str { pos, .. }
            | Arg::Ident { pos, .. }
            | Arg::Chain { pos, .. } => *pos,
            Arg::Pipe(p) => p.pos,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    Int(i64),
    Float(f64),
    /// Complex or out of range for both: valid Go, outside what we evaluate.
    Other,
}

/// A parsed template: the main tree and the ones `define`/`block` named.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub text: String,
    pub root: Vec<Node>,
    pub defines: BTreeMap<String, Vec<Node>>,
}

/// Why Go would refuse the text (`message` is Go's, with `template: NAME:LINE:` in front).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub message: String,
    pub line: usize,
    /// The text nests deeper than [`MAX_DEPTH`]: not a refusal Go would make.
    pub too_deep: bool,
}

/// What a template is parsed with besides its text: Go's `Delims` and the function map its
/// parser checks identifiers against.
#[derive(Clone, Copy)]
pub struct Syntax<'a> {
    pub left: &'a str,
    pub right: &'a str,
    pub is_function: &'a dyn Fn(&str) -> bool,
}

/// Fleet's: `${` `}` and Go's builtins plus Sprig's functions minus the ones Fleet deletes.
pub const FLEET: Syntax<'static> = Syntax {
    left: LEFT_DELIM,
    right: RIGHT_DELIM,
    is_function: &is_defined,
};

struct Parser<'a> {
    name: &'a str,
    is_function: &'a dyn Fn(&str) -> bool,
    items: Vec<Item>,
    i: usize,
    vars: Vec<String>,
    range_depth: usize,
    action_line: usize,
    depth: usize,
    defines: BTreeMap<String, Vec<Node>>,
    last_line: usize,
}

type PResult<T> = Result<T, ParseError>;

/// Parses `text` as template `name` with Fleet's delimiters and functions.
pub fn parse(name: &str, text: &str) -> Result<Template, ParseError> {
    parse_with(name, text, FLEET)
}

/// Parses `text` as template `name` with `syntax`'s delimiters and functions.
pub fn parse_with(name: &str, text: &str, syntax: Syntax<'_>) -> Result<Template, ParseError> {
    let items: Vec<Item> = lex_with(text, syntax.left, syntax.right)
        .into_iter()
        // The parser skips comments (Go drops them without ParseComments).
        .filter(|i| i.typ != ItemType::Comment)
        .collect();
    let mut p = Parser {
        name,
        is_function: syntax.is_function,
        items,
        i: 0,
        vars: vec!["$".to_string()],
        range_depth: 0,
        action_line: 0,
        depth: 0,
        defines: BTreeMap::new(),
        last_line: 1,
    };
    let root = p.parse_top()?;
    Ok(Template {
        text: text.to_string(),
        root,
        defines: p.defines,
    })
}

enum Listed {
    Node(Node),
    End,
    Else,
}

impl Parser<'_> {
    fn errorf(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            message: format!(
                "template: {}:{}: {}",
                self.name,
                self.last_line,
                message.into()
            ),
            line: self.last_line,
            too_deep: false,
        }
    }

    fn eof_item(&self) -> Item {
        Item {
            typ: ItemType::Eof,
            pos: 0,
            val: String::new(),
            line: self.last_line,
        }
    }

    fn next(&mut self) -> Item {
        let item = self
            .items
            .get(self.i)
            .cloned()
            .unwrap_or_else(|| self.eof_item());
        if self.i < self.items.len() {
            self.i += 1;
        }
        self.last_line = item.line;
        item
    }

    fn backup(&mut self) {
        self.i = self.i.saturating_sub(1);
    }

    fn peek(&self) -> Item {
        self.items
            .get(self.i)
            .cloned()
            .unwrap_or_else(|| self.eof_item())
    }

    fn next_non_space(&mut self) -> Item {
        loop {
            let t = self.next();
            if t.typ != ItemType::Space {
                return t;
            }
        }
    }

    fn peek_non_space(&mut self) -> Item {
        let t = self.next_non_space();
        self.backup();
        t
    }

    fn expect(&mut self, typ: ItemType, context: &str) -> PResult<Item> {
        let t = self.next_non_space();
        if t.typ != typ {
            return Err(self.unexpected(&t, context));
        }
        Ok(t)
    }

    fn unexpected(&self, token: &Item, context: &str) -> ParseError {
        if token.typ == ItemType::Error {
            let mut extra = String::new();
            if self.action_line != 0 && self.action_line != token.line {
                extra = format!(" in action started at {}:{}", self.name, self.action_line);
                if token.val.ends_with(" action") {
                    extra = extra[" in action".len()..].to_string();
                }
            }
            return self.errorf(format!("{token}{extra}"));
        }
        self.errorf(format!("unexpected {token} in {context}"))
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            let mut e = self.errorf("max expression depth exceeded");
            e.too_deep = true;
            return Err(e);
        }
        Ok(())
    }

    fn parse_top(&mut self) -> PResult<Vec<Node>> {
        let mut root = Vec::new();
        while self.peek().typ != ItemType::Eof {
            if self.peek().typ == ItemType::Error {
                let t = self.next();
                return Err(self.unexpected(&t, "input"));
            }
            if self.peek().typ == ItemType::LeftDelim {
                let save = self.i;
                self.next();
                if self.next_non_space().typ == ItemType::Define {
                    self.parse_definition()?;
                    continue;
                }
                self.i = save;
            }
            match self.text_or_action()? {
                Listed::End => return Err(self.errorf("unexpected {{end}}")),
                Listed::Else => return Err(self.errorf("unexpected {{else}}")),
                Listed::Node(n) => root.push(n),
            }
        }
        Ok(root)
    }

    fn add_define(&mut self, name: String, list: Vec<Node>) -> PResult<()> {
        let empty = |l: &[Node]| {
            l.iter()
                .all(|n| matches!(n, Node::Text(t) if t.trim().is_empty()))
        };
        match self.defines.get(&name) {
            Some(existing) if !empty(existing) && !empty(&list) => Err(self.errorf(format!(
                "template: multiple definition of template {}",
                go_quote(&name)
            ))),
            Some(_) if empty(&list) => Ok(()),
            _ => {
                self.defines.insert(name, list);
                Ok(())
            }
        }
    }

    fn parse_definition(&mut self) -> PResult<()> {
        let context = "define clause";
        let t = self.next_non_space();
        if !matches!(t.typ, ItemType::String | ItemType::RawString) {
            return Err(self.unexpected(&t, context));
        }
        let name = self.unquote(&t)?;
        self.expect(ItemType::RightDelim, context)?;
        // A definition has its own variables.
        let saved = std::mem::replace(&mut self.vars, vec!["$".to_string()]);
        let (list, end) = self.item_list()?;
        self.vars = saved;
        if !matches!(end, Listed::End) {
            return Err(self.errorf(format!("unexpected {{{{else}}}} in {context}")));
        }
        self.add_define(name, list)
    }

    fn item_list(&mut self) -> PResult<(Vec<Node>, Listed)> {
        let mut list = Vec::new();
        while self.peek_non_space().typ != ItemType::Eof {
            match self.text_or_action()? {
                Listed::Node(n) => list.push(n),
                end => return Ok((list, end)),
            }
        }
        Err(self.errorf("unexpected EOF"))
    }

    fn text_or_action(&mut self) -> PResult<Listed> {
        let token = self.next_non_space();
        match token.typ {
            ItemType::Text => Ok(Listed::Node(Node::Text(token.val))),
            ItemType::LeftDelim => {
                self.action_line = token.line;
                let r = self.action();
                self.action_line = 0;
                r
            }
            _ => Err(self.unexpected(&token, "input")),
        }
    }

    fn action(&mut self) -> PResult<Listed> {
        let token = self.next_non_space();
        match token.typ {
            ItemType::Block => return self.block_control().map(Listed::Node),
            ItemType::Break => {
                return self
                    .break_control("break")
                    .map(|_| Listed::Node(Node::Break));
            }
            ItemType::Continue => {
                return self
                    .break_control("continue")
                    .map(|_| Listed::Node(Node::Continue));
            }
            ItemType::Else => return self.else_control(),
            ItemType::End => {
                self.expect(ItemType::RightDelim, "end")?;
                return Ok(Listed::End);
            }
            ItemType::If => return self.control("if").map(|c| Listed::Node(Node::If(c))),
            ItemType::Range => return self.control("range").map(|c| Listed::Node(Node::Range(c))),
            ItemType::Template => return self.template_control().map(Listed::Node),
            ItemType::With => return self.control("with").map(|c| Listed::Node(Node::With(c))),
            _ => {}
        }
        self.backup();
        // Variables declared here persist until the enclosing "end".
        Ok(Listed::Node(Node::Action(
            self.pipeline("command", ItemType::RightDelim)?,
        )))
    }

    fn break_control(&mut self, word: &str) -> PResult<()> {
        let token = self.next_non_space();
        if token.typ != ItemType::RightDelim {
            return Err(self.unexpected(&token, &format!("{{{{{word}}}}}")));
        }
        if self.range_depth == 0 {
            return Err(self.errorf(format!("{{{{{word}}}}} outside {{{{range}}}}")));
        }
        Ok(())
    }

    fn else_control(&mut self) -> PResult<Listed> {
        if matches!(self.peek_non_space().typ, ItemType::If | ItemType::With) {
            // "else if" and "else with" (go1.23): the keyword stays pending for the caller.
            return Ok(Listed::Else);
        }
        self.expect(ItemType::RightDelim, "else")?;
        Ok(Listed::Else)
    }

    fn control(&mut self, context: &str) -> PResult<Control> {
        self.enter()?;
        let vars = self.vars.len();
        let pipe = self.pipeline(context, ItemType::RightDelim)?;
        if context == "range" {
            self.range_depth += 1;
        }
        let (list, next) = self.item_list()?;
        if context == "range" {
            self.range_depth -= 1;
        }
        let mut else_list = None;
        if let Listed::Else = next {
            if context == "if" && self.peek().typ == ItemType::If {
                // `else if` is `else` + a nested `if` that shares the outer `end`.
                self.next();
                else_list = Some(vec![Node::If(self.control("if")?)]);
            } else if context == "with" && self.peek().typ == ItemType::With {
                // `else with` (go1.23) likewise: `{{with a}}_{{else}}{{with b}}_{{end}}{{end}}`.
                self.next();
                else_list = Some(vec![Node::With(self.control("with")?)]);
            } else {
                let (l, next) = self.item_list()?;
                if !matches!(next, Listed::End) {
                    return Err(self.errorf("expected end; found {{else}}"));
                }
                else_list = Some(l);
            }
        }
        self.vars.truncate(vars);
        self.depth -= 1;
        Ok(Control {
            pipe,
            list,
            else_list,
        })
    }

    fn unquote(&self, t: &Item) -> PResult<String> {
        unquote(&t.val).ok_or_else(|| self.errorf("invalid syntax"))
    }

    fn template_name(&mut self, token: &Item, context: &str) -> PResult<String> {
        match token.typ {
            ItemType::String | ItemType::RawString => self.unquote(token),
            _ => Err(self.unexpected(token, context)),
        }
    }

    fn block_control(&mut self) -> PResult<Node> {
        let context = "block clause";
        let token = self.next_non_space();
        let name = self.template_name(&token, context)?;
        let pipe = self.pipeline(context, ItemType::RightDelim)?;
        self.enter()?;
        let saved = std::mem::replace(&mut self.vars, vec!["$".to_string()]);
        let (list, end) = self.item_list()?;
        self.vars = saved;
        self.depth -= 1;
        if !matches!(end, Listed::End) {
            return Err(self.errorf(format!("unexpected {{{{else}}}} in {context}")));
        }
        self.add_define(name.clone(), list)?;
        Ok(Node::Template {
            name,
            pipe: Some(pipe),
            pos: token.pos,
        })
    }

    fn template_control(&mut self) -> PResult<Node> {
        let context = "template clause";
        let token = self.next_non_space();
        let name = self.template_name(&token, context)?;
        let pipe = if self.next_non_space().typ != ItemType::RightDelim {
            self.backup();
            Some(self.pipeline(context, ItemType::RightDelim)?)
        } else {
            None
        };
        Ok(Node::Template {
            name,
            pipe,
            pos: token.pos,
        })
    }

    fn pipeline(&mut self, context: &str, end: ItemType) -> PResult<Pipe> {
        let start = self.peek_non_space();
        let mut pipe = Pipe {
            pos: start.pos,
            decl: Vec::new(),
            is_assign: false,
            cmds: Vec::new(),
        };
        loop {
            let v = self.peek_non_space();
            if v.typ != ItemType::Variable {
                break;
            }
            let save = self.i;
            self.next_non_space();
            let after = self.peek();
            let next = self.peek_non_space();
            if next.typ == ItemType::Assign || next.typ == ItemType::Declare {
                pipe.is_assign = next.typ == ItemType::Assign;
                self.next_non_space();
                pipe.decl.push(v.val.clone());
                self.vars.push(v.val);
                break;
            } else if next.typ == ItemType::Char && next.val == "," {
                self.next_non_space();
                pipe.decl.push(v.val.clone());
                self.vars.push(v.val);
                if context == "range" && pipe.decl.len() < 2 {
                    match self.peek_non_space().typ {
                        ItemType::Variable | ItemType::RightDelim | ItemType::RightParen => {
                            continue;
                        }
                        _ => return Err(self.errorf("range can only initialize variables")),
                    }
                }
                return Err(self.errorf(format!("too many declarations in {context}")));
            } else {
                let _ = after;
                self.i = save;
                break;
            }
        }
        loop {
            let token = self.next_non_space();
            match token.typ {
                t if t == end => {
                    self.check_pipeline(&pipe, context)?;
                    return Ok(pipe);
                }
                ItemType::Bool
                | ItemType::CharConstant
                | ItemType::Dot
                | ItemType::Field
                | ItemType::Identifier
                | ItemType::Number
                | ItemType::Nil
                | ItemType::RawString
                | ItemType::String
                | ItemType::Variable
                | ItemType::LeftParen => {
                    self.backup();
                    let cmd = self.command()?;
                    pipe.cmds.push(cmd);
                }
                _ => return Err(self.unexpected(&token, context)),
            }
        }
    }

    fn check_pipeline(&self, pipe: &Pipe, context: &str) -> PResult<()> {
        if pipe.cmds.is_empty() {
            return Err(self.errorf(format!("missing value for {context}")));
        }
        for (i, c) in pipe.cmds.iter().enumerate().skip(1) {
            if matches!(
                c.args.first(),
                Some(
                    Arg::Bool { .. }
                        | Arg::Dot { .. }
                        | Arg::Nil { .. }
                        | Arg::Number { .. }
                        | Arg::Str { .. }
                )
            ) {
                return Err(self.errorf(format!(
                    "non executable command in pipeline stage {}",
                    i + 1
                )));
            }
        }
        Ok(())
    }

    fn command(&mut self) -> PResult<Cmd> {
        let mut cmd = Cmd {
            pos: self.peek_non_space().pos,
            args: Vec::new(),
        };
        loop {
            self.peek_non_space();
            if let Some(operand) = self.operand()? {
                cmd.args.push(operand);
            }
            let token = self.next();
            match token.typ {
                ItemType::Space => continue,
                ItemType::RightDelim | ItemType::RightParen => self.backup(),
                ItemType::Pipe => {}
                _ => return Err(self.unexpected(&token, "operand")),
            }
            break;
        }
        if cmd.args.is_empty() {
            return Err(self.errorf("empty command"));
        }
        Ok(cmd)
    }

    fn operand(&mut self) -> PResult<Option<Arg>> {
        let Some(node) = self.term()? else {
            return Ok(None);
        };
        if self.peek().typ != ItemType::Field {
            return Ok(Some(node));
        }
        let mut fields = Vec::new();
        // Go positions the merged node at the first chained field (`newChain(t.peek().pos)`),
        // which is where its execution errors point.
        let chain_pos = self.peek().pos;
        while self.peek().typ == ItemType::Field {
            let f = self.next();
            fields.push(f.val.trim_start_matches('.').to_string());
        }
        Ok(Some(match node {
            Arg::Field { mut names, .. } => {
                names.extend(fields);
                Arg::Field {
                    pos: chain_pos,
                    names,
                }
            }
            Arg::Variable {
                name,
                fields: mut own,
                ..
            } => {
                own.extend(fields);
                Arg::Variable {
                    pos: chain_pos,
                    name,
                    fields: own,
                }
            }
            Arg::Bool { .. }
            | Arg::Str { .. }
            | Arg::Number { .. }
            | Arg::Nil { .. }
            | Arg::Dot { .. } => {
                return Err(self.errorf(format!(
                    "unexpected . after term {}",
                    go_quote(&arg_string(&node))
                )));
            }
            other => Arg::Chain {
                pos: chain_pos,
                node: Box::new(other),
                fields,
            },
        }))
    }

    fn term(&mut self) -> PResult<Option<Arg>> {
        let token = self.next_non_space();
        Ok(Some(match token.typ {
            ItemType::Identifier => {
                if !(self.is_function)(&token.val) {
                    return Err(
                        self.errorf(format!("function {} not defined", go_quote(&token.val)))
                    );
                }
                Arg::Ident {
                    pos: token.pos,
                    name: token.val,
                }
            }
            ItemType::Dot => Arg::Dot { pos: token.pos },
            ItemType::Nil => Arg::Nil { pos: token.pos },
            ItemType::Variable => {
                // `$x` is one token; its fields come as Field tokens.
                if !self.vars.contains(&token.val) {
                    return Err(self.errorf(format!("undefined variable {}", go_quote(&token.val))));
                }
                Arg::Variable {
                    pos: token.pos,
                    name: token.val,
                    fields: Vec::new(),
                }
            }
            ItemType::Field => Arg::Field {
                pos: token.pos,
                names: vec![token.val.trim_start_matches('.').to_string()],
            },
            ItemType::Bool => Arg::Bool {
                pos: token.pos,
                value: token.val == "true",
            },
            ItemType::CharConstant | ItemType::Number => {
                let value = self.number(&token)?;
                Arg::Number {
                    pos: token.pos,
                    text: token.val,
                    value,
                }
            }
            ItemType::LeftParen => {
                self.enter()?;
                let p = self.pipeline("parenthesized pipeline", ItemType::RightParen)?;
                self.depth -= 1;
                Arg::Pipe(Box::new(p))
            }
            ItemType::String | ItemType::RawString => Arg::Str {
                pos: token.pos,
                value: self.unquote(&token)?,
                quoted: token.val,
            },
            _ => {
                self.backup();
                return Ok(None);
            }
        }))
    }

    fn number(&self, token: &Item) -> PResult<Number> {
        let illegal = || self.errorf(format!("illegal number syntax: {}", go_quote(&token.val)));
        if token.typ == ItemType::CharConstant {
            let inner = &token.val[1..token.val.len().saturating_sub(1).max(1)];
            match inner {
                "\"" => return Ok(Number::Int(34)),
                "\\'" => return Ok(Number::Int(39)),
                _ => {}
            }
            let inner = unquote(&format!("\"{inner}\""))
                .filter(|s| s.chars().count() == 1)
                .ok_or_else(|| {
                    self.errorf(format!("malformed character constant: {}", token.val))
                })?;
            return Ok(Number::Int(inner.chars().next().map_or(0, |c| c as i64)));
        }
        let text = token.val.as_str();
        if text.ends_with('i') {
            return Ok(Number::Other);
        }
        if let Some(i) = parse_go_int(text) {
            return Ok(Number::Int(i));
        }
        let plain = text.replace('_', "");
        let unsigned = plain.trim_start_matches(['+', '-']);
        let hexish = unsigned.starts_with("0x") || unsigned.starts_with("0X");
        if hexish {
            // Hex floats and huge hex ints: valid Go, not evaluated here.
            return if unsigned.len() > 2 {
                Ok(Number::Other)
            } else {
                Err(illegal())
            };
        }
        match plain.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Number::Float(f)),
            Ok(_) => Err(illegal()),
            Err(_) if unsigned.chars().all(|c| c.is_ascii_digit()) && !unsigned.is_empty() => {
                Ok(Number::Other)
            }
            Err(_) => Err(illegal()),
        }
    }
}

/// Go integer literal with `0x`/`0o`/`0b`/leading-0 octal prefixes and `_` separators.
fn parse_go_int(text: &str) -> Option<i64> {
    let (neg, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let body_l = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = body_l.strip_prefix("0x") {
        (16, d.to_string())
    } else if let Some(d) = body_l.strip_prefix("0o") {
        (8, d.to_string())
    } else if let Some(d) = body_l.strip_prefix("0b") {
        (2, d.to_string())
    } else if body_l.len() > 1 && body_l.starts_with('0') {
        (8, body_l[1..].to_string())
    } else {
        (10, body_l.clone())
    };
    if digits.is_empty() || digits.starts_with('_') && radix == 10 || digits.ends_with('_') {
        return None;
    }
    let clean = digits.replace('_', "");
    let v = i64::from_str_radix(&clean, radix).ok()?;
    Some(if neg { -v } else { v })
}

/// Go's `strconv.Unquote` for "..." and `...` literals; `None` where Go fails.
pub fn unquote(s: &str) -> Option<String> {
    if let Some(raw) = s.strip_prefix('`') {
        return raw.strip_suffix('`').map(|r| r.replace('\r', ""));
    }
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut it = inner.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            if c == '\n' {
                return None;
            }
            out.push(c);
            continue;
        }
        let e = it.next()?;
        match e {
            'a' => out.push('\u{7}'),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'v' => out.push('\u{b}'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '0'..='7' => {
                let mut v = e.to_digit(8)?;
                for _ in 0..2 {
                    v = v * 8 + it.next()?.to_digit(8)?;
                }
                if v > 255 {
                    return None;
                }
                // Go writes the byte; we only need a valid string to evaluate.
                out.push(char::from_u32(v)?);
            }
            'x' | 'u' | 'U' => {
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let mut v = 0u32;
                for _ in 0..n {
                    v = v.checked_mul(16)? + it.next()?.to_digit(16)?;
                }
                out.push(char::from_u32(v)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Go's `String()` of an argument (`Node.String`), for `executing "values" at <...>` in
/// execution errors and "unexpected . after term" at parse time.
pub fn arg_string(a: &Arg) -> String {
    let mut s = String::new();
    write_arg(a, &mut s);
    s
}

fn write_arg(a: &Arg, s: &mut String) {
    match a {
        Arg::Field { names, .. } => {
            for n in names {
                s.push('.');
                s.push_str(n);
            }
        }
        Arg::Variable { name, fields, .. } => {
            s.push_str(name);
            for f in fields {
                s.push('.');
                s.push_str(f);
            }
        }
        Arg::Ident { name, .. } => s.push_str(name),
        Arg::Pipe(p) => {
            s.push('(');
            write_pipe(p, s);
            s.push(')');
        }
        Arg::Chain { node, fields, .. } => {
            write_arg(node, s);
            for f in fields {
                s.push('.');
                s.push_str(f);
            }
        }
        Arg::Bool { value, .. } => s.push_str(if *value { "true" } else { "false" }),
        Arg::Str { quoted, .. } => s.push_str(quoted),
        Arg::Number { text, .. } => s.push_str(text),
        Arg::Nil { .. } => s.push_str("nil"),
        Arg::Dot { .. } => s.push('.'),
    }
}

/// Go's `CommandNode.String`.
pub fn cmd_string(c: &Cmd) -> String {
    let mut s = String::new();
    write_cmd(c, &mut s);
    s
}

fn write_cmd(c: &Cmd, s: &mut String) {
    for (i, a) in c.args.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        write_arg(a, s);
    }
}

/// Go's `PipeNode.String`.
pub fn pipe_string(p: &Pipe) -> String {
    let mut s = String::new();
    write_pipe(p, &mut s);
    s
}

fn write_pipe(p: &Pipe, s: &mut String) {
    if !p.decl.is_empty() {
        s.push_str(&p.decl.join(", "));
        s.push_str(if p.is_assign { " = " } else { " := " });
    }
    for (i, c) in p.cmds.iter().enumerate() {
        if i > 0 {
            s.push_str(" | ");
        }
        write_cmd(c, s);
    }
}

/// Go's `ListNode.String` of `list`; `quote_text`: text as `%q` (Go's test tables set
/// `textFormat = "%q"`), else as it is.
pub fn list_string(list: &[Node], quote_text: bool) -> String {
    let mut s = String::new();
    write_list(list, quote_text, &mut s);
    s
}

/// Go's `TemplateNode.String`.
pub fn template_string(name: &str, pipe: Option<&Pipe>) -> String {
    let mut s = format!("{{{{template {}", go_quote(name));
    if let Some(p) = pipe {
        s.push(' ');
        write_pipe(p, &mut s);
    }
    s.push_str("}}");
    s
}

fn write_list(list: &[Node], quote_text: bool, s: &mut String) {
    for n in list {
        match n {
            Node::Text(t) if quote_text => s.push_str(&go_quote(t)),
            Node::Text(t) => s.push_str(t),
            Node::Action(p) => {
                s.push_str("{{");
                write_pipe(p, s);
                s.push_str("}}");
            }
            Node::If(c) | Node::Range(c) | Node::With(c) => {
                let word = match n {
                    Node::If(_) => "if",
                    Node::Range(_) => "range",
                    _ => "with",
                };
                s.push_str("{{");
                s.push_str(word);
                s.push(' ');
                write_pipe(&c.pipe, s);
                s.push_str("}}");
                write_list(&c.list, quote_text, s);
                if let Some(e) = &c.else_list {
                    s.push_str("{{else}}");
                    write_list(e, quote_text, s);
                }
                s.push_str("{{end}}");
            }
            Node::Template { name, pipe, .. } => s.push_str(&template_string(name, pipe.as_ref())),
            Node::Break => s.push_str("{{break}}"),
            Node::Continue => s.push_str("{{continue}}"),
        }
    }
}

//! Executes a parsed template the way Go's `text/template` does with `missingkey=error`, for
//! the subset that decides whether a Fleet values template fails. Anything outside the subset
//! stops evaluation with [`Stop::Unknown`]: the caller then assumes Fleet renders it.

use super::lex::go_quote;
use super::parse::{Arg, Cmd, Control, Node, Number, Pipe, Template, arg_string};
pub use super::value::Value;
use super::value::format_value;

/// Longest output we render before giving up (unknown, not a failure).
pub const MAX_OUTPUT: usize = 1 << 20;
/// Most nodes, commands and range iterations we evaluate before giving up.
pub const MAX_STEPS: usize = 100_000;
/// Deepest `template` call nesting we follow (Go's limit is 100000).
pub const MAX_TEMPLATE_DEPTH: usize = 100;

/// Why evaluation stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Go fails with this message (`template: values:L:C: executing ...`).
    Fail(String),
    /// Outside what helmop evaluates (the reason says what).
    Unknown(String),
}

type R<T> = Result<T, Stop>;

enum Flow {
    Normal,
    Break,
    Continue,
}

struct State<'t> {
    tmpl: &'t Template,
    name: String,
    vars: Vec<(String, Value)>,
    out: String,
    steps: usize,
    depth: usize,
    /// Position and text of the node being evaluated, for messages.
    at: (usize, String),
}

/// Renders `tmpl` with `data` as dot.
pub fn execute(tmpl: &Template, name: &str, data: &Value) -> R<String> {
    let mut s = State {
        tmpl,
        name: name.to_string(),
        vars: vec![("$".to_string(), data.clone())],
        out: String::new(),
        steps: 0,
        depth: 0,
        at: (0, String::new()),
    };
    s.walk_list(&tmpl.root, data)?;
    Ok(s.out)
}

fn unknown<T>(why: impl Into<String>) -> R<T> {
    Err(Stop::Unknown(why.into()))
}

impl State<'_> {
    fn fail(&self, message: impl std::fmt::Display) -> Stop {
        let (pos, node) = &self.at;
        let text = &self.tmpl.text[..(*pos).min(self.tmpl.text.len())];
        let line = 1 + text.matches('\n').count();
        let col = text.rfind('\n').map_or(*pos, |i| pos - i - 1);
        Stop::Fail(format!(
            "template: {}:{line}:{col}: executing {} at <{node}>: {message}",
            self.name,
            go_quote(&self.name)
        ))
    }

    fn step(&mut self) -> R<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return unknown(format!("more than {MAX_STEPS} evaluation steps"));
        }
        Ok(())
    }

    fn walk_list(&mut self, list: &[Node], dot: &Value) -> R<Flow> {
        for n in list {
            match self.walk(n, dot)? {
                Flow::Normal => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Normal)
    }

    fn emit(&mut self, s: &str) -> R<()> {
        if self.out.len() + s.len() > MAX_OUTPUT {
            return unknown(format!("output longer than {MAX_OUTPUT} bytes"));
        }
        self.out.push_str(s);
        Ok(())
    }

    fn walk(&mut self, node: &Node, dot: &Value) -> R<Flow> {
        self.step()?;
        match node {
            Node::Text(t) => self.emit(t)?,
            Node::Action(p) => {
                let v = self.pipeline(p, dot)?;
                if p.decl.is_empty() {
                    let mut s = String::new();
                    format_value(&v, false, &mut s);
                    self.emit(&s)?;
                }
            }
            Node::If(c) | Node::With(c) => {
                let mark = self.vars.len();
                let v = self.pipeline(&c.pipe, dot)?;
                let flow = if v.truth() {
                    let d = if matches!(node, Node::With(_)) {
                        v
                    } else {
                        dot.clone()
                    };
                    self.walk_list(&c.list, &d)?
                } else {
                    self.walk_list(&c.else_list, dot)?
                };
                self.vars.truncate(mark);
                return Ok(flow);
            }
            Node::Range(c) => {
                let flow = self.range(c, dot)?;
                return Ok(flow);
            }
            Node::Break => return Ok(Flow::Break),
            Node::Continue => return Ok(Flow::Continue),
            Node::Template { name, pipe, pos } => {
                let Some(body) = self.tmpl.defines.get(name) else {
                    self.at = (*pos, format!("template {}", go_quote(name)));
                    return Err(self.fail(format!("template {} not defined", go_quote(name))));
                };
                let d = match pipe {
                    Some(p) => self.pipeline(p, dot)?,
                    None => Value::Nil,
                };
                if self.depth >= MAX_TEMPLATE_DEPTH {
                    return unknown("template calls nested too deep");
                }
                self.depth += 1;
                let saved_vars = std::mem::replace(&mut self.vars, vec![("$".into(), d.clone())]);
                let saved_name = std::mem::replace(&mut self.name, name.clone());
                let r = self.walk_list(body, &d);
                self.vars = saved_vars;
                self.name = saved_name;
                self.depth -= 1;
                r?;
            }
        }
        Ok(Flow::Normal)
    }

    fn range(&mut self, c: &Control, dot: &Value) -> R<Flow> {
        let mark = self.vars.len();
        let v = self.pipeline(&c.pipe, dot)?;
        let items: Vec<(Value, Value)> = match &v {
            Value::List(l) => l
                .iter()
                .enumerate()
                .map(|(i, x)| (Value::Int(i as i64), x.clone()))
                .collect(),
            Value::Map(m) => m
                .iter()
                .map(|(k, x)| (Value::Str(k.clone()), x.clone()))
                .collect(),
            Value::Int(n) => (0..(*n).max(0))
                .take(MAX_STEPS + 1)
                .map(|i| (Value::Int(i), Value::Int(i)))
                .collect(),
            Value::Nil => Vec::new(),
            _ => return unknown(format!("range over {}", v.type_name())),
        };
        if items.is_empty() {
            let flow = self.walk_list(&c.else_list, dot)?;
            self.vars.truncate(mark);
            return Ok(flow);
        }
        for (k, x) in items {
            self.step()?;
            let inner = self.vars.len();
            // With one variable it gets the element; with two, the key/index and the element.
            match c.pipe.decl.len() {
                1 => self.set_last(0, x.clone()),
                2 => {
                    self.set_last(1, k);
                    self.set_last(0, x.clone());
                }
                _ => {}
            }
            let flow = self.walk_list(&c.list, &x)?;
            self.vars.truncate(inner);
            if let Flow::Break = flow {
                break;
            }
        }
        self.vars.truncate(mark);
        Ok(Flow::Normal)
    }

    /// Sets the variable `back` places from the top (range's declared variables).
    fn set_last(&mut self, back: usize, v: Value) {
        let n = self.vars.len();
        if let Some(slot) = n.checked_sub(back + 1).and_then(|i| self.vars.get_mut(i)) {
            slot.1 = v;
        }
    }

    fn pipeline(&mut self, p: &Pipe, dot: &Value) -> R<Value> {
        let mut value: Option<Value> = None;
        for cmd in &p.cmds {
            value = Some(self.command(cmd, dot, value)?);
        }
        let v = value.unwrap_or(Value::Nil);
        for name in &p.decl {
            if p.is_assign {
                match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                    Some(slot) => slot.1 = v.clone(),
                    None => return unknown("assignment to an undefined variable"),
                }
            } else {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn var(&self, name: &str) -> R<Value> {
        match self.vars.iter().rev().find(|(n, _)| n == name) {
            Some((_, v)) => Ok(v.clone()),
            None => unknown(format!("undefined variable {name}")),
        }
    }

    fn command(&mut self, cmd: &Cmd, dot: &Value, fin: Option<Value>) -> R<Value> {
        self.step()?;
        let Some(first) = cmd.args.first() else {
            return unknown("empty command");
        };
        if let Arg::Ident { pos, name } = first {
            return self.call(*pos, name, &cmd.args[1..], dot, fin);
        }
        let has_args = cmd.args.len() > 1 || fin.is_some();
        match first {
            Arg::Field { .. } | Arg::Variable { .. } | Arg::Chain { .. } if has_args => {
                self.at = (cmd.pos, arg_string(first));
                return Err(self.fail(format!(
                    "can't give argument to non-function {}",
                    arg_string(first)
                )));
            }
            Arg::Nil => {
                self.at = (cmd.pos, "nil".into());
                return Err(self.fail("nil is not a command"));
            }
            _ if has_args => {
                self.at = (cmd.pos, arg_string(first));
                return Err(self.fail(format!(
                    "can't give argument to non-function {}",
                    arg_string(first)
                )));
            }
            _ => {}
        }
        self.arg(first, dot)
    }

    fn fields(&mut self, pos: usize, node: String, mut v: Value, names: &[String]) -> R<Value> {
        for name in names {
            v = match v {
                Value::Map(mut m) => match m.remove(name) {
                    Some(x) => x,
                    None => {
                        self.at = (pos, node);
                        return Err(
                            self.fail(format!("map has no entry for key {}", go_quote(name)))
                        );
                    }
                },
                Value::Nil => {
                    self.at = (pos, node);
                    return Err(self.fail(format!("nil pointer evaluating interface {{}}.{name}")));
                }
                other => {
                    self.at = (pos, node);
                    return Err(self.fail(format!(
                        "can't evaluate field {name} in type {}",
                        other.type_name()
                    )));
                }
            };
        }
        Ok(v)
    }

    fn arg(&mut self, a: &Arg, dot: &Value) -> R<Value> {
        match a {
            Arg::Field { pos, names } => self.fields(*pos, arg_string(a), dot.clone(), names),
            Arg::Variable { pos, name, fields } => {
                let v = self.var(name)?;
                self.fields(*pos, arg_string(a), v, fields)
            }
            Arg::Chain { node, fields } => {
                let v = self.arg(node, dot)?;
                self.fields(self.at.0, arg_string(a), v, fields)
            }
            Arg::Dot => Ok(dot.clone()),
            Arg::Nil => Ok(Value::Nil),
            Arg::Bool(b) => Ok(Value::Bool(*b)),
            Arg::Number { value, .. } => match value {
                Number::Int(i) => Ok(Value::Int(*i)),
                Number::Float(f) => Ok(Value::Float(*f)),
                Number::Other => unknown("a complex or huge number"),
            },
            Arg::Str(s) => Ok(Value::Str(s.clone())),
            Arg::Ident { pos, name } => self.call(*pos, name, &[], dot, None),
            Arg::Pipe(p) => self.pipeline(p, dot),
        }
    }

    fn call(
        &mut self,
        pos: usize,
        name: &str,
        args: &[Arg],
        dot: &Value,
        fin: Option<Value>,
    ) -> R<Value> {
        // `and` and `or` evaluate their arguments lazily, left to right (Go 1.18+).
        if name == "and" || name == "or" {
            let n = args.len() + usize::from(fin.is_some());
            if n == 0 {
                self.at = (pos, name.to_string());
                return Err(self.fail(format!(
                    "wrong number of args for {name}: want at least 1 got 0"
                )));
            }
            let mut last = Value::Nil;
            for a in args {
                last = self.arg(a, dot)?;
                if last.truth() == (name == "or") {
                    return Ok(last);
                }
            }
            return Ok(fin.unwrap_or(last));
        }
        let mut vals = Vec::with_capacity(args.len() + 1);
        for a in args {
            vals.push(self.arg(a, dot)?);
        }
        vals.extend(fin);
        self.at = (pos, name.to_string());
        super::call::call(name, vals).map_err(|e| match e {
            super::call::CallError::Fail(m) => self.fail(m),
            super::call::CallError::Unknown(m) => Stop::Unknown(m),
        })
    }
}

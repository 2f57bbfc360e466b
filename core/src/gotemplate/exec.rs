//! Executes a parsed template the way Go's `text/template` (go1.26) does, with `missingkey=error`
//! (Fleet's option) or Go's default, for the subset that decides whether a Fleet values template
//! fails. Anything outside the subset stops evaluation with [`Stop::Unknown`]: the caller then
//! assumes Fleet renders it.
//!
//! Messages name the node Go's evaluator was at (`executing "values" at <node>`): the evaluator
//! records, as Go's `state.at` does, the last node it visited.

use super::lex::go_quote;
use super::parse::{
    Arg, Cmd, Control, Node, Number, Pipe, Template, arg_string, cmd_string, pipe_string,
    template_string,
};
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

/// Go's `missingkey` option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// `missingkey=default` (or `invalid`): a missing map entry is no value (`<no value>`).
    #[default]
    Default,
    /// `missingkey=error`, what Fleet sets: a missing map entry fails the execution.
    Error,
}

type R<T> = Result<T, Stop>;

enum Flow {
    Normal,
    Break,
    Continue,
}

/// The node Go's `state.node` points at (set by `state.at`), for messages.
#[derive(Clone, Copy)]
enum At<'t> {
    None,
    Arg(&'t Arg),
    Cmd(&'t Cmd),
    Pipe(&'t Pipe),
    Template {
        pos: usize,
        name: &'t str,
        pipe: Option<&'t Pipe>,
    },
}

struct State<'t> {
    tmpl: &'t Template,
    /// The name the template was parsed as: Go's location prefix (`ParseName`).
    parse_name: &'t str,
    /// The template being executed (a `define`d one inside a `template` call).
    name: &'t str,
    missing_key: MissingKey,
    vars: Vec<(&'t str, Value)>,
    out: String,
    steps: usize,
    depth: usize,
    at: At<'t>,
}

/// Renders `tmpl` with `data` as dot, with `missingkey=error` (Fleet's option).
pub fn execute(tmpl: &Template, name: &str, data: &Value) -> R<String> {
    execute_with(tmpl, name, data, MissingKey::Error)
}

/// Renders `tmpl` (parsed as `name`) with `data` as dot and the given `missingkey` option.
pub fn execute_with(
    tmpl: &Template,
    name: &str,
    data: &Value,
    missing_key: MissingKey,
) -> R<String> {
    let mut s = State {
        tmpl,
        parse_name: name,
        name,
        missing_key,
        vars: vec![("$", data.clone())],
        out: String::new(),
        steps: 0,
        depth: 0,
        at: At::None,
    };
    s.walk_list(&tmpl.root, data)?;
    Ok(s.out)
}

fn unknown<T>(why: impl Into<String>) -> R<T> {
    Err(Stop::Unknown(why.into()))
}

/// What a function receives for a value: Go turns an invalid value into the parameter's zero
/// value (a nil `interface{}`).
fn for_call(v: Value) -> Value {
    match v {
        Value::Missing => Value::Nil,
        v => v,
    }
}

impl<'t> State<'t> {
    fn fail(&self, message: impl std::fmt::Display) -> Stop {
        let (pos, node) = match self.at {
            At::None => {
                return Stop::Fail(format!("template: {}: {message}", self.name));
            }
            At::Arg(a) => (a.pos(), arg_string(a)),
            At::Cmd(c) => (c.pos, cmd_string(c)),
            At::Pipe(p) => (p.pos, pipe_string(p)),
            At::Template { pos, name, pipe } => (pos, template_string(name, pipe)),
        };
        let text = &self.tmpl.text[..pos.min(self.tmpl.text.len())];
        let line = 1 + text.matches('\n').count();
        let col = text.rfind('\n').map_or(pos, |i| pos - i - 1);
        Stop::Fail(format!(
            "template: {}:{line}:{col}: executing {} at <{node}>: {message}",
            self.parse_name,
            go_quote(self.name)
        ))
    }

    fn step(&mut self) -> R<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return unknown(format!("more than {MAX_STEPS} evaluation steps"));
        }
        Ok(())
    }

    fn walk_list(&mut self, list: &'t [Node], dot: &Value) -> R<Flow> {
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

    fn walk(&mut self, node: &'t Node, dot: &Value) -> R<Flow> {
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
                } else if let Some(else_list) = &c.else_list {
                    // `else if`/`else with` are a nested if/with here, seeing the outer
                    // pipeline's variables as Go's do.
                    self.walk_list(else_list, dot)?
                } else {
                    Flow::Normal
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
                self.at = At::Template {
                    pos: *pos,
                    name,
                    pipe: pipe.as_ref(),
                };
                let Some((defined, body)) = self.tmpl.defines.get_key_value(name) else {
                    return Err(self.fail(format!("template {} not defined", go_quote(name))));
                };
                let d = match pipe {
                    Some(p) => self.pipeline(p, dot)?,
                    None => Value::Missing,
                };
                if self.depth >= MAX_TEMPLATE_DEPTH {
                    return unknown("template calls nested too deep");
                }
                self.depth += 1;
                let saved_vars = std::mem::replace(&mut self.vars, vec![("$", d.clone())]);
                let saved_name = std::mem::replace(&mut self.name, defined.as_str());
                let r = self.walk_list(body, &d);
                self.vars = saved_vars;
                self.name = saved_name;
                self.depth -= 1;
                r?;
            }
        }
        Ok(Flow::Normal)
    }

    /// Go's `walkRange`: slices by index, maps in key order, integers `0..n` (go1.22) with one
    /// variable at most; no value or nil is empty; anything else fails.
    fn range(&mut self, c: &'t Control, dot: &Value) -> R<Flow> {
        let mark = self.vars.len();
        let v = self.pipeline(&c.pipe, dot)?;
        // (index, element); Go passes no index for integers.
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
            Value::Int(n) => {
                if c.pipe.decl.len() > 1 {
                    return Err(self.fail(format!(
                        "can't use {n} to iterate over more than one variable"
                    )));
                }
                (0..(*n).max(0))
                    .take(MAX_STEPS + 1)
                    .map(|i| (Value::Missing, Value::Int(i)))
                    .collect()
            }
            Value::Nil | Value::Missing => Vec::new(),
            Value::Bool(_) | Value::Float(_) | Value::Str(_) => {
                let mut s = String::new();
                format_value(&v, true, &mut s);
                return Err(self.fail(format!("range can't iterate over {s}")));
            }
        };
        if items.is_empty() {
            let flow = match &c.else_list {
                Some(else_list) => self.walk_list(else_list, dot)?,
                None => Flow::Normal,
            };
            self.vars.truncate(mark);
            return Ok(flow);
        }
        let decl = &c.pipe.decl;
        for (k, x) in items {
            self.step()?;
            let inner = self.vars.len();
            if c.pipe.is_assign {
                // `range $i, $x = ...` assigns the variables declared before (go1.21), the
                // element to the only one, or the index and the element to two.
                match decl.as_slice() {
                    [one] => self.set_var(one, x.clone())?,
                    [i, e] => {
                        self.set_var(i, k)?;
                        self.set_var(e, x.clone())?;
                    }
                    _ => {}
                }
            } else {
                // With one variable it gets the element; with two, the index and the element.
                match decl.len() {
                    1 => self.set_last(0, x.clone()),
                    2 => {
                        self.set_last(1, k);
                        self.set_last(0, x.clone());
                    }
                    _ => {}
                }
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

    /// Go's `setVar`: the innermost variable of that name.
    fn set_var(&mut self, name: &str, v: Value) -> R<()> {
        match self.vars.iter_mut().rev().find(|(n, _)| *n == name) {
            Some(slot) => {
                slot.1 = v;
                Ok(())
            }
            None => unknown("assignment to an undefined variable"),
        }
    }

    fn pipeline(&mut self, p: &'t Pipe, dot: &Value) -> R<Value> {
        self.at = At::Pipe(p);
        let mut value: Option<Value> = None;
        for cmd in &p.cmds {
            value = Some(self.command(cmd, dot, value)?);
        }
        let v = value.unwrap_or(Value::Missing);
        for name in &p.decl {
            if p.is_assign {
                self.set_var(name, v.clone())?;
            } else {
                self.vars.push((name, v.clone()));
            }
        }
        Ok(v)
    }

    fn var(&self, name: &str) -> R<Value> {
        match self.vars.iter().rev().find(|(n, _)| *n == name) {
            Some((_, v)) => Ok(v.clone()),
            None => unknown(format!("undefined variable {name}")),
        }
    }

    /// Go's `evalCommand`.
    fn command(&mut self, cmd: &'t Cmd, dot: &Value, fin: Option<Value>) -> R<Value> {
        self.step()?;
        let Some(first) = cmd.args.first() else {
            return unknown("empty command");
        };
        let has_args = cmd.args.len() > 1 || fin.is_some();
        let not_a_function = |s: &Self| {
            s.fail(format!(
                "can't give argument to non-function {}",
                arg_string(first)
            ))
        };
        match first {
            Arg::Ident { name, .. } => self.call(cmd, first, name, &cmd.args[1..], dot, fin),
            Arg::Field { names, .. } => {
                self.at = At::Arg(first);
                self.fields(dot.clone(), names, has_args)
            }
            Arg::Chain { .. } => {
                let v = self.chain_base(first, dot)?;
                let Arg::Chain { fields, .. } = first else {
                    return unknown("chain");
                };
                self.fields(v, fields, has_args)
            }
            Arg::Variable { name, fields, .. } => {
                self.at = At::Arg(first);
                let v = self.var(name)?;
                if fields.is_empty() {
                    if has_args {
                        return Err(not_a_function(self));
                    }
                    return Ok(v);
                }
                self.fields(v, fields, has_args)
            }
            Arg::Pipe(p) => {
                if has_args {
                    self.at = At::Arg(first);
                    return Err(not_a_function(self));
                }
                self.pipeline(p, dot)
            }
            _ => {
                self.at = At::Arg(first);
                if has_args {
                    return Err(not_a_function(self));
                }
                if let Arg::Nil { .. } = first {
                    return Err(self.fail("nil is not a command"));
                }
                self.arg(first, dot)
            }
        }
    }

    /// Go's `evalField` along `names` from `v`; `has_args`: the last field was given
    /// arguments (allowed only for methods, which helmop's values never have).
    fn fields(&mut self, mut v: Value, names: &[String], has_args: bool) -> R<Value> {
        for (i, name) in names.iter().enumerate() {
            v = match v {
                Value::Map(_) if has_args && i + 1 == names.len() => {
                    return Err(self.fail(format!("{name} is not a method but has arguments")));
                }
                Value::Map(mut m) => match m.remove(name) {
                    Some(x) => x,
                    None if self.missing_key == MissingKey::Error => {
                        return Err(
                            self.fail(format!("map has no entry for key {}", go_quote(name)))
                        );
                    }
                    None => Value::Missing,
                },
                Value::Missing if self.missing_key == MissingKey::Error => {
                    return Err(self.fail(format!("nil data; no entry for key {}", go_quote(name))));
                }
                Value::Missing => Value::Missing,
                Value::Nil => {
                    return Err(self.fail(format!("nil pointer evaluating interface {{}}.{name}")));
                }
                other => {
                    return Err(self.fail(format!(
                        "can't evaluate field {name} in type {}",
                        other.type_name()
                    )));
                }
            };
        }
        Ok(v)
    }

    /// The value a chain `(pipeline).A.B` starts from (Go's `evalChainNode` before the fields).
    fn chain_base(&mut self, chain: &'t Arg, dot: &Value) -> R<Value> {
        self.at = At::Arg(chain);
        let Arg::Chain { node, .. } = chain else {
            return unknown("chain");
        };
        if let Arg::Nil { .. } = **node {
            return Err(self.fail(format!(
                "indirection through explicit nil in {}",
                arg_string(chain)
            )));
        }
        self.arg(node, dot)
    }

    fn arg(&mut self, a: &'t Arg, dot: &Value) -> R<Value> {
        self.at = At::Arg(a);
        match a {
            Arg::Field { names, .. } => self.fields(dot.clone(), names, false),
            Arg::Variable { name, fields, .. } => {
                let v = self.var(name)?;
                self.fields(v, fields, false)
            }
            Arg::Chain { fields, .. } => {
                let v = self.chain_base(a, dot)?;
                self.fields(v, fields, false)
            }
            Arg::Dot { .. } => Ok(dot.clone()),
            Arg::Nil { .. } => Ok(Value::Nil),
            Arg::Bool { value, .. } => Ok(Value::Bool(*value)),
            Arg::Number { value, .. } => match value {
                Number::Int(i) => Ok(Value::Int(*i)),
                Number::Float(f) => Ok(Value::Float(*f)),
                Number::Other => unknown("a complex or huge number"),
            },
            Arg::Str { value, .. } => Ok(Value::Str(value.clone())),
            // A function named as an argument is called without arguments; Go reports its
            // failures at the identifier.
            Arg::Ident { name, .. } => self.call_at(At::Arg(a), a, name, &[], dot, None),
            Arg::Pipe(p) => self.pipeline(p, dot),
        }
    }

    fn call(
        &mut self,
        cmd: &'t Cmd,
        ident: &'t Arg,
        name: &str,
        args: &'t [Arg],
        dot: &Value,
        fin: Option<Value>,
    ) -> R<Value> {
        self.call_at(At::Cmd(cmd), ident, name, args, dot, fin)
    }

    /// Calls `name` (Go's `evalFunction`): a failure of the function itself ("error calling")
    /// is reported at `node`, the command (Go's `evalCall`), wrong arguments at the identifier.
    fn call_at(
        &mut self,
        node: At<'t>,
        ident: &'t Arg,
        name: &str,
        args: &'t [Arg],
        dot: &Value,
        fin: Option<Value>,
    ) -> R<Value> {
        self.at = At::Arg(ident);
        // `and` and `or` evaluate their arguments lazily, left to right (Go 1.18+).
        if name == "and" || name == "or" {
            let n = args.len() + usize::from(fin.is_some());
            if n == 0 {
                return Err(self.fail(format!(
                    "wrong number of args for {name}: want at least 1 got 0"
                )));
            }
            let mut last = Value::Missing;
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
            let v = self.arg(a, dot)?;
            vals.push(for_call(v));
        }
        vals.extend(fin.map(for_call));
        super::call::call(name, vals).map_err(|e| match e {
            super::call::CallError::Fail(m) => {
                self.at = if m.starts_with("error calling ") {
                    node
                } else {
                    At::Arg(ident)
                };
                self.fail(m)
            }
            super::call::CallError::Unknown(m) => Stop::Unknown(m),
        })
    }
}

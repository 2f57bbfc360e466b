//! Go `text/template` for Fleet's helm values templating, as of go1.26.6 (the toolchain Fleet
//! v0.16.1 builds with): a lexer and parser that accept and refuse what Go does (with Go's
//! messages) for Fleet's `${ }` delimiters and function map, and an evaluator for the subset that
//! decides whether rendering fails on a cluster. Go's own test tables run through both
//! (`go_tables`, test-only).
//!
//! Bounds (nothing panics or grows without limit on input): parse nesting [`parse::MAX_DEPTH`],
//! evaluation steps [`exec::MAX_STEPS`], output [`exec::MAX_OUTPUT`] bytes, `template` call
//! depth [`exec::MAX_TEMPLATE_DEPTH`]. Past a bound the answer is unknown, never a failure.

pub mod call;
pub mod exec;
pub mod funcs;
pub mod lex;
pub mod parse;
pub mod value;
pub mod yaml_out;

pub use exec::{Stop, Value, execute};
pub use parse::{ParseError, Template, parse};

/// The template name Fleet gives every values template (`template.New("values")`).
pub const FLEET_TEMPLATE_NAME: &str = "values";

/// What rendering a template for one cluster comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Render {
    Ok(String),
    /// Go fails; the message is Go's (`template: values:L:C: executing ...`).
    Fail(String),
    /// Outside helmop's subset (the reason says what): assume Fleet renders it.
    Unknown(String),
}

/// Parses and renders `text` as Fleet does (template `values`, `missingkey=error`).
pub fn render(text: &str, data: &Value) -> Render {
    let tmpl = match parse(FLEET_TEMPLATE_NAME, text) {
        Ok(t) => t,
        Err(e) if e.too_deep => return Render::Unknown(e.message),
        Err(e) => return Render::Fail(e.message),
    };
    match execute(&tmpl, FLEET_TEMPLATE_NAME, data) {
        Ok(s) => Render::Ok(s),
        Err(Stop::Fail(m)) => Render::Fail(m),
        Err(Stop::Unknown(m)) => Render::Unknown(m),
    }
}

/// Go's parse error for `text`, if Go refuses it (`None` when it parses or nests too deep
/// for helmop to tell).
pub fn parse_error(text: &str) -> Option<ParseError> {
    match parse(FLEET_TEMPLATE_NAME, text) {
        Err(e) if !e.too_deep => Some(e),
        _ => None,
    }
}

#[cfg(test)]
mod go_tables;
#[cfg(test)]
mod tests;

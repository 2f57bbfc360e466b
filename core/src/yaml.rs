//! Multi-document YAML (and JSON, a subset of it) to `serde_json::Value` documents, each with
//! the line it starts on. Pure: the caller reads the bytes.
//!
//! Parsing never panics: non-UTF-8 input, syntax errors, duplicate keys and resource-budget
//! breaches (alias bombs, deep nesting) all come back as [`YamlError`] naming the line. Error
//! messages never quote document content (no source snippets), since files may hold Secrets.

use serde_saphyr::Spanned;

/// One document of a stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// 0-based position among the stream's non-empty documents (empty documents, e.g. a
    /// leading `---`, are skipped like kubectl does).
    pub index: usize,
    /// 1-based line where the document's content starts (0 if unknown).
    pub line: u64,
    pub value: serde_json::Value,
}

/// Why a stream could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    #[error("line {line}: not valid UTF-8 (byte offset {offset})")]
    NotUtf8 { line: u64, offset: usize },
    #[error("{}malformed YAML: {message}", line_prefix(*.line, *.column))]
    Syntax {
        /// 1-based; `None` when the parser gave no location.
        line: Option<u64>,
        column: Option<u64>,
        message: String,
    },
}

impl YamlError {
    /// 1-based line of the problem, when known.
    pub fn line(&self) -> Option<u64> {
        match self {
            YamlError::NotUtf8 { line, .. } => Some(*line),
            YamlError::Syntax { line, .. } => *line,
        }
    }

    /// 1-based column of the problem, when known.
    pub fn column(&self) -> Option<u64> {
        match self {
            YamlError::NotUtf8 { .. } => None,
            YamlError::Syntax { column, .. } => *column,
        }
    }

    /// The problem without its location, for callers that print `FILE:LINE:COLUMN:` themselves.
    pub fn reason(&self) -> String {
        match self {
            YamlError::NotUtf8 { offset, .. } => format!("not valid UTF-8 (byte offset {offset})"),
            YamlError::Syntax { message, .. } => format!("malformed YAML: {message}"),
        }
    }
}

fn line_prefix(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("line {l} column {c}: "),
        (Some(l), None) => format!("line {l}: "),
        _ => String::new(),
    }
}

/// Parses every document of `bytes`.
pub fn parse_documents(bytes: &[u8]) -> Result<Vec<Document>, YamlError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let offset = e.valid_up_to();
        let line = 1 + bytes[..offset].iter().filter(|b| **b == b'\n').count() as u64;
        YamlError::NotUtf8 { line, offset }
    })?;
    // A leading byte-order mark is legal in YAML streams and common in files from Windows.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut options = serde_saphyr::Options::default();
    // Messages must not echo file content (Secrets).
    options.with_snippet = false;
    if let Some(budget) = options.budget.as_mut() {
        // The bytes are already in memory; the per-document limits (nodes, depth, aliases,
        // scalar bytes) still apply, so one document cannot blow up memory or the stack.
        budget.max_reader_input_bytes = None;
    }
    // The streaming reader enforces the budget per document, so a long stream of ordinary
    // documents (a kubectl bundle of thousands of HelmOps) is fine.
    let mut reader = text.as_bytes();
    let mut docs = Vec::new();
    for (index, doc) in
        serde_saphyr::read_with_options::<_, Spanned<serde_json::Value>>(&mut reader, options)
            .enumerate()
    {
        let doc = doc.map_err(syntax_error)?;
        docs.push(Document {
            index,
            line: doc.referenced.line(),
            value: doc.value,
        });
    }
    Ok(docs)
}

fn syntax_error(e: serde_saphyr::Error) -> YamlError {
    let location = e.location();
    let line = location.map(|l| l.line()).filter(|l| *l > 0);
    let column = location.map(|l| l.column()).filter(|c| *c > 0);
    YamlError::Syntax {
        line,
        column,
        message: first_line(&e.to_string()),
    }
}

/// The parser's message without snippet lines, its own " at line L, column C" suffix (we put
/// the location first) and advice about parser options that users cannot set.
fn first_line(message: &str) -> String {
    let mut line = message.lines().next().unwrap_or_default().trim();
    if let Some(at) = line.rfind(" at line ")
        && line[at + " at line ".len()..]
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, ',' | ' ') || c.is_ascii_alphabetic())
    {
        line = &line[..at];
    }
    line.replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}

#[cfg(test)]
mod tests;

//! Multi-document YAML (and JSON, a subset of it) to `serde_json::Value` documents, each with
//! the line it starts on. Pure: the caller reads the bytes.
//!
//! Parsing never panics: non-UTF-8 input, syntax errors, duplicate keys and resource-budget
//! breaches (alias bombs, deep nesting) all come back as [`YamlError`] naming the line. Error
//! messages never quote document content (no source snippets), since files may hold Secrets.
//!
//! Two readers: [`parse_documents`] for the files `kubectl helmop validate` reads (every
//! document, a repeated key refused, as kubectl's YAML tooling does), and [`parse_like_fleet`]
//! for YAML that Fleet itself reads with `sigs.k8s.io/yaml.Unmarshal` (rendered helm values):
//! the first document only, a repeated key taking its last value.

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

fn utf8(bytes: &[u8]) -> Result<&str, YamlError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let offset = e.valid_up_to();
        let line = 1 + bytes[..offset].iter().filter(|b| **b == b'\n').count() as u64;
        YamlError::NotUtf8 { line, offset }
    })?;
    // A leading byte-order mark is legal in YAML streams and common in files from Windows.
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text))
}

fn options(duplicate_keys: serde_saphyr::DuplicateKeyPolicy) -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    // Messages must not echo file content (Secrets).
    options.with_snippet = false;
    options.duplicate_keys = duplicate_keys;
    if let Some(budget) = options.budget.as_mut() {
        // The bytes are already in memory; the per-document limits (nodes, depth, aliases,
        // scalar bytes) still apply, so one document cannot blow up memory or the stack.
        budget.max_reader_input_bytes = None;
    }
    options
}

/// Parses every document of `bytes`; a key repeated in one mapping is an error.
pub fn parse_documents(bytes: &[u8]) -> Result<Vec<Document>, YamlError> {
    let text = utf8(bytes)?;
    let options = options(serde_saphyr::DuplicateKeyPolicy::Error);
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

/// Reads `bytes` as Fleet reads rendered helm values: `sigs.k8s.io/yaml.Unmarshal` (v1.6.0, as
/// rancher/fleet v0.16.1's go.mod pins it; `internal/cmd/controller/target/builder.go`,
/// `processTemplateValues` and `processTemplateValuesData`), which decodes with
/// `go.yaml.in/yaml/v2` v2.4.4's non-strict `Unmarshal` and then converts to JSON:
///
/// - only the first document is read (`unmarshal` calls the parser's `parse` once), so what
///   follows a `---` is never looked at;
/// - a key repeated in one mapping takes the last value (`decoder.setMapIndex` refuses a
///   repeat only in strict mode; otherwise `SetMapIndex` overwrites).
///
/// `None`: no document at all (Go leaves the target untouched: no error).
pub fn parse_like_fleet(bytes: &[u8]) -> Result<Option<serde_json::Value>, YamlError> {
    let text = utf8(bytes)?;
    let options = options(serde_saphyr::DuplicateKeyPolicy::LastWins);
    let mut reader = text.as_bytes();
    serde_saphyr::read_with_options::<_, serde_json::Value>(&mut reader, options)
        .next()
        .transpose()
        .map_err(syntax_error)
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

//! A span's fields as the JSON object the JSON log formatter reads back, written straight into the span's
//! buffer.
//!
//! tracing-subscriber's `JsonFields` collects a span's fields into a map of JSON values, then
//! serializes the map through a `fmt::Write` adaptor. Every admission opens a span (its uid, webhook,
//! kind, namespace and object, carried by whatever is logged while deciding it), and a clean allow logs
//! nothing, yet building that text was most of what opening the span cost (165 of its 184 samples in a
//! profile of `helmop-bench webhook`; docs/performance.md, section 1). The formatter only needs a JSON
//! object back, which it parses when an event inside the span is logged; this writes the same object
//! with one buffer and no map.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Span fields as a JSON object (`{"uid":"...","webhook":"helmops",...}`), for `fmt().json().fmt_fields(..)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanFields;

impl<'w> FormatFields<'w> for SpanFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut object = Object::default();
        fields.record(&mut object);
        writer.write_str(&object.finish())
    }

    /// Fields recorded later extend the object; one recorded again is written again, and the last one
    /// wins when the object is read back (as serde_json reads duplicate keys).
    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut object = Object::default();
        fields.record(&mut object);
        if object.is_empty() {
            return Ok(());
        }
        let added = object.finish();
        match current.fields.strip_suffix('}') {
            Some(open) if open.len() > 1 => current.fields = format!("{open},{}", &added[1..]),
            _ => current.fields = added,
        }
        Ok(())
    }
}

/// The object's text so far, without its closing brace.
struct Object(Vec<u8>);

impl Default for Object {
    fn default() -> Self {
        let mut text = Vec::with_capacity(160);
        text.push(b'{');
        Object(text)
    }
}

impl Object {
    fn is_empty(&self) -> bool {
        self.0.len() == 1
    }

    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        // As JsonFields: fields bridged from the `log` crate are not the span's own.
        if name.starts_with("log.") {
            return false;
        }
        if !self.is_empty() {
            self.0.push(b',');
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.0, name);
        self.0.push(b':');
        true
    }

    fn value(&mut self, field: &Field, value: impl serde::Serialize) {
        if self.key(field) {
            let _ = serde_json::to_writer(&mut self.0, &value);
        }
    }

    fn finish(mut self) -> String {
        self.0.push(b'}');
        // serde_json writes UTF-8 only.
        String::from_utf8(self.0).unwrap_or_else(|_| "{}".to_owned())
    }
}

impl Visit for Object {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.value(field, value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.value(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.value(field, value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.value(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        // Not finite: null, as serde_json writes it.
        self.value(field, value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.value(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::Object;

    // What the formatter logs for spans is checked against `JsonFields` in webhook/tests/spans.rs.
    #[test]
    fn an_object_of_no_fields_is_empty_braces() {
        assert_eq!(Object::default().finish(), "{}");
    }
}

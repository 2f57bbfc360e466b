//! A span's fields as the JSON object the JSON log formatter reads back, written straight into the span's
//! buffer.
//!
//! tracing-subscriber's `JsonFields` collects a span's fields into a map of JSON values, then serializes the
//! map through a `fmt::Write` adaptor. Every admission opens a span (its uid, webhook, kind, namespace and
//! object, carried by whatever is logged while deciding it), and a clean allow logs nothing, yet building
//! that text was most of what opening the span cost (165 of its 184 samples in a profile of
//! `helmop-bench webhook`; docs/performance.md, section 1). The formatter only needs a JSON object back, which it parses when an
//! event inside the span is logged; this writes the same object with one buffer and no map.

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
            Some(open) if open.len() > 1 => {
                let joined = format!("{open},{}", &added[1..]);
                current.fields = joined;
            }
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
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};
    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Lines {
        type Writer = Lines;
        fn make_writer(&'w self) -> Lines {
            self.clone()
        }
    }

    /// The line the JSON formatter logs for the event `emit` logs, with `fields` as the span formatter.
    fn logged<N>(fields: N, emit: impl FnOnce()) -> Value
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .fmt_fields(fields)
            .with_writer(lines.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        serde_json::from_str(text.trim()).unwrap()
    }

    /// An event inside a span of every kind of field, some recorded later, one twice.
    fn in_admission_span() {
        let span = tracing::info_span!(
            "admission",
            uid = %"7a1\"b\\c",
            webhook = "helmops",
            r#type = "a\nb ☃",
            count = 3u64,
            delta = -2i64,
            ratio = 0.5f64,
            dry_run = true,
            later = tracing::field::Empty,
        );
        span.record("later", "recorded");
        span.record("count", 4u64);
        let _in = span.enter();
        tracing::info!(outcome = "allowed", "admission");
    }

    #[test]
    fn the_logged_span_is_what_json_fields_logs() {
        let ours = logged(SpanFields, in_admission_span);
        assert_eq!(
            ours["span"],
            json!({
                "name": "admission",
                "uid": "7a1\"b\\c",
                "webhook": "helmops",
                "type": "a\nb ☃",
                "count": 4,
                "delta": -2,
                "ratio": 0.5,
                "dry_run": true,
                "later": "recorded",
            })
        );
        assert_eq!(
            ours["span"],
            logged(
                tracing_subscriber::fmt::format::JsonFields::new(),
                in_admission_span
            )["span"]
        );
    }

    #[test]
    fn fields_recorded_on_an_empty_span_make_its_object() {
        assert_eq!(Object::default().finish(), "{}");
        let line = logged(SpanFields, || {
            let span = tracing::info_span!("empty", later = tracing::field::Empty);
            span.record("later", 1u64);
            let _in = span.enter();
            tracing::info!("inside");
        });
        assert_eq!(line["span"], json!({"name": "empty", "later": 1}));
    }
}

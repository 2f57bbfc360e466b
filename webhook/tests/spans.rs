//! One `tracing` span per admission: every line logged while a review is decided, and the
//! answer's own line, carry the review's uid, kind, namespace and name, so one request's lines can
//! be found among concurrent ones. Its own test binary: it installs the process-wide subscriber.
//! The span's fields are written by `span_fields::SpanFields`, checked here against tracing-subscriber's
//! own `JsonFields` under subscribers of their own (scoped to a thread, beside the process-wide one).
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test with its message

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use helmop_webhook::app::init_tracing_to;
use helmop_webhook::cli::LogFormat;
use helmop_webhook::span_fields::SpanFields;
use helmop_webhook::{Verdict, Webhook};
use serde_json::{Value, json};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::JsonFields;

/// Collects what the JSON formatter writes.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_an_admission_carries_its_uid_and_object() {
    let lines = Lines::default();
    let writer = lines.clone();
    // The webhook's own logging set-up (`--log-format json`), into memory.
    init_tracing_to(LogFormat::Json, move || writer.clone(), false);

    // The handler logs from inside its decision, as the real ones do on a slow live read.
    let handlers = FakeHandlers::new(Arc::new(|_webhook, _req| {
        Box::pin(async move {
            tracing::warn!("inside the decision");
            Verdict::deny("no")
        })
    }));
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let server = start(options(&volume), handlers).await;
    let mut conn = H1::connect(server.webhook, &pki).await;
    for uid in ["first-uid", "second-uid"] {
        let body = serde_json::to_vec(&review(uid, Webhook::Helmops, true)).unwrap();
        let reply = conn.send("POST", "/validate/helmops", body).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let parsed: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for uid in ["first-uid", "second-uid"] {
        let of_request: Vec<&Value> = parsed.iter().filter(|l| l["span"]["uid"] == uid).collect();
        let messages: Vec<&str> = of_request
            .iter()
            .filter_map(|l| l["message"].as_str())
            .collect();
        assert_eq!(
            messages,
            ["inside the decision", "admission"],
            "lines of {uid}: {text}"
        );
        for line in of_request {
            let span = &line["span"];
            assert_eq!(span["name"], "admission", "{line}");
            assert_eq!(span["webhook"], "helmops", "{line}");
            assert_eq!(span["kind"], "HelmOp", "{line}");
            assert_eq!(span["namespace"], "fleet-default", "{line}");
            assert_eq!(span["object"], "app", "{line}");
        }
        // The answer's line says what was answered, under its own keys.
        let answer = parsed
            .iter()
            .find(|l| l["message"] == "admission" && l["uid"] == uid)
            .unwrap();
        assert_eq!(answer["outcome"], "denied", "{answer}");
        assert_eq!(answer["denial"], "no", "{answer}");
    }
}

/// The line the JSON formatter logs for the event `emit` logs, with `fields` as the span formatter.
fn logged<N>(fields: N, emit: impl FnOnce()) -> Value
where
    N: for<'w> FormatFields<'w> + Send + Sync + 'static,
{
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .fmt_fields(fields)
        .with_writer(move || writer.clone())
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
        logged(JsonFields::new(), in_admission_span)["span"]
    );
}

#[test]
fn fields_recorded_on_an_empty_span_make_its_object() {
    let line = logged(SpanFields, || {
        let span = tracing::info_span!("empty", later = tracing::field::Empty);
        span.record("later", 1u64);
        let _in = span.enter();
        tracing::info!("inside");
    });
    assert_eq!(line["span"], json!({"name": "empty", "later": 1}));
}

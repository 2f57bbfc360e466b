//! What a handler decides about one admission request, independent of the wire format.
//! `admission.rs` turns a [`Verdict`] into an AdmissionReview v1 response.

/// The decision on one admission request.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Admit, optionally with a JSONPatch (mutating endpoints only) and warnings (HTTP 299 warnings in kubectl).
    Allow {
        patch: Option<json_patch::Patch>,
        warnings: Vec<String>,
    },
    /// Reject with a message listing every problem; `code` is the HTTP status reported in `status.code` (usually 403,
    /// 500 when the webhook could not decide, e.g. the API server was unreachable during a lookup).
    Deny {
        message: String,
        code: u16,
        warnings: Vec<String>,
    },
}

impl Verdict {
    pub fn allow() -> Self {
        Verdict::Allow {
            patch: None,
            warnings: Vec::new(),
        }
    }

    pub fn allow_with_warnings(warnings: Vec<String>) -> Self {
        Verdict::Allow {
            patch: None,
            warnings,
        }
    }

    /// The same verdict with `more` warnings before its own.
    pub fn with_warnings(mut self, mut more: Vec<String>) -> Self {
        let (Verdict::Allow { warnings, .. } | Verdict::Deny { warnings, .. }) = &mut self;
        more.append(warnings);
        *warnings = more;
        self
    }

    pub fn deny(message: impl Into<String>) -> Self {
        Verdict::Deny {
            message: message.into(),
            code: 403,
            warnings: Vec::new(),
        }
    }
}

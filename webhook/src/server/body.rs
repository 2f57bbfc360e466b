//! Reading an admission body under the size limit and the shared body-bytes budget, and draining what is left of
//! a refused one.

use std::sync::Arc;

use axum::body::Body;
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub(super) enum BodyError {
    TooLarge,
    Unreadable,
    /// The body-bytes budget is used up by other requests.
    Busy,
}

/// How much of an oversized body is read and thrown away so that its sender gets the 413 (see `drain`).
pub const MAX_DRAIN_BYTES: u64 = 64 * 1024 * 1024;

/// A body and its share of the body-bytes budget, returned when dropped.
pub(super) struct ReadBody {
    pub(super) bytes: Vec<u8>,
    pub(super) _share: Option<OwnedSemaphorePermit>,
}

/// Reads the body up to `limit`, taking the bytes received from `budget` as they arrive; on failure, hands back
/// the rest of the stream so it can be drained.
pub(super) async fn read_body(
    body: Body,
    limit: usize,
    size_hint: usize,
    budget: &Arc<Semaphore>,
) -> Result<ReadBody, (BodyError, Option<axum::body::BodyDataStream>)> {
    let mut stream = body.into_data_stream();
    // The first allocation is sized by the hint, so the hint is taken up front.
    let mut reserved = size_hint.min(limit);
    let mut share = match take(budget, reserved) {
        Ok(share) => share,
        Err(()) => return Err((BodyError::Busy, Some(stream))),
    };
    let mut buf = Vec::with_capacity(reserved);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| (BodyError::Unreadable, None))?;
        let len = buf.len() + chunk.len();
        if len > limit {
            return Err((BodyError::TooLarge, Some(stream)));
        }
        // What the buffer will hold allocated, not what it holds written: a growing Vec doubles, and
        // charging only the length let 20 concurrent bodies allocate twice the budget.
        let capacity = if len > buf.capacity() {
            len.max(buf.capacity().saturating_mul(2)).min(limit)
        } else {
            buf.capacity()
        };
        if capacity > reserved {
            match take(budget, capacity - reserved) {
                Ok(more) => merge(&mut share, more),
                Err(()) => return Err((BodyError::Busy, Some(stream))),
            }
            reserved = capacity;
        }
        if capacity > buf.capacity() {
            buf.reserve_exact(capacity - buf.len());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(ReadBody {
        bytes: buf,
        _share: share,
    })
}

pub(super) fn take(
    budget: &Arc<Semaphore>,
    bytes: usize,
) -> Result<Option<OwnedSemaphorePermit>, ()> {
    if bytes == 0 {
        return Ok(None);
    }
    let n = u32::try_from(bytes).map_err(|_| ())?;
    budget
        .clone()
        .try_acquire_many_owned(n)
        .map(Some)
        .map_err(|_| ())
}

fn merge(share: &mut Option<OwnedSemaphorePermit>, more: Option<OwnedSemaphorePermit>) {
    match (share.as_mut(), more) {
        (Some(held), Some(more)) => held.merge(more),
        (None, more) => *share = more,
        (_, None) => {}
    }
}

/// Reads and discards what is left of a refused body, up to `cap` bytes and the request deadline.
///
/// Why: an ordinary client writes its whole body before it reads. Answered early, the server closes (HTTP/1.1)
/// or resets the stream (HTTP/2) with the body still arriving, and a TCP close with unread data is a reset
/// that throws away the 413 before the client reads it. Draining costs bandwidth, not memory (chunks are
/// dropped as they come); a sender of more than the drain cap gets the answer and the close.
pub(super) async fn drain(
    mut stream: axum::body::BodyDataStream,
    cap: u64,
    deadline: tokio::time::Instant,
) {
    let mut drained = 0u64;
    let _ = tokio::time::timeout_at(deadline, async {
        while drained <= cap {
            match stream.next().await {
                Some(Ok(chunk)) => drained += chunk.len() as u64,
                _ => return,
            }
        }
    })
    .await;
}

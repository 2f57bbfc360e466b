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

/// Refused bodies drained at once. Draining costs no memory but all the CPU receiving (and decrypting) the
/// bytes takes, so only this many senders get their answer after their body; the others get it at once and
/// the connection closes under the rest of their body (a client that writes before it reads sees a reset, the
/// API server a failed call: the `failurePolicy` it would apply to the 413 or 429 anyway). One sender at a
/// time gets the courtesy; a flood of refused bodies costs one connection's worth of receiving, not fifty.
pub const MAX_DRAINS: usize = 1;

/// A body and its share of the body-bytes budget, returned when dropped.
pub(super) struct ReadBody {
    pub(super) bytes: Vec<u8>,
    /// Of the share, what was taken up front for decoding the body (beyond its own bytes).
    pub(super) prepaid: usize,
    pub(super) _share: Option<OwnedSemaphorePermit>,
}

/// Reads the body up to `limit`, taking the bytes received from `budget` as they arrive, and `prepaid` more
/// up front (what decoding it will cost at least); on failure, hands back the rest of the stream so it can be
/// drained.
pub(super) async fn read_body(
    body: Body,
    limit: usize,
    size_hint: usize,
    prepaid: usize,
    budget: &Arc<Semaphore>,
) -> Result<ReadBody, (BodyError, Option<axum::body::BodyDataStream>)> {
    let mut stream = body.into_data_stream();
    // The first allocation is sized by the hint, so the hint is taken up front, with what decoding will cost.
    let mut reserved = size_hint.min(limit);
    let mut share = match take(budget, reserved.saturating_add(prepaid)) {
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
        prepaid,
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

/// Reads and discards what is left of a refused body, up to `cap` bytes and the request deadline, when one of
/// the [`MAX_DRAINS`] turns is free; else nothing.
///
/// Why: an ordinary client writes its whole body before it reads. Answered early, the server closes (HTTP/1.1)
/// or resets the stream (HTTP/2) with the body still arriving, and a TCP close with unread data is a reset
/// that throws away the 413 before the client reads it. Draining costs bandwidth, not memory (chunks are
/// dropped as they come); a sender of more than the drain cap gets the answer and the close.
pub(super) async fn drain(
    turns: &Arc<Semaphore>,
    mut stream: axum::body::BodyDataStream,
    cap: u64,
    deadline: tokio::time::Instant,
) {
    let Ok(_turn) = turns.try_acquire() else {
        return;
    };
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A body of `chunks` chunks of 1 KiB, counting the chunks read.
    fn counted_body(chunks: usize) -> (Body, Arc<AtomicUsize>) {
        let read = Arc::new(AtomicUsize::new(0));
        let counter = read.clone();
        let stream = futures::stream::iter(0..chunks).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![0u8; 1024]))
        });
        (Body::from_stream(stream), read)
    }

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + std::time::Duration::from_secs(10)
    }

    #[tokio::test]
    async fn a_refused_body_is_drained_only_with_a_free_turn() {
        let turns = Arc::new(Semaphore::new(MAX_DRAINS));
        let (body, read) = counted_body(8);
        drain(&turns, body.into_data_stream(), u64::MAX, soon()).await;
        assert_eq!(read.load(Ordering::SeqCst), 8, "a free turn drains it all");
        assert_eq!(
            turns.available_permits(),
            MAX_DRAINS,
            "the turn is given back"
        );

        let _held = turns.try_acquire_many(MAX_DRAINS as u32).unwrap();
        let (body, read) = counted_body(8);
        drain(&turns, body.into_data_stream(), u64::MAX, soon()).await;
        assert_eq!(
            read.load(Ordering::SeqCst),
            0,
            "no turn: nothing is received"
        );
    }

    #[tokio::test]
    async fn draining_stops_past_its_cap() {
        let turns = Arc::new(Semaphore::new(MAX_DRAINS));
        let (body, read) = counted_body(100);
        drain(&turns, body.into_data_stream(), 4 * 1024, soon()).await;
        assert_eq!(
            read.load(Ordering::SeqCst),
            5,
            "stops once more than the cap is read"
        );
    }

    #[tokio::test]
    async fn decoding_is_paid_for_before_a_byte_is_read() {
        let budget = Arc::new(Semaphore::new(1000));
        let (body, read) = counted_body(1);
        // 400 bytes of body and 700 to decode it do not fit in 1000: refused unread.
        match read_body(body, 4096, 400, 700, &budget).await {
            Err((BodyError::Busy, Some(_))) => {}
            _ => panic!("expected busy"),
        }
        assert_eq!(read.load(Ordering::SeqCst), 0);
        assert_eq!(budget.available_permits(), 1000);

        let budget = Arc::new(Semaphore::new(2000));
        let (body, _) = counted_body(1);
        let Ok(body) = read_body(body, 4096, 1024, 300, &budget).await else {
            panic!("expected the body");
        };
        assert_eq!((body.bytes.len(), body.prepaid), (1024, 300));
        assert_eq!(budget.available_permits(), 2000 - 1024 - 300);
        drop(body);
        assert_eq!(budget.available_permits(), 2000);
    }
}

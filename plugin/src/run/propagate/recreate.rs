//! Delete-then-create of a copy Kubernetes cannot change in place (a Secret's `type`, an
//! immutable copy). Once the delete is sent the copy is gone, so the create must happen whatever
//! ends the run: it runs as a task of its own, outside the cluster's deadline and the Lease's
//! abort, retried with back-off ([`ATTEMPTS`], [`BACKOFF`]: a quota freed by the delete, a webhook
//! that was slow, helmop's old copy still terminating behind a finalizer), and the process waits
//! for such tasks before it exits ([`drain`], also on SIGTERM). A create that is still refused
//! leaves the copy `Lost` ("deleted to be recreated, now missing"): the run says so, `--watch`
//! raises a Warning Event and tries again, and no reader of the copy is restamped meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use helmop_core::plan::CopyMeta;
use helmop_core::resource::ResourceRef;
use kube::Client;
use tokio::sync::Notify;

use super::apply;
use crate::cluster::api_error;
use crate::cluster::context::Ctx;
use crate::run::sources::SourceData;

/// Creates tried after the delete (the first one included).
pub const ATTEMPTS: u32 = 5;
/// Pause before the second create; doubled before each further one (0.5 + 1 + 2 + 4 s).
pub const BACKOFF: Duration = Duration::from_millis(500);
/// The longest a process waits for started recreates when it ends.
pub const DRAIN: Duration = Duration::from_secs(60);

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static DONE: Notify = Notify::const_new();

/// Counts one started recreate until dropped.
struct InFlight;

impl InFlight {
    fn start() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        DONE.notify_waiters();
    }
}

/// Waits (at most `limit`) until no started recreate is left; returns how many still are.
pub async fn drain(limit: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let notified = DONE.notified();
        let left = IN_FLIGHT.load(Ordering::SeqCst);
        if left == 0 {
            return 0;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return IN_FLIGHT.load(Ordering::SeqCst);
        }
    }
}

/// How a recreate ended.
#[derive(Debug)]
pub enum Recreated {
    /// The delete was refused (the copy changed or was replaced since it was read): nothing
    /// was lost.
    NotDeleted(kube::Error),
    Done,
    /// Deleted, and every create was refused: why (the last answer).
    Lost(String),
}

/// One copy to recreate.
pub struct Job {
    pub ctx: Ctx,
    pub client: Client,
    pub source: SourceData,
    pub namespace: String,
    pub resource: ResourceRef,
    pub uid: String,
    pub version: String,
    pub meta: CopyMeta,
}

/// Deletes and creates again, as a task that finishes even when the caller is dropped.
pub async fn run(job: Job) -> Recreated {
    let guard = InFlight::start();
    let task = tokio::spawn(async move {
        let _guard = guard;
        recreate(&job).await
    });
    match task.await {
        Ok(done) => done,
        // Only a panic gets here: the copy's fate is unknown, so it is reported lost.
        Err(e) => Recreated::Lost(format!("the recreate task failed: {e}")),
    }
}

async fn recreate(job: &Job) -> Recreated {
    let deleted = apply::delete_copy(
        &job.ctx,
        &job.client,
        &job.namespace,
        &job.resource,
        &job.uid,
        &job.version,
    )
    .await;
    if let Err(e) = deleted {
        return Recreated::NotDeleted(e);
    }
    let mut pause = BACKOFF;
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        match apply::create_copy(
            &job.ctx,
            &job.client,
            &job.source,
            &job.namespace,
            &job.meta,
        )
        .await
        {
            Ok(_) => return Recreated::Done,
            Err(e) => {
                last = match terminating(job).await {
                    Some(why) => why,
                    None => api_error::describe(&e),
                };
                tracing::warn!(
                    namespace = %job.namespace,
                    resource = %job.resource,
                    attempt,
                    error = %last,
                    "creating a deleted copy again was refused"
                );
            }
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Recreated::Lost(last)
}

/// Why a create found the name taken by helmop's own old copy, still terminating (a finalizer
/// holds it), if that is what happened.
async fn terminating(job: &Job) -> Option<String> {
    let finalizers = apply::own_terminating(
        &job.client,
        &job.ctx.upstream_id,
        &job.namespace,
        &job.resource,
    )
    .await?;
    Some(format!(
        "helmop's old copy is still being deleted (finalizers: {})",
        finalizers.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_process_waits_for_started_recreates_but_not_forever() {
        // Nothing started: no wait.
        assert_eq!(drain(Duration::from_secs(5)).await, 0);
        // A recreate outliving the caller that started it (its deadline fired, say).
        let guard = InFlight::start();
        let caller = tokio::spawn(async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        assert_eq!(drain(Duration::from_secs(5)).await, 0);
        let _ = caller.await;
        // One that never ends is left after the limit, and counted.
        let stuck = InFlight::start();
        assert_eq!(drain(Duration::from_millis(100)).await, 1);
        drop(stuck);
        assert_eq!(drain(Duration::from_millis(100)).await, 0);
    }
}

//! Bounded, coalesced live GETs.
//!
//! Every live GET the webhook sends (an object's version, its content, a namespace on a cache miss) goes
//! through one [`Coalescer`]:
//! - **Bound**: at most `max` GETs are in flight at once, across all objects (a semaphore permit per GET
//!   sent, not per caller).
//! - **Coalescing**: callers asking for the same key while a GET for it is queued share that one GET and its
//!   result (an error too). A caller never joins a GET that was already *sent*: it could have been answered
//!   before the caller's write landed, so the caller queues the next GET for that key, sent once the current
//!   one is done. Every result is thus read after its caller asked, as a GET of its own would be, and N
//!   concurrent callers of one key cause at most two GETs per GET round trip instead of N.
//! - Nothing is cached: a key's entry lives only while a GET for it is queued or in flight, and is pruned
//!   when its last caller finishes or gives up (an abandoned admission), so the map never outgrows the
//!   callers waiting on it.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared, WeakShared};
use tokio::sync::Semaphore;

/// The default `--max-live-gets`.
pub const DEFAULT_MAX_LIVE_GETS: usize = 32;

type Flight<V> = Shared<BoxFuture<'static, V>>;

/// The GETs of one key: the one queued (joinable) and the one sent (awaited by the next).
struct Slot<V> {
    queued: Option<(u64, WeakShared<BoxFuture<'static, V>>)>,
    sent: Option<(u64, WeakShared<BoxFuture<'static, V>>)>,
}

impl<V: Clone> Slot<V> {
    /// Forgets GETs nobody awaits any more (every caller gave up); true when nothing is left.
    fn prune(&mut self) -> bool {
        for part in [&mut self.queued, &mut self.sent] {
            if part.as_ref().is_some_and(|(_, w)| w.upgrade().is_none()) {
                *part = None;
            }
        }
        self.queued.is_none() && self.sent.is_none()
    }
}

/// Shares concurrent calls per key and bounds the calls in flight. Cheap to clone.
pub struct Coalescer<K, V> {
    slots: Arc<Mutex<HashMap<K, Slot<V>>>>,
    permits: Arc<Semaphore>,
    next_id: Arc<AtomicU64>,
}

impl<K, V> Clone for Coalescer<K, V> {
    fn clone(&self) -> Self {
        Coalescer {
            slots: self.slots.clone(),
            permits: self.permits.clone(),
            next_id: self.next_id.clone(),
        }
    }
}

impl<K, V> Coalescer<K, V>
where
    K: Hash + Eq + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A coalescer whose calls take permits from `permits` (shared by every coalescer of the process).
    pub fn new(permits: Arc<Semaphore>) -> Self {
        Coalescer {
            slots: Arc::default(),
            permits,
            next_id: Arc::default(),
        }
    }

    /// Keys with a call queued or in flight (for tests: the map must drain).
    pub fn keys(&self) -> usize {
        lock(&self.slots).len()
    }

    /// `call()`'s result for `key`: shared with the callers that join the same queued call.
    /// `call` runs only if this caller is the first to queue one.
    pub async fn run<F, Fut>(&self, key: K, call: F) -> V
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V> + Send + 'static,
    {
        let mut waiting = Prune {
            flight: Some(self.join_or_queue(&key, call)),
            slots: &self.slots,
            key: &key,
        };
        // Polled through the guard, which lets go of the flight before pruning when this caller is dropped.
        std::future::poll_fn(|cx| match waiting.flight.as_mut() {
            Some(flight) => flight.poll_unpin(cx),
            None => std::task::Poll::Pending,
        })
        .await
    }

    fn join_or_queue<F, Fut>(&self, key: &K, call: F) -> Flight<V>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V> + Send + 'static,
    {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(key.clone()).or_insert(Slot {
            queued: None,
            sent: None,
        });
        if let Some(flight) = slot.queued.as_ref().and_then(|(_, w)| w.upgrade()) {
            return flight;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // The GET already sent for this key, if any: ours goes after it, so that it is sent after every
        // caller that joins ours arrived.
        let before = slot.sent.as_ref().and_then(|(_, w)| w.upgrade());
        let (slots_ref, permits, key_owned) =
            (self.slots.clone(), self.permits.clone(), key.clone());
        let fut = call();
        let flight: Flight<V> = async move {
            if let Some(before) = before {
                before.await;
            }
            // The permit is taken before leaving the queue: callers arriving while we wait for it still
            // share this GET. The semaphore is never closed; if it were, the GET would go unbounded.
            let _permit = permits.acquire_owned().await.ok();
            {
                let mut slots = lock(&slots_ref);
                if let Some(slot) = slots.get_mut(&key_owned)
                    && slot.queued.as_ref().is_some_and(|(q, _)| *q == id)
                {
                    slot.sent = slot.queued.take();
                }
            }
            let value = fut.await;
            let mut slots = lock(&slots_ref);
            if let Some(slot) = slots.get_mut(&key_owned) {
                if slot.sent.as_ref().is_some_and(|(s, _)| *s == id) {
                    slot.sent = None;
                }
                if slot.queued.is_none() && slot.sent.is_none() {
                    slots.remove(&key_owned);
                }
            }
            value
        }
        .boxed()
        .shared();
        if let Some(weak) = flight.downgrade() {
            slot.queued = Some((id, weak));
        }
        flight
    }
}

/// Drops the key's entry once nobody awaits its calls (callers that give up never poll them to the end).
struct Prune<'a, K: Hash + Eq, V: Clone> {
    flight: Option<Flight<V>>,
    slots: &'a Mutex<HashMap<K, Slot<V>>>,
    key: &'a K,
}

impl<K: Hash + Eq, V: Clone> Drop for Prune<'_, K, V> {
    fn drop(&mut self) {
        drop(self.flight.take());
        let mut slots = lock(self.slots);
        if slots.get_mut(self.key).is_some_and(Slot::prune) {
            slots.remove(self.key);
        }
    }
}

// A panic while holding the lock leaves the map consistent (every update is one assignment).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use futures::future::join_all;

    /// Counts calls and the most in flight at once; each call sleeps a little so they overlap.
    #[derive(Clone, Default)]
    struct Counting {
        calls: Arc<AtomicUsize>,
        in_flight: Arc<AtomicUsize>,
        max_in_flight: Arc<AtomicUsize>,
    }

    impl Counting {
        fn call(&self, value: u32) -> impl Future<Output = Result<u32, Arc<String>>> + use<> {
            let this = self.clone();
            async move {
                this.calls.fetch_add(1, Ordering::SeqCst);
                let now = this.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                this.max_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                this.in_flight.fetch_sub(1, Ordering::SeqCst);
                if value == 0 {
                    Err(Arc::new("boom".to_string()))
                } else {
                    Ok(value)
                }
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn concurrent_callers_of_one_key_share_one_call() {
        // No permit free: the call stays queued while every caller joins it.
        let permits = Arc::new(Semaphore::new(0));
        let c = Coalescer::<&str, Result<u32, Arc<String>>>::new(permits.clone());
        let counting = Counting::default();
        let callers = join_all((0..50).map(|_| c.run("cm/a", || counting.call(7))));
        let release = async {
            tokio::task::yield_now().await;
            permits.add_permits(1);
        };
        let (results, ()) = tokio::join!(callers, release);
        assert!(results.iter().all(|r| *r == Ok(7)), "{results:?}");
        assert_eq!(counting.calls(), 1);
        assert_eq!(c.keys(), 0, "nothing is kept once the call is done");
    }

    #[tokio::test]
    async fn different_keys_get_separate_calls() {
        let c = Coalescer::<String, Result<u32, Arc<String>>>::new(Arc::new(Semaphore::new(8)));
        let counting = Counting::default();
        let results = join_all((1..=5u32).map(|i| {
            let counting = &counting;
            c.run(format!("cm/{i}"), move || counting.call(i))
        }))
        .await;
        assert_eq!(results, (1..=5).map(Ok).collect::<Vec<_>>());
        assert_eq!(counting.calls(), 5);
        assert_eq!(c.keys(), 0);
    }

    #[tokio::test]
    async fn a_caller_never_joins_a_call_already_sent() {
        let c = Coalescer::<&str, Result<u32, Arc<String>>>::new(Arc::new(Semaphore::new(4)));
        let counting = Counting::default();
        let first = c.run("cm/a", || counting.call(1));
        let later = async {
            // Once the first call is on its way, later callers share the next one.
            while counting.calls() == 0 {
                tokio::task::yield_now().await;
            }
            join_all((0..10).map(|_| c.run("cm/a", || counting.call(2)))).await
        };
        let (first, later) = tokio::join!(first, later);
        assert_eq!(first, Ok(1));
        assert!(later.iter().all(|r| *r == Ok(2)), "{later:?}");
        assert_eq!(counting.calls(), 2);
        assert_eq!(c.keys(), 0);
    }

    #[tokio::test]
    async fn errors_are_shared_but_never_kept() {
        let permits = Arc::new(Semaphore::new(0));
        let c = Coalescer::<&str, Result<u32, Arc<String>>>::new(permits.clone());
        let counting = Counting::default();
        let callers = join_all((0..5).map(|_| c.run("cm/a", || counting.call(0))));
        let release = async {
            tokio::task::yield_now().await;
            permits.add_permits(1);
        };
        let (results, ()) = tokio::join!(callers, release);
        assert!(results.iter().all(|r| r.is_err()), "{results:?}");
        assert_eq!(counting.calls(), 1);
        // The next caller asks again.
        assert_eq!(c.run("cm/a", || counting.call(3)).await, Ok(3));
        assert_eq!(counting.calls(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn never_more_than_the_bound_in_flight() {
        let c = Coalescer::<u32, Result<u32, Arc<String>>>::new(Arc::new(Semaphore::new(3)));
        let counting = Counting::default();
        let tasks: Vec<_> = (1..=40u32)
            .map(|i| {
                let (c, counting) = (c.clone(), counting.clone());
                tokio::spawn(async move { c.run(i % 20, || counting.call(i)).await })
            })
            .collect();
        for t in join_all(tasks).await {
            assert!(matches!(t, Ok(Ok(_))), "{t:?}");
        }
        assert_eq!(counting.max_in_flight.load(Ordering::SeqCst), 3);
        assert!(counting.calls() <= 40);
        assert_eq!(c.keys(), 0);
    }

    #[tokio::test]
    async fn callers_that_give_up_leave_nothing_behind() {
        let permits = Arc::new(Semaphore::new(0));
        let c = Coalescer::<u32, Result<u32, Arc<String>>>::new(permits.clone());
        let counting = Counting::default();
        for key in 0..100 {
            // Queued behind a permit that never comes, then abandoned (an admission past its deadline).
            let gave_up = tokio::time::timeout(
                Duration::from_millis(1),
                join_all((0..3).map(|_| c.run(key, || counting.call(1)))),
            )
            .await;
            assert!(gave_up.is_err());
        }
        assert_eq!(c.keys(), 0);
        assert_eq!(counting.calls(), 0);
        permits.add_permits(1);
        assert_eq!(c.run(1, || counting.call(5)).await, Ok(5));
    }
}

//! The back-off of watches that kube-runtime drives (its `StreamBackoff`), with nodegrace's
//! delays (`plan::reachability::retry_delay`): about a second apart at most while a shutdown
//! runs, client-go's reflector's otherwise. kube's default back-off grows to 30 s whatever the
//! node is doing.
//!
//! `StreamBackoff` resets its back-off on every `Ok`, and kube's watcher emits `Event::Init`
//! before each list: a list refused again and again would be tried about every second for
//! ever (kube's own default back-off too). Here only an answer ends a back-off.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use kube::runtime::utils::{Backoff, StreamBackoff};
use kube::runtime::watcher;
use rand::Rng as _;
use tokio::sync::watch;

use crate::plan::reachability::retry_delay;

/// `watch` tried again after a failure as [`retry_delay`] says. `under_way` is the
/// engine's: true while a shutdown drain runs.
pub(crate) fn backed_off<K, S>(
    watch: S,
    under_way: watch::Receiver<bool>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let backoff = WatchBackoff::new(under_way);
    let failures = backoff.failures.clone();
    let watch = watch.inspect(move |item| {
        if matches!(item, Ok(e) if !matches!(e, watcher::Event::Init)) {
            failures.store(0, Ordering::Relaxed);
        }
    });
    StreamBackoff::new(watch, backoff)
}

struct WatchBackoff {
    /// Failures since the last answer.
    failures: Arc<AtomicU32>,
    under_way: watch::Receiver<bool>,
}

impl WatchBackoff {
    fn new(under_way: watch::Receiver<bool>) -> Self {
        WatchBackoff {
            failures: Arc::default(),
            under_way,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let shutdown = *self.under_way.borrow();
        let failures = self.failures.fetch_add(1, Ordering::Relaxed);
        Some(retry_delay(failures, shutdown, rand::rng().random::<f64>()))
    }
}

impl Backoff for WatchBackoff {
    /// Called by `StreamBackoff` on every `Ok`, `Init` included: [`backed_off`] counts the
    /// answers instead.
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::stream::{self, BoxStream};
    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn a_shutdown_caps_the_wait_at_a_second_from_the_next_failure_on() {
        let (flag, under_way) = watch::channel(false);
        let mut b = WatchBackoff::new(under_way);
        let quiet: Vec<Duration> = (&mut b).take(8).collect();
        assert!(quiet[7] >= Duration::from_secs(30), "{quiet:?}");
        flag.send_replace(true);
        assert!(b.next().is_some_and(|d| d <= Duration::from_secs(1)));
        b.failures.store(0, Ordering::Relaxed);
        flag.send_replace(false);
        assert!(b.next().is_some_and(|d| d < Duration::from_millis(1300)));
    }

    type Listing = Result<watcher::Event<ConfigMap>, watcher::Error>;

    /// A watch whose every list the apiserver refuses, as kube's watcher emits it (`Init`
    /// before each attempt, then the refusal), backed off by `back_off`: when the first `n`
    /// refusals came.
    async fn refusals<S>(
        back_off: impl FnOnce(BoxStream<'static, Listing>) -> S,
        n: usize,
    ) -> Vec<Instant>
    where
        S: Stream<Item = Listing>,
    {
        let refused = Arc::new(Mutex::new(Vec::new()));
        let at = refused.clone();
        let attempts = stream::repeat(()).flat_map(move |()| {
            let at = at.clone();
            let refuse = stream::once(async move {
                at.lock().expect("not poisoned").push(Instant::now());
                Err(watcher::Error::NoResourceVersion)
            });
            stream::iter([Ok(watcher::Event::Init)]).chain(refuse)
        });
        let mut backed_off = std::pin::pin!(back_off(attempts.boxed()));
        let mut errors = 0;
        while errors < n {
            if let Some(Err(_)) = backed_off.next().await {
                errors += 1;
            }
        }
        let refused = refused.lock().expect("not poisoned").clone();
        refused
    }

    /// kube's `StreamBackoff` resets its back-off on every `Ok`, and its watcher emits `Init`
    /// before every list: a back-off reset by it would have a list refused again and again
    /// tried about every second for ever.
    #[tokio::test(start_paused = true)]
    async fn a_list_refused_again_and_again_backs_off_longer_each_time() {
        let (_flag, under_way) = watch::channel(false);
        let refused = refusals(|s| backed_off(s, under_way), 6).await;
        let gaps: Vec<Duration> = refused.windows(2).map(|w| w[1] - w[0]).collect();
        // 800 ms doubling: the fifth wait is 12.8 s at least.
        assert!(gaps[4] >= Duration::from_millis(12_800), "{gaps:?}");
    }
}

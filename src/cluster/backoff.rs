//! The back-off of watches that kube-runtime drives (`WatchStreamExt::backoff`), with
//! nodegrace's delays (`plan::reachability::retry_delay`): about a second apart at most while
//! a shutdown runs, client-go's reflector's otherwise. kube's default back-off grows to 30 s
//! whatever the node is doing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::utils::Backoff;
use rand::Rng as _;

use crate::plan::reachability::retry_delay;

pub(crate) struct WatchBackoff {
    failures: u32,
    shutting_down: Arc<AtomicBool>,
}

impl WatchBackoff {
    /// `shutting_down` is the engine's: true while a shutdown drain runs.
    pub(crate) fn new(shutting_down: Arc<AtomicBool>) -> Self {
        WatchBackoff {
            failures: 0,
            shutting_down,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let shutdown = self.shutting_down.load(Ordering::Relaxed);
        let delay = retry_delay(self.failures, shutdown, rand::rng().random::<f64>());
        self.failures = self.failures.saturating_add(1);
        Some(delay)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shutdown_caps_the_wait_at_a_second_from_the_next_failure_on() {
        let flag = Arc::new(AtomicBool::new(false));
        let mut b = WatchBackoff::new(flag.clone());
        let quiet: Vec<Duration> = (&mut b).take(8).collect();
        assert!(quiet[7] >= Duration::from_secs(30), "{quiet:?}");
        flag.store(true, Ordering::Relaxed);
        assert!(b.next().is_some_and(|d| d <= Duration::from_secs(1)));
        b.reset();
        flag.store(false, Ordering::Relaxed);
        assert!(b.next().is_some_and(|d| d < Duration::from_millis(1300)));
    }
}

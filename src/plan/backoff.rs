//! The one back-off of every retry in nodegrace: a first wait doubled after each failure in a
//! row, up to a cap. Each caller names its first wait and cap; the reasons for them stay with
//! the caller. No I/O.

use std::time::Duration;

/// Waits `first`, `2 × first`, `4 × first`, … up to `cap`, one per failure since the last
/// success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, cap: Duration) -> Self {
        Backoff {
            first,
            cap,
            failures: 0,
        }
    }

    /// The wait after `failures` failures in a row (0: the first wait).
    pub(crate) fn after(first: Duration, cap: Duration, failures: u32) -> Duration {
        first.saturating_mul(1u32 << failures.min(31)).min(cap)
    }

    /// The wait [`Backoff::next`] gives now.
    pub(crate) fn peek(&self) -> Duration {
        Self::after(self.first, self.cap, self.failures)
    }

    /// The wait after one more failure.
    pub(crate) fn next(&mut self) -> Duration {
        let wait = self.peek();
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// A success: the next failure waits `first` again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn waits_double_from_the_first_up_to_the_cap_and_a_success_starts_over() {
        let mut b = Backoff::new(MS(100), MS(1000));
        let waits: Vec<Duration> = (0..6).map(|_| b.next()).collect();
        assert_eq!(
            waits,
            [MS(100), MS(200), MS(400), MS(800), MS(1000), MS(1000)]
        );
        assert_eq!(b.peek(), MS(1000));
        b.reset();
        assert_eq!(b.next(), MS(100));
    }

    proptest::proptest! {
        #[test]
        fn a_wait_is_never_past_the_cap_nor_shorter_than_the_one_before(
            first_ms in 1u64..100_000, cap_ms in 1u64..10_000_000, failures in 0u32..u32::MAX,
        ) {
            let (first, cap) = (MS(first_ms), MS(cap_ms));
            let wait = Backoff::after(first, cap, failures);
            proptest::prop_assert!(wait <= cap);
            proptest::prop_assert!(wait >= first.min(cap));
            if failures > 0 {
                proptest::prop_assert!(wait >= Backoff::after(first, cap, failures - 1));
            }
        }
    }
}

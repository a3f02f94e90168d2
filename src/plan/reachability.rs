//! Can the apiserver be used, and what the node does about it. One state, fed the outcome of
//! every request and watch event (usable or not, and when), answers every question the
//! engine, the drainer and the watches ask about the apiserver:
//!
//! - an outage begins with the first unusable answer after a usable one; once it has lasted a
//!   second it is said in the log ([`Change::WentAway`]), then once a minute
//!   ([`Change::StillAway`]). Shorter ones (one refused request among good ones while an
//!   apiserver starts) are not worth a warning;
//! - it ends with the next usable answer ([`Change::CameBack`]). When it lasted a second or
//!   more ([`worth_acting_on`]) the watches retry at once, without the back-off they built up
//!   during it, and a shutdown under way splits what is left of its budget again over the
//!   steps left. A shorter one changes nothing: one resource refused while the rest answers
//!   would otherwise have its watch retry at every good answer elsewhere;
//! - a shutdown falls back offline once the apiserver has been unusable for
//!   `fallback.apiserver_timeout` ([`Reachability::fallback_at`]);
//! - between tries: [`retry_delay`] (short and capped at about a second while a shutdown
//!   runs, client-go's reflector back-off otherwise).
//!
//! - which answers make it unusable ([`unusable`]): no answer; an answer that fails or
//!   refuses whatever is asked (401, 403, 429, 5xx); a body that cannot be read. The adapter
//!   that saw the answer only says what it was ([`Answer`]).
//!
//! Times are offsets on the caller's monotonic clock.

use std::time::Duration;

/// How often a still unusable apiserver is mentioned in the log again.
pub(crate) const REMINDER: Duration = Duration::from_secs(60);

/// How long an outage lasts before it is said in the log.
pub(crate) const ANNOUNCE_AFTER: Duration = Duration::from_secs(1);

/// An outage shorter than this is not acted on: a throttled request or a restarted watch
/// costs less than the churn of moving every deadline and waking every watch.
pub(crate) const ACT_AFTER: Duration = Duration::from_secs(1);

/// What came back for one request, as [`unusable`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer<'a> {
    /// An HTTP status the apiserver answered with, and its message.
    Status { code: u16, message: &'a str },
    /// The request could not even be built: nothing was asked.
    NotSent,
    /// No answer, or one that cannot be read (a proxy's HTML page, a truncated body).
    NothingReadable,
}

/// How kube-apiserver begins the 500 it answers to an apply its schema refuses.
pub(crate) const TYPED_PATCH_REFUSED: &str = "failed to create typed patch object";

/// Whether an answer says the apiserver cannot be used now, as opposed to an answer about
/// the request itself (404, 409, 422, ...): no answer at all, an answer that fails or
/// refuses this client whatever it asks, or one that cannot be read (nothing is decided on
/// what could not be read). An apiserver that is starting answers 403 to everything until
/// its RBAC caches are loaded, and 5xx while its storage is not ready; such answers are
/// retried, and only their persistence past `fallback.apiserver_timeout` sends a shutdown
/// to the offline fallback ([`Reachability::fallback_at`]).
pub(crate) fn unusable(answer: Answer<'_>) -> bool {
    match answer {
        // A server-side apply the schema refuses (a CRD older than this nodegrace): an answer
        // about the request, however its code reads.
        Answer::Status { code: 500, message } if message.starts_with(TYPED_PATCH_REFUSED) => false,
        Answer::Status { code, .. } => matches!(code, 401 | 403 | 429 | 500..=599),
        Answer::NotSent => false,
        Answer::NothingReadable => true,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Outage {
    since: Duration,
    last_error: String,
    /// When it was last said in the log; None: not yet.
    said: Option<Duration>,
}

/// The apiserver's usability as this node last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reachability {
    outage: Option<Outage>,
    /// When the last outage worth acting on ended ([`worth_acting_on`]).
    came_back: Option<Duration>,
}

/// The apiserver given up on: a shutdown goes to the offline fallback. The one value the
/// route offline is fed by (`plan::lifecycle::route`, through the engine's error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the apiserver has not been usable for {unusable_for:?} (last error: {last_error})")]
pub struct GivenUp {
    /// How long it has not been usable, to the millisecond: at least the timeout (a wait
    /// given up after the timeout counts as the whole of it).
    pub unusable_for: Duration,
    /// The last unusable answer, or "no answer yet".
    pub last_error: String,
}

/// What an outcome changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing to say: usable and still usable, or an outage too short to tell yet.
    Same,
    /// Unusable for [`ANNOUNCE_AFTER`] now (`for_`): say so.
    WentAway { for_: Duration },
    /// Unusable for `for_` now; `remind`: say so again in the log.
    StillAway { for_: Duration, remind: bool },
    /// Usable again after `lost`; `said`: the outage was said in the log.
    CameBack { lost: Duration, said: bool },
}

impl Reachability {
    /// A usable answer at `now`.
    pub(crate) fn answered(&mut self, now: Duration) -> Change {
        match self.outage.take() {
            Some(o) => {
                let lost = now.saturating_sub(o.since);
                if worth_acting_on(lost) {
                    self.came_back = Some(now);
                }
                Change::CameBack {
                    lost,
                    said: o.said.is_some(),
                }
            }
            None => Change::Same,
        }
    }

    /// An unusable answer (or none) at `now`.
    pub(crate) fn failed(&mut self, now: Duration, error: String) -> Change {
        let o = self.outage.get_or_insert(Outage {
            since: now,
            last_error: String::new(),
            said: None,
        });
        o.last_error = error;
        let for_ = now.saturating_sub(o.since);
        match o.said {
            None if for_ >= ANNOUNCE_AFTER => {
                o.said = Some(now);
                Change::WentAway { for_ }
            }
            None => Change::Same,
            Some(said) => {
                let remind = now.saturating_sub(said) >= REMINDER;
                if remind {
                    o.said = Some(now);
                }
                Change::StillAway { for_, remind }
            }
        }
    }

    pub(crate) fn usable(&self) -> bool {
        self.outage.is_none()
    }

    /// Whether the deadlines of a shutdown schedule made at `planned_at` may be acted on now:
    /// the apiserver is usable and no outage worth acting on ended after the schedule was made.
    /// While it cannot be used, the time passing is lost, and the schedule is made again over
    /// what is left when it answers; a deadline of the old schedule that passed meanwhile was
    /// moved by the outage, not reached by the pods.
    pub(crate) fn schedule_holds(&self, planned_at: Duration) -> bool {
        self.usable() && self.came_back.is_none_or(|at| at <= planned_at)
    }

    /// How long every answer has been unusable, at `now`; zero while usable.
    pub(crate) fn unusable_for(&self, now: Duration) -> Duration {
        self.outage
            .as_ref()
            .map_or(Duration::ZERO, |o| now.saturating_sub(o.since))
    }

    pub(crate) fn last_error(&self) -> Option<&str> {
        self.outage.as_ref().map(|o| o.last_error.as_str())
    }

    /// When a shutdown must go to the offline fallback: `timeout` after the outage began.
    /// None while the apiserver is usable.
    pub(crate) fn fallback_at(&self, timeout: Duration) -> Option<Duration> {
        self.outage.as_ref().map(|o| o.since + timeout)
    }

    /// Whether a shutdown must go to the offline fallback at `now`.
    pub(crate) fn must_fall_back(&self, now: Duration, timeout: Duration) -> bool {
        self.fallback_at(timeout).is_some_and(|at| now >= at)
    }

    /// The apiserver given up on at `now` (by a wait that lasted `timeout`, or once
    /// [`Reachability::must_fall_back`]).
    pub(crate) fn given_up(&self, now: Duration, timeout: Duration) -> GivenUp {
        let unusable_for = self.unusable_for(now).max(timeout);
        GivenUp {
            unusable_for: Duration::from_millis(
                u64::try_from(unusable_for.as_millis()).unwrap_or(u64::MAX),
            ),
            last_error: self
                .last_error()
                .map_or_else(|| "no answer yet".to_owned(), str::to_owned),
        }
    }

    /// Whether to give the apiserver up at `now`, after a wait of the caller's own of
    /// `waited` for an answer: once it has been unusable for `timeout`, or the wait has
    /// lasted as long.
    pub(crate) fn give_up(
        &self,
        now: Duration,
        waited: Duration,
        timeout: Duration,
    ) -> Option<GivenUp> {
        (waited >= timeout || self.must_fall_back(now, timeout))
            .then(|| self.given_up(now, timeout))
    }
}

/// Whether an outage that lost `lost` is acted on when it ends: the watches retry at once
/// and a shutdown under way splits its budget again.
pub(crate) fn worth_acting_on(lost: Duration) -> bool {
    lost >= ACT_AFTER
}

/// The wait before try `failures + 1` of a failed watch or request. While a shutdown runs the
/// node must see the apiserver come back within about a second: 200 ms doubling, capped at
/// 1 s. Otherwise client-go's reflector back-off: 800 ms doubling, capped at 30 s. `jitter`
/// in `[0, 1)` stretches the wait by up to half (so a fleet whose apiserver restarts does not
/// come back in step), never past the shutdown's cap.
pub(crate) fn retry_delay(failures: u32, shutdown: bool, jitter: f64) -> Duration {
    let (first, cap) = if shutdown {
        (Duration::from_millis(200), Duration::from_secs(1))
    } else {
        (Duration::from_millis(800), Duration::from_secs(30))
    };
    let base = super::backoff::Backoff::after(first, cap, failures);
    let stretched = base.mul_f64(1.0 + jitter.clamp(0.0, 0.999) / 2.0);
    if shutdown {
        stretched.min(cap)
    } else {
        stretched
    }
}

/// How long a watch may say nothing before its view is listed again. While a shutdown runs,
/// 10 s: its decisions must not rest on a watch hung mid-stream on a connection that lives
/// (the HTTP/2 pings find only dead connections), and listing one node's objects again costs
/// the apiserver little. Otherwise none of ours: kube's watcher gives up on a silent watch
/// after its server timeout (290 s) and 5 s more, and a fleet's quiet watches listed every
/// few seconds would load the apiserver for nothing.
pub(crate) fn watch_silence_limit(shutdown: bool) -> Option<Duration> {
    shutdown.then_some(Duration::from_secs(10))
}

/// How many requests to have in flight at once against an apiserver that may throttle
/// (429): the configured number while it takes them all; halved (down to one) by a batch it
/// throttled, grown again by one per request it took. Throttled requests sent again all at
/// once would mostly be throttled again; fewer at a time get through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    limit: usize,
    max: usize,
}

impl Window {
    pub(crate) fn new(max: usize) -> Self {
        let max = max.max(1);
        Window { limit: max, max }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// The configured number changed (a reload).
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
        self.limit = self.limit.min(self.max);
    }

    /// A batch of requests (or one) was throttled.
    pub(crate) fn throttled(&mut self) {
        self.limit = (self.limit / 2).max(1);
    }

    /// `n` requests were answered without throttling.
    pub(crate) fn taken(&mut self, n: usize) {
        self.limit = self.limit.saturating_add(n).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_refuse_everything_or_none_at_all_make_it_unusable() {
        let status = |code| Answer::Status { code, message: "m" };
        for code in [400, 404, 409, 410, 422] {
            assert!(!unusable(status(code)), "{code}");
        }
        for code in [401, 403, 429, 500, 502, 503, 504] {
            assert!(unusable(status(code)), "{code}");
        }
        let older_crd = Answer::Status {
            code: 500,
            message: "failed to create typed patch object (/shutdown-n1; ...): field not declared in schema",
        };
        assert!(!unusable(older_crd));
        assert!(unusable(Answer::NothingReadable));
        assert!(!unusable(Answer::NotSent));
    }
    use proptest::prelude::*;

    #[test]
    fn only_a_shutdown_bounds_a_silent_watch_and_within_the_offline_timeout() {
        assert_eq!(watch_silence_limit(false), None);
        let limit = watch_silence_limit(true).unwrap();
        // A stale view costs no more than the shipped fallback.apiserver_timeout (10 s)
        // would for an apiserver that does not answer at all.
        assert!(limit <= Duration::from_secs(10), "{limit:?}");
        // Not faster than a pod's own events come while it terminates.
        assert!(limit >= Duration::from_secs(5), "{limit:?}");
    }

    #[test]
    fn a_throttled_window_halves_to_one_and_grows_back_by_what_is_taken() {
        let mut w = Window::new(64);
        assert_eq!(w.limit(), 64);
        w.throttled();
        assert_eq!(w.limit(), 32);
        for _ in 0..10 {
            w.throttled();
        }
        assert_eq!(w.limit(), 1);
        w.taken(1);
        w.taken(2);
        assert_eq!(w.limit(), 4);
        w.taken(1000);
        assert_eq!(w.limit(), 64);
        w.set_max(8);
        assert_eq!(w.limit(), 8);
        w.set_max(0);
        assert_eq!(w.limit(), 1, "never below one");
        assert_eq!(Window::new(0).limit(), 1);
    }

    proptest! {
        #[test]
        fn a_window_stays_within_one_and_its_max(max in 0usize..200, steps in proptest::collection::vec(proptest::option::of(0usize..50), 0..64)) {
            let mut w = Window::new(max);
            for step in steps {
                match step {
                    Some(n) => w.taken(n),
                    None => w.throttled(),
                }
                prop_assert!(w.limit() >= 1 && w.limit() <= max.max(1));
            }
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn an_outage_is_said_once_it_lasted_a_second_and_then_once_a_minute() {
        let mut r = Reachability::default();
        assert_eq!(r.answered(S(1)), Change::Same);
        assert_eq!(r.failed(S(2), "refused".into()), Change::Same);
        assert_eq!(r.failed(MS(2_999), "refused".into()), Change::Same);
        assert_eq!(
            r.failed(S(3), "refused".into()),
            Change::WentAway { for_: S(1) }
        );
        assert_eq!(
            r.failed(S(4), "refused".into()),
            Change::StillAway {
                for_: S(2),
                remind: false
            }
        );
        assert_eq!(
            r.failed(S(63), "timed out".into()),
            Change::StillAway {
                for_: S(61),
                remind: true
            }
        );
        assert_eq!(
            r.failed(S(64), "timed out".into()),
            Change::StillAway {
                for_: S(62),
                remind: false
            }
        );
        assert_eq!(r.last_error(), Some("timed out"));
    }

    #[test]
    fn the_apiserver_is_given_up_after_the_timeout_of_its_outage_or_of_a_wait() {
        let timeout = S(15);
        let mut r = Reachability::default();
        // Usable, but a wait for what it never delivered lasted the timeout.
        assert_eq!(r.give_up(S(3), MS(14_999), timeout), None);
        assert_eq!(
            r.give_up(S(3), S(15), timeout),
            Some(GivenUp {
                unusable_for: S(15),
                last_error: "no answer yet".into()
            })
        );
        r.failed(S(10), "HTTP 503".into());
        assert_eq!(r.give_up(MS(24_999), S(1), timeout), None);
        let given_up = r.give_up(Duration::new(40, 123_456_789), S(1), timeout);
        assert_eq!(
            given_up,
            Some(GivenUp {
                unusable_for: MS(30_123),
                last_error: "HTTP 503".into()
            })
        );
        assert_eq!(
            given_up.map(|g| g.to_string()).as_deref(),
            Some("the apiserver has not been usable for 30.123s (last error: HTTP 503)")
        );
    }

    #[test]
    fn a_blip_is_not_said() {
        let mut r = Reachability::default();
        r.failed(S(2), "403 while RBAC loads".into());
        assert!(!r.usable());
        assert_eq!(
            r.answered(MS(2_300)),
            Change::CameBack {
                lost: MS(300),
                said: false
            }
        );
    }

    #[test]
    fn the_first_usable_answer_ends_the_outage_and_says_how_long_it_was() {
        let mut r = Reachability::default();
        r.failed(S(10), "x".into());
        r.failed(S(12), "x".into());
        assert!(!r.usable());
        assert_eq!(r.unusable_for(S(14)), S(4));
        assert_eq!(
            r.answered(MS(17_500)),
            Change::CameBack {
                lost: MS(7_500),
                said: true
            }
        );
        assert!(r.usable());
        assert_eq!(r.unusable_for(S(20)), Duration::ZERO);
        assert_eq!(r.answered(S(21)), Change::Same);
        assert_eq!(r.last_error(), None);
    }

    #[test]
    fn the_fallback_is_due_the_timeout_after_the_outage_began_not_after_the_last_error() {
        let mut r = Reachability::default();
        let timeout = S(10);
        assert_eq!(r.fallback_at(timeout), None);
        assert!(!r.must_fall_back(S(100), timeout));
        r.failed(S(5), "x".into());
        r.failed(S(14), "x".into());
        assert_eq!(r.fallback_at(timeout), Some(S(15)));
        assert!(!r.must_fall_back(MS(14_999), timeout));
        assert!(r.must_fall_back(S(15), timeout));
        // One usable answer starts the count again.
        r.answered(S(15));
        r.failed(S(16), "x".into());
        assert!(!r.must_fall_back(S(25), timeout));
        assert!(r.must_fall_back(S(26), timeout));
    }

    #[test]
    fn only_an_outage_of_a_second_or_more_is_acted_on() {
        assert!(!worth_acting_on(MS(999)));
        assert!(worth_acting_on(S(1)));
        assert!(worth_acting_on(S(30)));
    }

    #[test]
    fn retries_during_a_shutdown_are_at_most_a_second_apart() {
        let delays: Vec<Duration> = (0..6).map(|f| retry_delay(f, true, 0.0)).collect();
        assert_eq!(delays, [MS(200), MS(400), MS(800), S(1), S(1), S(1)]);
        assert_eq!(retry_delay(40, true, 0.99), S(1));
    }

    #[test]
    fn retries_otherwise_back_off_like_client_go() {
        let delays: Vec<Duration> = (0..8).map(|f| retry_delay(f, false, 0.0)).collect();
        assert_eq!(
            delays,
            [
                MS(800),
                MS(1600),
                MS(3200),
                MS(6400),
                MS(12_800),
                MS(25_600),
                S(30),
                S(30)
            ]
        );
        assert_eq!(retry_delay(3, false, 0.5), MS(8000));
        assert_eq!(retry_delay(u32::MAX, false, 0.0), S(30));
    }

    proptest! {
        /// Every wait is within its bounds, and more failures never wait less.
        #[test]
        fn retry_delays_are_bounded_and_grow(failures in 0u32..64, shutdown: bool, jitter in 0.0f64..1.0) {
            let d = retry_delay(failures, shutdown, jitter);
            let (first, cap) = if shutdown { (MS(200), S(1)) } else { (MS(800), S(45)) };
            prop_assert!(d >= first && d <= cap, "{d:?}");
            prop_assert!(retry_delay(failures + 1, shutdown, 0.0) >= retry_delay(failures, shutdown, 0.0));
        }

        /// Over any sequence of outcomes: the outage is as long as the time since its first
        /// failure; it ends at the first usable answer, which reports exactly that length;
        /// the fallback is due exactly `timeout` after the outage began.
        #[test]
        fn an_outage_is_measured_from_its_first_failure(
            steps in proptest::collection::vec((0u64..5_000, any::<bool>()), 1..40),
            timeout_ms in 1u64..20_000,
        ) {
            let mut r = Reachability::default();
            let mut now = Duration::ZERO;
            let mut began: Option<Duration> = None;
            let mut said = false;
            for (advance, usable) in steps {
                now += MS(advance);
                if usable {
                    let change = r.answered(now);
                    match began.take() {
                        Some(b) => prop_assert!(
                            matches!(change, Change::CameBack { lost, .. } if lost == now - b),
                            "{:?}", change
                        ),
                        None => prop_assert_eq!(change, Change::Same),
                    }
                } else {
                    let change = r.failed(now, "e".into());
                    if began.is_none() {
                        began = Some(now);
                    }
                    // Said exactly once, the first time it has lasted a second.
                    if matches!(change, Change::WentAway { .. }) {
                        prop_assert!(!said && now - began.unwrap_or(now) >= ANNOUNCE_AFTER);
                        said = true;
                    }
                }
                if began.is_none() {
                    said = false;
                }
                prop_assert_eq!(r.usable(), began.is_none());
                prop_assert_eq!(r.unusable_for(now), began.map_or(Duration::ZERO, |b| now - b));
                prop_assert_eq!(
                    r.must_fall_back(now, MS(timeout_ms)),
                    began.is_some_and(|b| now - b >= MS(timeout_ms))
                );
            }
        }
    }
}

//! A drainer whose drains finish when the test says so, recording every call.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::watch;

use nodegrace::{route, CancelCause, Drainer, Route, RouteEvent, ShutdownRequest, Way};

/// A shutdown's whole drain the way the daemon's lifecycle takes it, leg after leg as
/// [`route`] says, for tests that drive a drainer without the daemon: Ok once the drain is
/// over, an error when a leg failed or the route did.
pub async fn drain_through(
    drainer: &dyn Drainer,
    req: &ShutdownRequest,
    fallback_enabled: bool,
) -> anyhow::Result<()> {
    let mut req = req.clone();
    let mut way = Way::Connecting;
    loop {
        let ended = drainer.drain(&req, way).await?;
        req.resumed |= ended == RouteEvent::ApiserverBack;
        way = match route(ended, fallback_enabled) {
            Route::Go(next) => next,
            Route::Done => return Ok(()),
            Route::Fail => anyhow::bail!(
                "the apiserver cannot be reached and the offline fallback is disabled"
            ),
        };
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMode {
    /// Every drain returns at once.
    Immediate,
    /// A drain returns after [`ScriptedDrainer::finish`].
    UntilFinished,
    /// A drain never returns (only the budget ends it).
    Forever,
}

#[derive(Debug, Clone)]
pub struct DrainCall {
    pub req: ShutdownRequest,
    pub started: std::time::Instant,
    pub started_tokio: tokio::time::Instant,
    pub finished: Option<std::time::Instant>,
    /// The drain future was dropped before it finished (budget end, cancel, stop).
    pub dropped: bool,
}

#[derive(Debug, Clone, Default)]
pub struct DrainRecord {
    pub drains: Vec<DrainCall>,
    /// Every leg asked for, [`Way::Connecting`] included, with its request.
    pub legs: Vec<(Way, ShutdownRequest)>,
    pub cancels: Vec<ShutdownRequest>,
    /// Why each of `cancels` was cancelled.
    pub cancel_causes: Vec<CancelCause>,
    pub after_boots: u32,
}

struct Shared {
    mode: Mutex<DrainMode>,
    /// How the next legs end, first first; once empty, as `mode` says.
    script: Mutex<std::collections::VecDeque<RouteEvent>>,
    record: Mutex<DrainRecord>,
    finish: watch::Sender<u64>,
    changed: watch::Sender<u64>,
}

#[derive(Clone)]
pub struct ScriptedDrainer {
    shared: Arc<Shared>,
}

struct DropGuard {
    shared: Arc<Shared>,
    index: usize,
    done: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.done {
            if let Ok(mut r) = self.shared.record.lock() {
                r.drains[self.index].dropped = true;
            }
            self.shared.changed.send_modify(|v| *v += 1);
        }
    }
}

impl ScriptedDrainer {
    pub fn new(mode: DrainMode) -> Self {
        ScriptedDrainer {
            shared: Arc::new(Shared {
                mode: Mutex::new(mode),
                script: Mutex::default(),
                record: Mutex::new(DrainRecord::default()),
                finish: watch::channel(0).0,
                changed: watch::channel(0).0,
            }),
        }
    }

    pub fn set_mode(&self, mode: DrainMode) {
        if let Ok(mut m) = self.shared.mode.lock() {
            *m = mode;
        }
    }

    /// Lets every running `UntilFinished` drain return.
    pub fn finish(&self) {
        self.shared.finish.send_modify(|v| *v += 1);
    }

    pub fn record(&self) -> DrainRecord {
        self.shared
            .record
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    pub async fn wait_until(&self, mut pred: impl FnMut(&DrainRecord) -> bool) -> DrainRecord {
        let mut rx = self.shared.changed.subscribe();
        loop {
            let r = self.record();
            if pred(&r) {
                return r;
            }
            if rx.changed().await.is_err() {
                return r;
            }
        }
    }

    /// The next legs end as `ended` says, one each, before any drain of `mode`.
    pub fn legs(&self, ended: impl IntoIterator<Item = RouteEvent>) {
        if let Ok(mut s) = self.shared.script.lock() {
            s.extend(ended);
        }
    }

    fn bump(&self) {
        self.shared.changed.send_modify(|v| *v += 1);
    }
}

#[async_trait]
impl Drainer for ScriptedDrainer {
    /// The legs scripted with [`ScriptedDrainer::legs`] end at once as scripted; then it
    /// connects at once and the drain is the cluster's.
    async fn drain(&self, req: &ShutdownRequest, way: Way) -> anyhow::Result<RouteEvent> {
        if let Ok(mut r) = self.shared.record.lock() {
            r.legs.push((way, req.clone()));
        }
        let scripted = self
            .shared
            .script
            .lock()
            .ok()
            .and_then(|mut s| s.pop_front());
        if let Some(ended) = scripted {
            self.bump();
            return Ok(ended);
        }
        if way == Way::Connecting {
            return Ok(RouteEvent::Begin { engine: true });
        }
        let started = std::time::Instant::now();
        let mode = self
            .shared
            .mode
            .lock()
            .map(|m| *m)
            .unwrap_or(DrainMode::Immediate);
        let mut finish = self.shared.finish.subscribe();
        finish.mark_unchanged();
        let index = {
            let mut r = self
                .shared
                .record
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?;
            r.drains.push(DrainCall {
                req: req.clone(),
                started,
                started_tokio: tokio::time::Instant::now(),
                finished: None,
                dropped: false,
            });
            r.drains.len() - 1
        };
        self.bump();
        let mut guard = DropGuard {
            shared: self.shared.clone(),
            index,
            done: false,
        };
        match mode {
            DrainMode::Immediate => {}
            DrainMode::UntilFinished => {
                let _ = finish.changed().await;
            }
            DrainMode::Forever => std::future::pending::<()>().await,
        }
        guard.done = true;
        if let Ok(mut r) = self.shared.record.lock() {
            r.drains[index].finished = Some(std::time::Instant::now());
        }
        self.bump();
        Ok(RouteEvent::OnlineDrained)
    }

    async fn cancel(&self, req: &ShutdownRequest, cause: CancelCause) -> anyhow::Result<()> {
        if let Ok(mut r) = self.shared.record.lock() {
            r.cancels.push(req.clone());
            r.cancel_causes.push(cause);
        }
        self.bump();
        Ok(())
    }

    async fn after_boot(&self) -> anyhow::Result<()> {
        if let Ok(mut r) = self.shared.record.lock() {
            r.after_boots += 1;
        }
        self.bump();
        Ok(())
    }
}

//! A private bus with the fakes on it, and daemons wired to it, under one directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use tokio::task::JoinHandle;

use super::{EventLog, FakeState, Fakes, PrivateBus, RecordingNotifier};
use nodegrace::{Daemon, DaemonHandle, DaemonPaths, Drainer, Settings, ZbusConnector};

pub struct TestEnv {
    pub dir: PathBuf,
    pub bus: PrivateBus,
    pub fakes: Fakes,
    pub log: EventLog,
}

/// A daemon running in a task of the test's runtime.
pub struct RunningDaemon {
    pub handle: DaemonHandle,
    pub task: JoinHandle<Result<()>>,
}

impl RunningDaemon {
    /// Simulates `kill -9`: the daemon's future is dropped, its fds closed by the drop.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

impl TestEnv {
    /// Starts a bus on `dir/bus.sock` and puts the fakes on it. The fake logind reads
    /// drop-ins from `dir/logind.conf.d`, which is also where the daemon writes.
    pub async fn start(dir: &Path, mut state: FakeState) -> Result<Self> {
        let dropins = dir.join("logind.conf.d");
        std::fs::create_dir_all(&dropins)?;
        if state.dropin_dir.is_none() {
            state.dropin_dir = Some(dropins);
        }
        let bus = PrivateBus::start(&dir.join("bus.sock"))?;
        let log = EventLog::default();
        let fakes = Fakes::new(state, log.clone());
        fakes.serve(bus.address()).await?;
        Ok(TestEnv {
            dir: dir.to_path_buf(),
            bus,
            fakes,
            log,
        })
    }

    /// Defaults, with every path under the test directory.
    pub fn settings(&self) -> Settings {
        let mut s = Settings {
            state_dir: self.dir.join("state"),
            ..Settings::default()
        };
        s.shutdown.logind_dropin_dir = self.dir.join("logind.conf.d");
        s.static_pods.gate_dir = self.dir.join("state/gated-manifests");
        s.static_pods.manifest_dir = self.dir.join("manifests");
        s
    }

    pub fn paths(&self) -> DaemonPaths {
        DaemonPaths {
            status_file: self.dir.join("status.json"),
            logind_search_dirs: vec![self.dir.join("logind.conf.d")],
        }
    }

    pub fn daemon(&self, settings: Settings, drainer: Arc<dyn Drainer>) -> Daemon {
        Daemon::new(
            settings,
            self.paths(),
            Arc::new(ZbusConnector::at(self.bus.address())),
            drainer,
            Arc::new(RecordingNotifier {
                log: self.log.clone(),
            }),
        )
    }

    pub fn spawn(&self, daemon: Daemon) -> RunningDaemon {
        let handle = daemon.handle();
        RunningDaemon {
            handle,
            task: tokio::spawn(daemon.run()),
        }
    }

    /// Spawns a daemon with [`TestEnv::daemon`] and waits until it is armed.
    pub async fn spawn_armed(
        &self,
        settings: Settings,
        drainer: Arc<dyn Drainer>,
    ) -> RunningDaemon {
        self.spawn_until_armed(self.daemon(settings, drainer)).await
    }

    /// Spawns `daemon` and waits (at most 20 s) until it holds its inhibitor and is armed.
    pub async fn spawn_until_armed(&self, daemon: Daemon) -> RunningDaemon {
        let d = self.spawn(daemon);
        let armed = d.handle.wait_for(|s| s.phase == nodegrace::Phase::Armed);
        match tokio::time::timeout(std::time::Duration::from_secs(20), armed).await {
            Ok(Some(_)) => d,
            Ok(None) => panic!("the daemon stopped before it was armed"),
            Err(_) => panic!("the daemon was not armed within 20 s"),
        }
    }

    /// How many of logind's inhibitors taken by nodegrace are held now.
    pub fn held_by_us(&self) -> usize {
        self.fakes
            .state()
            .taken_by("nodegrace")
            .iter()
            .filter(|i| i.held())
            .count()
    }

    /// Kills the bus daemon, starts a new one on the same socket, puts the fakes back.
    pub async fn restart_bus(&mut self) -> Result<()> {
        self.fakes.disconnect();
        self.bus.restart()?;
        self.fakes.serve(self.bus.address()).await
    }
}

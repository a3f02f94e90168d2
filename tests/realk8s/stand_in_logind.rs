//! A logind stand-in for a real kubelet's Graceful Node Shutdown: the test kit's fake
//! `org.freedesktop.login1` (and `systemd1`) on a private `dbus-daemon`, which the kubelet
//! (and a node's nodegrace) use as their system bus through `DBUS_SYSTEM_BUS_ADDRESS`. It
//! answers `InhibitDelayMaxUSec`, hands out delay locks as pipes (it sees the moment each is
//! closed) and emits `PrepareForShutdown` as logind does. The real logind of an nspawn node
//! refuses the kubelet on the host (`../shared/realk8s/README.md`), so the kubelet's GNS and
//! nodegrace meet on this one.

use std::path::PathBuf;
use std::time::Duration;

use nodegrace_testkit::{EventLog, FakeState, Fakes, PrivateBus};

/// The socket's file name in [`StandInLogind::dir`], as the system bus's.
pub const SOCKET: &str = "system_bus_socket";

pub struct StandInLogind {
    pub fakes: Fakes,
    _bus: PrivateBus,
    tmp: tempfile::TempDir,
    /// The bus address on the host (for the kubelet's `DBUS_SYSTEM_BUS_ADDRESS`).
    pub address: String,
}

impl StandInLogind {
    /// A stand-in whose `InhibitDelayMaxSec` is `delay`; it re-reads the value, as logind
    /// does on SIGHUP, from the `*.conf` files of [`StandInLogind::dropin_dir`].
    pub async fn start(delay: Duration) -> StandInLogind {
        // Short: a socket path has 108 bytes.
        let tmp = tempfile::Builder::new()
            .prefix("ngbus-")
            .tempdir_in("/tmp")
            .expect("bus dir");
        std::fs::create_dir_all(tmp.path().join("bus")).expect("bus socket dir");
        std::fs::create_dir_all(tmp.path().join("logind.conf.d")).expect("logind.conf.d");
        let bus = PrivateBus::start(&tmp.path().join("bus").join(SOCKET)).expect("dbus-daemon");
        let mut state = FakeState::with_delay(delay);
        state.dropin_dir = Some(tmp.path().join("logind.conf.d"));
        let fakes = Fakes::new(state, EventLog::default());
        fakes.serve(bus.address()).await.expect("logind stand-in");
        StandInLogind {
            address: bus.address().to_owned(),
            fakes,
            _bus: bus,
            tmp,
        }
    }

    /// The directory holding the bus socket [`SOCKET`] (bound into a node).
    pub fn socket_dir(&self) -> PathBuf {
        self.tmp.path().join("bus")
    }

    /// Where the stand-in reads logind.conf.d drop-ins from (bound into a node at
    /// /etc/systemd/logind.conf.d).
    pub fn dropin_dir(&self) -> PathBuf {
        self.tmp.path().join("logind.conf.d")
    }

    /// Whether `who` holds a delay lock now.
    pub fn holds_delay(&self, who: &str) -> bool {
        self.fakes
            .state()
            .taken_by(who)
            .iter()
            .any(|i| i.held() && i.mode == "delay")
    }
}

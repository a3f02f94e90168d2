//! One connection's worth of adapters: logind and the systemd manager.

use std::sync::Arc;

use anyhow::{Context, Result};
use async_trait::async_trait;

use crate::logind::{Logind, ZbusLogind};
use crate::systemd::{SystemdManager, ZbusSystemd};

/// A logind that stops answering must not wedge the state machine (D-Bus' usual 25 s).
const METHOD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(25);

/// The adapters of one bus connection; dropping the last clone closes it.
#[derive(Clone)]
pub struct Bus {
    pub logind: Arc<dyn Logind>,
    pub systemd: Arc<dyn SystemdManager>,
}

/// Opens a new connection each time: the daemon calls it again after any bus fault.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    async fn connect(&self) -> Result<Bus>;
}

/// The system bus, or a given address (tests, `nodegrace-sim`).
#[derive(Debug, Clone, Default)]
pub struct ZbusConnector {
    address: Option<String>,
}

impl ZbusConnector {
    /// `$DBUS_SYSTEM_BUS_ADDRESS`, else the standard system bus socket.
    pub fn system() -> Self {
        ZbusConnector { address: None }
    }

    pub fn at(address: impl Into<String>) -> Self {
        ZbusConnector {
            address: Some(address.into()),
        }
    }
}

#[async_trait]
impl Connector for ZbusConnector {
    async fn connect(&self) -> Result<Bus> {
        let builder = match &self.address {
            Some(a) => zbus::connection::Builder::address(a.as_str())
                .with_context(|| format!("bad bus address {a}"))?,
            None => zbus::connection::Builder::system().context("the system bus address")?,
        };
        let conn = builder
            .method_timeout(METHOD_TIMEOUT)
            .build()
            .await
            .with_context(|| match &self.address {
                Some(a) => format!("connecting to the bus at {a}"),
                None => "connecting to the system bus".to_string(),
            })?;
        Ok(Bus {
            logind: Arc::new(ZbusLogind::new(&conn).await?),
            systemd: Arc::new(ZbusSystemd::new(&conn).await?),
        })
    }
}

//! SIGHUP: reading the configuration again off the loop, and keeping the keys that only
//! apply after a restart.

use super::*;

impl Machine {
    pub(super) fn start_reload(&mut self) {
        let Some(reloader) = self.reloader.clone() else {
            tracing::info!("nothing to reload");
            return;
        };
        if self
            .reload_abandoned
            .as_ref()
            .is_some_and(|read| !read.is_finished())
        {
            tracing::error!(
                "the configuration read abandoned earlier has still not ended (a file on a hung filesystem?): not read again; keeping the running configuration"
            );
            return;
        }
        self.reload_abandoned = None;
        self.reloading = Some(tokio::task::spawn_blocking(move || reloader()));
        self.reload_give_up = Some(instant_after(RELOAD_TIMEOUT));
    }

    pub(super) fn on_reloaded(&mut self, r: Result<Result<Settings>, JoinError>) {
        let r = r.unwrap_or_else(|e| Err(anyhow::anyhow!("the reload task failed: {e}")));
        match r {
            Ok(new) if new == self.settings => tracing::info!("configuration unchanged"),
            Ok(new) => {
                let pending = crate::config::restart_required(&self.settings, &new);
                if !pending.is_empty() {
                    tracing::warn!(keys = ?pending, "these changes take effect after a restart");
                }
                self.settings = crate::config::keep_restart_only(&self.settings, new);
                self.drainer.reload(&self.settings);
                tracing::info!("configuration reloaded");
            }
            Err(e) => tracing::error!(
                error = %crate::cluster::error_text(&e),
                "invalid configuration on reload; keeping the running one"
            ),
        }
    }
}

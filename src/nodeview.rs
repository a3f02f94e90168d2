//! The node's own view of its pods (`plan::bandend` decides what it means): whether the
//! container runtime still runs something of a pod, and whether any of the pod's volumes is
//! still mounted under the kubelet's root directory (`<root>/pods/<uid>/volumes/...`) — the
//! two things the kubelet waits for before it deletes a terminating pod from the API.
//!
//! The volumes are read from the mount table rather than by comparing each volume
//! directory's device with its parent's, as the kubelet does: a stat of a dead network mount
//! blocks, and a bind mount on the same device looks unmounted to the kubelet's check. The
//! table sees every mount that check sees, so it never says unmounted where the kubelet would
//! still wait.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::cri::{ContainerState, Runtime, SandboxState};
use crate::plan::bandend::{NodeView, OnNode};

/// Asks the node about its pods.
#[async_trait]
pub trait PodsOnNode: Send + Sync + 'static {
    /// What the node shows of the pods the kubelet runs under these UIDs. A pod it could not
    /// tell about has `None` where it could not.
    async fn look(&self, uids: &[String]) -> NodeView;
}

/// The CRI runtime and the mount table.
pub struct RuntimeAndMounts {
    runtime: Arc<dyn Runtime>,
    kubelet_root: PathBuf,
    mount_table: PathBuf,
}

/// A look that takes longer is not waited for: the API decides that pass.
const LOOK_TIMEOUT: Duration = Duration::from_secs(1);

impl RuntimeAndMounts {
    pub fn new(runtime: Arc<dyn Runtime>, kubelet_root: PathBuf) -> Self {
        Self {
            runtime,
            kubelet_root,
            mount_table: PathBuf::from("/proc/self/mountinfo"),
        }
    }

    /// The UIDs the runtime runs a ready sandbox or a container (not exited) of; None: it did
    /// not answer, or ran a container of a sandbox it did not list.
    async fn running(&self) -> Option<HashSet<String>> {
        // Containers first: a sandbox that had one then is still listed after, unless both
        // were removed in between.
        let containers = self.runtime.list_containers(None).await.ok()?;
        let sandboxes = self.runtime.list_pod_sandboxes().await.ok()?;
        let owner: HashMap<&str, &str> = sandboxes
            .iter()
            .map(|s| (s.id.as_str(), s.uid.as_str()))
            .collect();
        let mut running: HashSet<String> = sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| s.uid.clone())
            .collect();
        for c in containers
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
        {
            running.insert((*owner.get(c.sandbox_id.as_str())?).to_owned());
        }
        Some(running)
    }

    /// The UIDs with a volume mounted; None: the mount table or the root could not be read.
    async fn mounted(&self) -> Option<HashSet<String>> {
        let root = tokio::fs::canonicalize(&self.kubelet_root).await.ok()?;
        let table = tokio::fs::read_to_string(&self.mount_table).await.ok()?;
        Some(pods_with_volumes_mounted(&root, &table))
    }
}

#[async_trait]
impl PodsOnNode for RuntimeAndMounts {
    async fn look(&self, uids: &[String]) -> NodeView {
        let both = async { tokio::join!(self.running(), self.mounted()) };
        let (running, mounted) = tokio::time::timeout(LOOK_TIMEOUT, both)
            .await
            .unwrap_or((None, None));
        uids.iter()
            .map(|uid| {
                let on_node = OnNode {
                    running: running.as_ref().map(|r| r.contains(uid)),
                    mounted: mounted.as_ref().map(|m| m.contains(uid)),
                };
                (uid.clone(), on_node)
            })
            .collect()
    }
}

/// The pod UIDs with a mount point under `<root>/pods/<uid>/volumes/` in a
/// `/proc/<pid>/mountinfo` table.
fn pods_with_volumes_mounted(root: &Path, table: &str) -> HashSet<String> {
    let pods = root.join("pods");
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter_map(|point| {
            let point = PathBuf::from(unescape_octal(point));
            let mut rest = point.strip_prefix(&pods).ok()?.components();
            let uid = rest.next()?.as_os_str().to_str()?.to_owned();
            let volumes = rest.next()?.as_os_str() == "volumes";
            (volumes && rest.next().is_some()).then_some(uid)
        })
        .collect()
}

/// The kernel writes a space, tab, newline and backslash in a mount table's path as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4);
        let code = digits
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match code {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /var/lib/kubelet/pods/aaa/volumes/kubernetes.io~projected/kube-api-access-x rw - tmpfs tmpfs rw
31 22 0:26 / /var/lib/kubelet/pods/bbb/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/sdb rw
32 22 0:27 / /var/lib/kubelet/pods/ccc/volume-subpaths/data/app/0 rw - ext4 /dev/sdb rw
33 22 0:28 / /var/lib/kubelet/pods/ddd/etc-hosts rw - ext4 /dev/sda1 rw
34 22 0:29 / /var/lib/kubelet/pods/eee/volumes rw - tmpfs tmpfs rw
35 22 0:30 / /var/lib/kubelet/pods/f\\040f/volumes/kubernetes.io~empty-dir/cache rw - tmpfs tmpfs rw
36 22 0:31 / /var/lib/kubelet-other/pods/ggg/volumes/a/b rw - tmpfs tmpfs rw
";

    #[test]
    fn only_mounts_inside_a_pods_volumes_directory_count() {
        let mut found: Vec<String> =
            pods_with_volumes_mounted(Path::new("/var/lib/kubelet"), TABLE)
                .into_iter()
                .collect();
        found.sort();
        assert_eq!(found, ["aaa", "bbb", "f f"]);
    }

    #[test]
    fn octal_escapes_are_read_and_anything_else_is_kept() {
        assert_eq!(unescape_octal(r"a\040b\134c"), r"a b\c");
        assert_eq!(unescape_octal(r"a\09b\"), r"a\09b\");
    }
}

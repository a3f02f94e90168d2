//! The pod API of 1.37 for a daemon on a v1.28 apiserver: an HTTP proxy between the node's
//! nodegrace and the apiserver that shows a test pod's [`RESPONDERS_ANNOTATION`] as what a
//! 1.37 apiserver serves, `spec.evictionResponders` (the annotation taken away), in pod
//! GET, LIST and WATCH answers; everything else passes unchanged. Upstream it speaks with
//! the node's own credential (the minted `nodegrace:node:<node>` certificate), so RBAC, the
//! admission policy and the audit log see the node, as they would without the proxy. The
//! daemon reaches it over plain `http://` on 127.0.0.1 (the node shares the host's network).

use std::convert::Infallible;
use std::path::Path;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use kube::Client;
use serde_json::Value;
use tokio::task::JoinHandle;

use super::lifecycle::RESPONDERS_ANNOTATION;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

pub struct RespondersProxy {
    pub port: u16,
    task: JoinHandle<()>,
}

impl Drop for RespondersProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RespondersProxy {
    /// Listens on a free port of 127.0.0.1 and forwards as `kubeconfig`'s identity.
    pub async fn open(kubeconfig: &Path) -> RespondersProxy {
        let upstream = super::client_from(kubeconfig).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        forward(upstream.clone(), request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        RespondersProxy { port, task }
    }

    /// `from` (a kubeconfig of the apiserver at https://127.0.0.1:6443) pointed at this
    /// proxy, written to `to`.
    pub fn kubeconfig(&self, from: &Path, to: &Path) {
        let text = std::fs::read_to_string(from).expect("read kubeconfig");
        assert!(text.contains("https://127.0.0.1:6443"), "{from:?}");
        let through = text.replace(
            "https://127.0.0.1:6443",
            &format!("http://127.0.0.1:{}", self.port),
        );
        std::fs::write(to, through).expect("write kubeconfig");
    }
}

/// Moves the pod's [`RESPONDERS_ANNOTATION`] into `spec.evictionResponders`.
pub fn as_served_by_1_37(pod: &mut Value) {
    let Some(text) = pod
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
        .and_then(|a| a.remove(RESPONDERS_ANNOTATION))
    else {
        return;
    };
    if let (Some(responders), Some(spec)) = (
        text.as_str()
            .and_then(|t| serde_json::from_str::<Value>(t).ok()),
        pod.get_mut("spec").and_then(Value::as_object_mut),
    ) {
        spec.insert("evictionResponders".to_owned(), responders);
    }
}

/// What a pod answer becomes: a Pod, a PodList's items, or a watch event's object.
fn rewrite(body: &[u8]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    match value.get("kind").and_then(Value::as_str) {
        Some("Pod") => as_served_by_1_37(&mut value),
        Some("PodList") => {
            for pod in value
                .get_mut("items")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                as_served_by_1_37(pod);
            }
        }
        // A watch event: {"type": ..., "object": {...}}.
        None => as_served_by_1_37(value.get_mut("object")?),
        Some(_) => return None,
    }
    serde_json::to_vec(&value).ok()
}

/// `/api/v1/pods`, `/api/v1/namespaces/<ns>/pods` and `.../pods/<name>`, no subresource.
fn is_pod_read(method: &http::Method, path: &str) -> bool {
    if method != http::Method::GET {
        return false;
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(
        parts.as_slice(),
        ["api", "v1", "pods"]
            | ["api", "v1", "namespaces", _, "pods"]
            | ["api", "v1", "namespaces", _, "pods", _]
    )
}

fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=1" || kv == "watch=true"))
}

async fn forward(
    upstream: Client,
    request: http::Request<Incoming>,
) -> Result<http::Response<ProxyBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let pod_read = is_pod_read(&parts.method, parts.uri.path());
    let watch = is_watch(parts.uri.query());
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(err) => return Ok(status(502, &format!("reading the request: {err}"))),
    };
    let mut builder = http::Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        // The upstream client authenticates and frames on its own; answers come uncompressed
        // so that the proxy can read them.
        if matches!(
            name.as_str(),
            "host"
                | "authorization"
                | "connection"
                | "content-length"
                | "transfer-encoding"
                | "accept-encoding"
        ) {
            continue;
        }
        builder = builder.header(name, value);
    }
    let request = match builder.body(kube::client::Body::from(body.to_vec())) {
        Ok(r) => r,
        Err(err) => return Ok(status(502, &format!("building the request: {err}"))),
    };
    let response = match upstream.send(request).await {
        Ok(r) => r,
        Err(err) => return Ok(status(502, &format!("upstream: {err}"))),
    };
    let (mut parts, body) = response.into_parts();
    for name in ["content-length", "transfer-encoding", "connection"] {
        parts.headers.remove(name);
    }
    if !pod_read || !parts.status.is_success() {
        let body = body.map_err(|e| Box::new(e) as BoxError).boxed_unsync();
        return Ok(http::Response::from_parts(parts, body));
    }
    if watch {
        // One JSON object per line; a line is passed on once it is whole.
        let mut pending: Vec<u8> = Vec::new();
        let lines = body.into_data_stream().map(move |chunk| {
            let chunk = chunk.map_err(|e| Box::new(e) as BoxError)?;
            pending.extend_from_slice(&chunk);
            let mut out = Vec::new();
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let text = &line[..line.len() - 1];
                match rewrite(text) {
                    Some(new) => out.extend_from_slice(&new),
                    None => out.extend_from_slice(text),
                }
                out.push(b'\n');
            }
            Ok::<_, BoxError>(Frame::data(Bytes::from(out)))
        });
        return Ok(http::Response::from_parts(
            parts,
            BodyExt::boxed_unsync(StreamBody::new(lines)),
        ));
    }
    let whole = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(err) => return Ok(status(502, &format!("reading the answer: {err}"))),
    };
    let out = rewrite(&whole).map_or(whole, Bytes::from);
    Ok(http::Response::from_parts(parts, full(out)))
}

fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn status(code: u16, message: &str) -> http::Response<ProxyBody> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "code": code});
    let mut response = http::Response::new(full(Bytes::from(body.to_string())));
    *response.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_annotation_becomes_its_field_in_every_kind_of_answer() {
        let pod = serde_json::json!({"kind": "Pod", "metadata": {"name": "p", "annotations": {
            RESPONDERS_ANNOTATION: "[{\"name\":\"a.example.com/x\",\"priority\":10000}]",
            "other": "kept"}}, "spec": {"containers": []}});
        let field = serde_json::json!([{"name": "a.example.com/x", "priority": 10000}]);
        let check = |v: &Value| {
            assert_eq!(v.pointer("/spec/evictionResponders"), Some(&field), "{v}");
            assert_eq!(
                v.pointer("/metadata/annotations/other"),
                Some(&"kept".into())
            );
            assert!(v
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(RESPONDERS_ANNOTATION))
                .is_none());
        };
        let one: Value =
            serde_json::from_slice(&rewrite(pod.to_string().as_bytes()).unwrap()).unwrap();
        check(&one);
        let list = serde_json::json!({"kind": "PodList", "items": [pod.clone()]});
        let list: Value =
            serde_json::from_slice(&rewrite(list.to_string().as_bytes()).unwrap()).unwrap();
        check(&list["items"][0]);
        let event = serde_json::json!({"type": "ADDED", "object": pod});
        let event: Value =
            serde_json::from_slice(&rewrite(event.to_string().as_bytes()).unwrap()).unwrap();
        check(&event["object"]);
        assert!(is_pod_read(&http::Method::GET, "/api/v1/namespaces/n/pods"));
        assert!(is_pod_read(&http::Method::GET, "/api/v1/pods"));
        assert!(!is_pod_read(
            &http::Method::GET,
            "/api/v1/namespaces/n/pods/p/eviction"
        ));
        assert!(!is_pod_read(
            &http::Method::POST,
            "/api/v1/namespaces/n/pods"
        ));
        assert!(is_watch(Some("fieldSelector=x&watch=true")));
    }
}

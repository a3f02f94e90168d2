//! For the unit tests of the sites that read the apiserver's answers through this module:
//! a refusal as kube's client hands it over, and a client whose requests get canned answers.

use std::convert::Infallible;
use std::sync::Arc;

use kube::core::Status;
use serde_json::{json, Value};

use super::Failure;

/// The apiserver's answer `status`, as a [`Failure`].
pub(crate) fn refused(status: Box<Status>) -> Failure {
    Failure::new(kube::Error::Api(status))
}

/// A Status body with `code` and `message`, and the reason the apiserver gives that code.
pub(crate) fn status_body(code: u16, message: &str) -> Value {
    let reason = match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        422 => "Invalid",
        429 => "TooManyRequests",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

/// A client whose every request is answered `answer(method, path)`: a status code and a
/// JSON body (see [`status_body`] for a refusal's).
pub(crate) fn answering(
    answer: impl Fn(&http::Method, &str) -> (u16, Value) + Send + Sync + 'static,
) -> kube::Client {
    let answer = Arc::new(answer);
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (code, body) = answer(req.method(), req.uri().path());
        async move {
            let response = http::Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    body.to_string(),
                )))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

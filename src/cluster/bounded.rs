//! Every answer of the apiserver bounded: a body over [`MAX_ANSWER_BYTES`] (or one watch
//! event over [`MAX_WATCH_EVENT_BYTES`]) is an error instead of memory, and an answer that is
//! not a watch may be given a deadline for the whole of it, headers and body. A broken proxy
//! streaming without end otherwise grew the daemon by hundreds of MB a second, and a server
//! that accepted and never answered held a command for good.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// The largest answer taken: what a node asks for is its own objects (its Node, its pods,
/// the maintenances and eviction requests about them, a few certificate requests), a few MiB
/// even with hundreds of pods; `credentials approve` lists the cluster's requests, ~2 KiB
/// each. 64 MiB leaves room for tens of thousands of them.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The largest single event of a watch (one object): etcd stores at most 1.5 MiB per object
/// unless configured otherwise.
pub(crate) const MAX_WATCH_EVENT_BYTES: usize = 16 << 20;

/// Why an answer was cut off.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    #[error("the apiserver's answer is larger than {} MiB, nodegrace's cap on one answer (a node's own objects take far less): is a proxy in the way sending without end?", MAX_ANSWER_BYTES >> 20)]
    TooLarge,
    #[error("one event of the apiserver's watch is larger than {} MiB, nodegrace's cap on one object: is a proxy in the way sending without end?", MAX_WATCH_EVENT_BYTES >> 20)]
    EventTooLarge,
    #[error("the apiserver did not answer in full within {0:?}")]
    NoAnswer(Duration),
}

/// Bounds the answers of the service below it; `deadline` applies to every request that is
/// not a watch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoundedLayer {
    pub deadline: Option<Duration>,
}

impl<S> Layer<S> for BoundedLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            deadline: self.deadline,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Bounded<S> {
    inner: S,
    deadline: Option<Duration>,
}

/// kube asks for a watch with `watch=true`; its body is a stream of events with no end.
fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

type AnswerFuture<B> =
    Pin<Box<dyn Future<Output = Result<Response<BoundedBody<B>>, BoxError>> + Send>>;

impl<S, ReqBody, B> Service<Request<ReqBody>> for Bounded<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<B>>;
    type Error = BoxError;
    type Future = AnswerFuture<B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let watch = is_watch(req.uri());
        let deadline = self.deadline.filter(|_| !watch);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = match deadline {
                Some(d) => tokio::time::timeout(d, answer)
                    .await
                    .map_err(|_| AnswerError::NoAnswer(d))?,
                None => answer.await,
            }
            .map_err(Into::into)?;
            let until = deadline.map(|d| Box::pin(tokio::time::sleep_until(Instant::now() + d)));
            Ok(response.map(|body| BoundedBody {
                body: Box::pin(body),
                watch,
                deadline: until.zip(deadline),
                counted: 0,
            }))
        })
    }
}

/// A body that errs once it passes its cap or its deadline.
pub(crate) struct BoundedBody<B> {
    body: Pin<Box<B>>,
    watch: bool,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    /// Bytes of the whole body, or of a watch's current event (since its last line break).
    counted: usize,
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some((sleep, d)) = this.deadline.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(AnswerError::NoAnswer(*d).into())));
            }
        }
        let frame = match ready!(this.body.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref() {
            let (counted, cap, error) = if this.watch {
                let since_break = match data.iter().rposition(|b| *b == b'\n') {
                    Some(i) => data.len() - i - 1,
                    None => this.counted.saturating_add(data.len()),
                };
                (
                    since_break,
                    MAX_WATCH_EVENT_BYTES,
                    AnswerError::EventTooLarge,
                )
            } else {
                (
                    this.counted.saturating_add(data.len()),
                    MAX_ANSWER_BYTES,
                    AnswerError::TooLarge,
                )
            };
            this.counted = counted;
            if counted > cap {
                return Poll::Ready(Some(Err(error.into())));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_by_their_query() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert!(is_watch(&uri("/api/v1/pods?fieldSelector=x&watch=true")));
        assert!(is_watch(&uri("/api/v1/pods?watch=1")));
        assert!(!is_watch(&uri("/api/v1/pods?watch=false")));
        assert!(!is_watch(&uri("/api/v1/pods?labelSelector=watch%3Dtrue")));
        assert!(!is_watch(&uri("/api/v1/pods")));
    }
}

use std::cell::RefCell;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::*;

/// What a caller's record was told.
#[derive(Default)]
struct Record(RefCell<Vec<Option<String>>>);

impl Reach for Record {
    fn usable_answer(&self) {
        self.0.borrow_mut().push(None);
    }
    fn unusable_answer(&self, error: &str) {
        self.0.borrow_mut().push(Some(error.to_owned()));
    }
}

impl Record {
    /// Whether the one answer recorded said the apiserver cannot be used.
    fn marked_unusable(&self) -> bool {
        let told = self.0.borrow();
        assert_eq!(told.len(), 1, "one record per answer: {told:?}");
        told[0].is_some()
    }
}

fn status(code: u16, message: &str) -> kube::Error {
    kube::Error::Api(Box::new(
        serde_json::from_value(json!({"code": code, "message": message})).unwrap(),
    ))
}

fn budget_429() -> kube::Error {
    kube::Error::Api(Box::new(
        serde_json::from_value(json!({
            "code": 429,
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{
                "reason": "DisruptionBudget",
                "message": "The disruption budget db-pdb needs 2 healthy pods",
            }]},
        }))
        .unwrap(),
    ))
}

fn throttled_asking(secs: u32) -> kube::Error {
    kube::Error::Api(Box::new(
        serde_json::from_value(json!({
            "code": 429,
            "reason": "TooManyRequests",
            "message": "Too many requests, please try again later.",
            "details": {"retryAfterSeconds": secs},
        }))
        .unwrap(),
    ))
}

fn garbage(body: &str) -> kube::Error {
    kube::Error::SerdeError(serde_json::from_str::<Node>(body).unwrap_err())
}

#[test]
fn each_answer_is_read_once_into_its_kind_and_recorded() {
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    let one_s = Duration::from_secs(1);
    // (what came back, its kind, whether the apiserver is marked unusable)
    let table: Vec<(&str, kube::Error, Kind, bool)> = vec![
        ("400", status(400, "m"), Kind::Refused { code: Some(400) }, false),
        ("401", status(401, "m"), Kind::Unusable, true),
        // 403 to everything while a starting apiserver loads its RBAC caches.
        ("403", status(403, "m"), Kind::Unusable, true),
        ("404", status(404, "m"), Kind::NotFound, false),
        ("409", status(409, "m"), Kind::Conflict, false),
        ("410", status(410, "m"), Kind::Refused { code: Some(410) }, false),
        ("422", status(422, "m"), Kind::Refused { code: Some(422) }, false),
        ("429 without a Status body", status(429, "m"), Kind::Throttled { retry_after: one_s }, true),
        ("429 asking 7 s", throttled_asking(7), Kind::Throttled { retry_after: Duration::from_secs(7) }, true),
        ("429 asking an hour", throttled_asking(3600), Kind::Throttled { retry_after: MAX_RETRY_AFTER }, true),
        ("429 of a disruption budget", budget_429(), Kind::Refused { code: Some(429) }, false),
        ("500", status(500, "etcdserver: request timed out"), Kind::Unusable, true),
        // What kube-apiserver v1.28 answered to a status apply with a field an older CRD
        // lacks: about the request, however its code reads.
        (
            "500 of an older CRD's schema",
            status(500, "failed to create typed patch object (/shutdown-n1; nodegrace.dev/v1alpha1, Kind=NodeMaintenance): .status.nodeStatuses[nodeName=\"n1\"].deadlineReplan: field not declared in schema"),
            Kind::Refused { code: Some(500) },
            false,
        ),
        ("502", status(502, "m"), Kind::Unusable, true),
        ("503", status(503, "m"), Kind::Unusable, true),
        ("504", status(504, "m"), Kind::Unusable, true),
        // Codes no apiserver sends: an answer about the request, never a panic.
        ("0 (an unknown watch event)", status(0, ""), Kind::Refused { code: Some(0) }, false),
        ("302", status(302, "m"), Kind::Refused { code: Some(302) }, false),
        ("999", status(999, "m"), Kind::Refused { code: Some(999) }, false),
        ("connection refused", kube::Error::Service(Box::new(refused)), Kind::Unusable, true),
        ("a proxy's HTML page", garbage("<html><body>502 Bad Gateway</body></html>"), Kind::Unusable, true),
        ("a body cut short", garbage("{\"kind\":\"Node\",\"meta"), Kind::Unusable, true),
    ];
    for (what, err, kind, unusable) in table {
        let record = Record::default();
        let r: Reply<()> = answer(
            &record,
            Err(anyhow::Error::from(err).context("patching node n1")),
        );
        let failure = r.unwrap_err();
        assert_eq!(failure.kind, kind, "{what}");
        assert_eq!(record.marked_unusable(), unusable, "{what}");
        assert!(
            failure.text().starts_with("patching node n1: "),
            "{what}: {}",
            failure.text()
        );
    }
}

#[test]
fn the_object_and_errors_not_of_the_apiserver_record_a_usable_answer() {
    let record = Record::default();
    assert_eq!(answer(&record, Ok::<_, anyhow::Error>(7)).unwrap(), 7);
    assert!(!record.marked_unusable());
    let record = Record::default();
    let r: Reply<()> = answer(&record, Err(anyhow::anyhow!("no kube error at all")));
    assert_eq!(r.unwrap_err().kind, Kind::Refused { code: None });
    assert!(!record.marked_unusable());
}

#[test]
fn a_throttled_request_of_a_paced_window_records_nothing() {
    let record = Record::default();
    let r: Reply<()> = answer_paced(&record, Err(status(429, "m")));
    assert_eq!(r.unwrap_err().throttled(), Some(Duration::from_secs(1)));
    assert!(record.0.borrow().is_empty());
    let r: Reply<()> = answer_paced(&record, Err(status(503, "m")));
    assert!(r.unwrap_err().apiserver_unusable());
    assert!(record.marked_unusable());
}

#[test]
fn a_watch_error_is_recorded_by_what_it_says() {
    let cases: Vec<(&str, watcher::Error, bool)> = vec![
        (
            "503 on the list",
            watcher::Error::InitialListFailed(status(503, "m")),
            true,
        ),
        (
            "CRD not installed",
            watcher::Error::InitialListFailed(status(404, "m")),
            true,
        ),
        (
            "410 Gone on the watch",
            watcher::Error::WatchFailed(status(410, "too old")),
            false,
        ),
        (
            "an event of an unknown type",
            watcher::Error::WatchFailed(status(0, "")),
            false,
        ),
        (
            "an object without a resourceVersion",
            watcher::Error::NoResourceVersion,
            false,
        ),
    ];
    for (what, err, unusable) in cases {
        let record = Record::default();
        watch_failed(&record, "Pod", &err);
        assert_eq!(record.marked_unusable(), unusable, "{what}");
    }
    let crd = Record::default();
    watch_failed(
        &crd,
        "NodeMaintenance",
        &watcher::Error::WatchStartFailed(status(404, "m")),
    );
    assert!(crd.0.borrow()[0]
        .as_deref()
        .unwrap()
        .contains("is its CRD installed?"));
}

#[test]
fn the_status_answered_is_kept_with_its_context() {
    let f =
        Failure::new(anyhow::Error::from(status(422, "spec.x: Invalid value")).context("writing"));
    assert_eq!(f.code(), Some(422));
    assert!(f.answered());
    assert_eq!(
        f.status().map(|s| s.message.as_str()),
        Some("spec.x: Invalid value")
    );
    let f = f.context("the pass");
    assert_eq!(f.kind, Kind::Refused { code: Some(422) });
    assert_eq!(
        f.text(),
        "the pass: writing: HTTP 422: spec.x: Invalid value"
    );
    let unreached = Failure::new(garbage("<html>"));
    assert!(!unreached.answered());
    assert_eq!(unreached.code(), None);
}

fn api_error(code: u16, reason: &str, message: &str) -> anyhow::Error {
    anyhow::Error::new(kube::Error::Api(Box::new(Status {
        code,
        reason: reason.into(),
        message: message.into(),
        ..Status::default()
    })))
}

#[test]
fn an_apiserver_status_reads_as_http_code_reason_and_message() {
    let empty = api_error(500, "InternalError", "").context("listing the pods of node-a");
    assert_eq!(
        error_text(&empty),
        "listing the pods of node-a: HTTP 500 (InternalError)"
    );
    let forbidden = api_error(
        403,
        "Forbidden",
        "pods is forbidden: User \"x\" cannot list",
    );
    assert_eq!(
        error_text(&forbidden),
        "HTTP 403 (Forbidden): pods is forbidden: User \"x\" cannot list"
    );
    assert_eq!(error_text(&api_error(502, "", "")), "HTTP 502");
    let other = anyhow::anyhow!("refused").context("connecting");
    assert_eq!(error_text(&other), format!("{other:#}"));
}

#[test]
fn an_apiserver_message_of_megabytes_is_clipped() {
    let huge = "x".repeat(10 << 20);
    let text = error_text(&api_error(500, &huge, &huge).context("listing the Events"));
    assert!(text.len() < 2000, "{} bytes", text.len());
    assert!(
        text.starts_with("listing the Events: HTTP 500 (xxx"),
        "{text}"
    );
    assert!(text.contains("characters left out"), "{text}");
}

#[test]
fn an_error_passed_up_is_recorded_only_when_unusable() {
    let record = Record::default();
    let f = passed_up(
        &record,
        anyhow::Error::from(status(503, "m")).context("a pass"),
    );
    assert!(f.apiserver_unusable());
    assert!(record.marked_unusable());
    // Not the apiserver's, or an answer about the request: it may not say the apiserver
    // answered, so nothing is recorded.
    for err in [
        anyhow::anyhow!("the plan failed"),
        anyhow::Error::from(status(422, "m")),
    ] {
        let record = Record::default();
        passed_up(&record, err);
        assert!(record.0.borrow().is_empty());
    }
}

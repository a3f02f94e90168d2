use super::*;
use serde_json::json;

fn eviction(v: serde_json::Value) -> Eviction {
    serde_json::from_value(v).unwrap()
}

fn with_status(status: serde_json::Value) -> Eviction {
    eviction(json!({
        "metadata": {"name": "e", "namespace": "ns"},
        "spec": {"target": {"pod": {"name": "p", "uid": "u1"}}},
        "status": status,
    }))
}

#[test]
fn requester_keys_are_valid_and_never_reserved() {
    assert_eq!(requester_key("worker-1"), "nodegrace.dev/worker-1");
    assert_eq!(
        requester_key("ip-10-0-0-1.eu-west-1.compute.internal"),
        "nodegrace.dev/ip-10-0-0-1.eu-west-1.compute.internal"
    );
    let long = format!("{}.example.internal", "n".repeat(70));
    let key = requester_key(&long);
    assert!(domain_prefixed_key_problem(&key).is_none(), "{key}");
    assert!(key.len() <= REQUESTER_DOMAIN.len() + 1 + 63);
    // Two long names sharing their first 46 characters still differ.
    let other = format!("{}.example.other", "n".repeat(70));
    assert_ne!(key, requester_key(&other));
    assert_eq!(key, requester_key(&long), "stable");
    for node in ["a", "worker-1", &long, "x".repeat(253).as_str()] {
        let key = requester_key(node);
        assert!(domain_prefixed_key_problem(&key).is_none(), "{key}");
        assert!(!is_reserved_domain(&key));
    }
}

proptest::proptest! {
    #[test]
    fn every_node_name_yields_a_valid_unreserved_key(
        node in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?){0,4}"
    ) {
        let key = requester_key(&node);
        proptest::prop_assert!(domain_prefixed_key_problem(&key).is_none(), "{}", key);
        proptest::prop_assert!(!is_reserved_domain(&key));
    }
}

#[test]
fn the_old_crd_requester_name_is_not_a_valid_key() {
    assert!(domain_prefixed_key_problem("worker-1.nodemaintenance.nodegrace.dev").is_some());
    assert!(domain_prefixed_key_problem("example.com/ok_name.1").is_none());
    assert!(domain_prefixed_key_problem("Example.com/x").is_some());
    assert!(domain_prefixed_key_problem("example.com/-x").is_some());
    assert!(domain_prefixed_key_problem("example.com/").is_some());
    assert!(domain_prefixed_key_problem(&format!("example.com/{}", "x".repeat(64))).is_some());
    assert!(is_reserved_domain("imperative-eviction.k8s.io/evictor"));
    assert!(is_reserved_domain("k8s.io/x"));
    assert!(is_reserved_domain("apps.kubernetes.io/x"));
    assert!(!is_reserved_domain("notk8s.io/x"));
}

#[test]
fn request_names_are_dns_subdomains_per_pod() {
    let name = request_name("6f1c5a52-5d43-4b52-9a3e-0a9b8f1d2c3e");
    assert_eq!(name, "nodegrace-6f1c5a52-5d43-4b52-9a3e-0a9b8f1d2c3e");
    assert!(crate::plan::names::is_dns_subdomain(&name));
}

#[test]
fn an_eviction_reads_as_pending_responding_evicted_or_failed() {
    assert_eq!(
        read_eviction(&with_status(json!({})), "u1"),
        Progress::Pending
    );
    let active = with_status(json!({
        "targetResponders": [
            {"name": "db.example.com/operator", "priority": 10000, "state": "Completed"},
            {"name": IMPERATIVE_EVICTOR, "priority": 100, "state": "Active"}],
        "responders": [
            {"name": "db.example.com/operator", "message": "done"},
            {"name": IMPERATIVE_EVICTOR, "message": "Cannot evict pod as it would violate the pod's disruption budget. number of retries: 3"}],
    }));
    let progress = read_eviction(&active, "u1");
    assert_eq!(
        respond(&progress),
        Response::Report(Some(
            "Cannot evict pod as it would violate the pod's disruption budget.".into()
        ))
    );
    // Upstream's code words its retries `(attempts=N)`.
    let ours = with_status(json!({
        "targetResponders": [{"name": IMPERATIVE_EVICTOR, "priority": 100, "state": "Active"}],
        "responders": [{"name": IMPERATIVE_EVICTOR,
            "message": "evicting pod \"pg\" through the Eviction API failed (attempts=4): PodDisruptionBudget pg-pdb: refused"}],
    }));
    assert_eq!(
        respond(&read_eviction(&ours, "u1")),
        Response::Report(Some(
            "evicting pod \"pg\" through the Eviction API failed: PodDisruptionBudget pg-pdb: refused".into()
        ))
    );
    let evicted_by_ours = with_status(json!({
        "targetResponders": [{"name": IMPERATIVE_EVICTOR, "priority": 100, "state": "Active"}],
        "responders": [{"name": IMPERATIVE_EVICTOR,
            "message": "pod \"pg\" was evicted through the Eviction API and terminates gracefully"}],
    }));
    assert_eq!(
        respond(&read_eviction(&evicted_by_ours, "u1")),
        Response::Report(None),
        "an eviction carried out holds nothing"
    );
    let custom = with_status(json!({
        "targetResponders": [{"name": "db.example.com/operator", "priority": 10000, "state": "Active"}],
        "responders": [{"name": "db.example.com/operator", "message": "draining replicas"}],
    }));
    assert_eq!(
        respond(&read_eviction(&custom, "u1")),
        Response::Report(Some(
            "responder db.example.com/operator: draining replicas".into()
        ))
    );
    let evicted = with_status(json!({"conditions": [
        {"type": "TargetEvicted", "status": "True", "reason": "PodDeleted", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"},
        {"type": "Failed", "status": "False", "reason": "Succeeded", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
    assert_eq!(read_eviction(&evicted, "u1"), Progress::Evicted);
    assert_eq!(respond(&Progress::Evicted), Response::Report(None));
    let failed = with_status(json!({"conditions": [
        {"type": "Failed", "status": "True", "reason": "NoFurtherResponder", "message": "All responders have completed without evicting the target", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
    assert!(matches!(
        respond(&read_eviction(&failed, "u1")),
        Response::EvictDirectly { why } if why.starts_with("NoFurtherResponder")
    ));
    let canceled = with_status(json!({"conditions": [
        {"type": "Failed", "status": "True", "reason": "CanceledDueToNoRequesters", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
    assert_eq!(respond(&read_eviction(&canceled, "u1")), Response::Nothing);
}

#[test]
fn an_evictors_refusals_are_counted_by_its_attempts_and_named_by_the_apis_words() {
    let evictor = |name: &str, message: &str| Progress::Responding {
        responder: name.into(),
        message: Some(message.into()),
    };
    let ours = IMPERATIVE_EVICTOR;
    let cases = [
        (
            evictor(IMPERATIVE_EVICTOR, "Cannot evict pod as it would violate the pod's disruption budget., number of retries: 3"),
            Some((IMPERATIVE_EVICTOR, 3, Refusal::Budget)),
        ),
        (
            evictor(IMPERATIVE_EVICTOR, "Too many requests, please try again later., number of retries: 2"),
            Some((IMPERATIVE_EVICTOR, 2, Refusal::Throttled)),
        ),
        (
            evictor(IMPERATIVE_EVICTOR, "pods \"db\" is forbidden: denied, number of retries: 1"),
            Some((IMPERATIVE_EVICTOR, 1, Refusal::Error)),
        ),
        (
            evictor(ours, "evicting pod \"pg\" through the Eviction API failed (attempts=4): PodDisruptionBudget pg-pdb: refused"),
            Some((ours, 4, Refusal::Budget)),
        ),
        // Not a refusal, not an evictor, no count: nothing to count.
        (evictor(IMPERATIVE_EVICTOR, "pod evicted"), None),
        (
            evictor("db.example.com/operator", "disruption budget, number of retries: 3"),
            None,
        ),
        (evictor(IMPERATIVE_EVICTOR, "number of retries: none"), None),
        (Progress::Pending, None),
        (Progress::Evicted, None),
    ];
    for (progress, want) in cases {
        let got = evictor_refusals(&progress);
        let got = got
            .as_ref()
            .map(|r| (r.evictor.as_str(), r.attempts, r.reason));
        assert_eq!(got, want, "{progress:?}");
    }
}

#[test]
fn a_refused_request_is_evicted_directly_and_a_pending_one_waits() {
    let request = |status: serde_json::Value| -> EvictionRequest {
        serde_json::from_value(json!({
            "metadata": {"name": "nodegrace-u1", "namespace": "ns"},
            "spec": {"intent": "Eviction", "requester": "nodegrace.dev/n1",
                "target": {"pod": {"name": "p", "uid": "u1"}}},
            "status": status,
        }))
        .unwrap()
    };
    let invalid = request(json!({"conditions": [
        {"type": "Failed", "status": "True", "reason": "EvictionInvalid", "message": "Target pod references a SchedulingGroup. Eviction is currently not supported.", "lastTransitionTime": "2026-11-24T10:00:00Z"},
        {"type": "TargetEvicted", "status": "False", "reason": "EvictionFailed", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
    assert!(matches!(
        read_request(&invalid).as_ref().map(respond),
        Some(Response::EvictDirectly { why }) if why.contains("SchedulingGroup")
    ));
    let waiting = request(json!({"conditions": [
        {"type": "Failed", "status": "False", "reason": "AwaitingEviction", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
    assert_eq!(read_request(&waiting), None);
    assert_eq!(read_request(&request(json!({}))), None);
}

#[test]
fn an_eviction_of_another_pod_is_refused() {
    let e = with_status(json!({"conditions": [
        {"type": "Failed", "status": "True", "reason": "NoFurtherResponder", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
    assert_eq!(
        respond(&read_eviction(&e, "u2")),
        Response::Refuse {
            named_uid: "u1".into()
        }
    );
}

fn field(list: &[(&str, i32)]) -> Vec<EvictionResponder> {
    list.iter()
        .map(|(n, p)| EvictionResponder {
            name: (*n).into(),
            priority: *p,
        })
        .collect()
}

#[test]
fn valid_responders_raise_no_problem() {
    let f = field(&[
        ("db.example.com/operator", 10000),
        ("backup.example.com/x", 2000),
    ]);
    let check = check_responders(Some(&f));
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.responders.len(), 2);
    let none = check_responders(None);
    assert!(none.problems.is_empty() && none.responders.is_empty());
    assert!(check_responders(Some(&[])).responders.is_empty());
}

#[test]
fn too_many_invalid_twice_declared_and_reserved_responders_are_named() {
    let many: Vec<(String, i32)> = (0..11)
        .map(|i| (format!("r{i}.example.com/x"), 5000))
        .collect();
    let refs: Vec<(&str, i32)> = many.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let check = check_responders(Some(&field(&refs)));
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert!(check.problems[0].contains("11 responders"));

    let bad = field(&[
        ("no-prefix", 5000),
        ("x.k8s.io/mine", 5000),
        ("low.example.com/x", 500),
        ("high.example.com/x", 100_001),
        ("high.example.com/x", 100_001),
    ]);
    let problems = check_responders(Some(&bad)).problems;
    assert_eq!(problems.len(), 6, "{problems:?}");
    assert!(problems[0].contains("no domain prefix"));
    assert!(problems[1].contains("reserved for Kubernetes"));
    assert!(problems[2].contains("reserved for *.k8s.io"));
    assert!(problems[3].contains("outside 0..=100000"));
    assert!(problems[4].contains("declared twice"));
}

fn valid_responders() -> impl proptest::strategy::Strategy<Value = Vec<(String, i32)>> {
    use proptest::strategy::Strategy;
    let name = "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?){0,3}/[A-Za-z0-9]([-A-Za-z0-9_.]{0,30}[A-Za-z0-9])?"
        .prop_filter("not a reserved domain", |n| !is_reserved_domain(n));
    proptest::collection::btree_map(
        name,
        RESERVED_PRIORITY_MAX + 1..=MAX_RESPONDER_PRIORITY,
        0..=MAX_POD_RESPONDERS,
    )
    .prop_map(|m| m.into_iter().collect::<Vec<_>>())
    .prop_shuffle()
}

proptest::proptest! {
    #[test]
    fn responders_within_the_in_tree_rules_raise_no_problem_and_keep_their_order(list in valid_responders()) {
        let refs: Vec<(&str, i32)> = list.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let check = check_responders(Some(&field(&refs)));
        proptest::prop_assert!(check.problems.is_empty(), "{:?}", check.problems);
        let names: Vec<&str> = check.responders.iter().map(|r| r.name.as_str()).collect();
        let want: Vec<&str> = list.iter().map(|(n, _)| n.as_str()).collect();
        proptest::prop_assert_eq!(names, want);
    }
}

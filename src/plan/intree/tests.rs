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
    // nodegrace's own evictor, on its CRDs, words its refusals as upstream's code does.
    let ours = with_status(json!({
        "targetResponders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR, "priority": 100, "state": "Active"}],
        "responders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR,
            "message": "evicting pod \"pg\" through the Eviction API failed (attempts=4): PodDisruptionBudget pg-pdb: refused"}],
    }));
    assert_eq!(
        respond(&read_eviction(&ours, "u1")),
        Response::Report(Some(
            "evicting pod \"pg\" through the Eviction API failed: PodDisruptionBudget pg-pdb: refused".into()
        ))
    );
    let evicted_by_ours = with_status(json!({
        "targetResponders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR, "priority": 100, "state": "Active"}],
        "responders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR,
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
    let ours = crate::plan::evictions::NODEGRACE_EVICTOR;
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

const PREFIX: &str = "interceptor.evictionrequest.coordination.k8s.io/priority_";

fn field(list: &[(&str, i32)]) -> Vec<EvictionResponder> {
    list.iter()
        .map(|(n, p)| EvictionResponder {
            name: (*n).into(),
            priority: *p,
        })
        .collect()
}

fn annotated(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn declared(list: &[(&str, i64)]) -> Vec<DeclaredResponder> {
    list.iter()
        .map(|(n, p)| DeclaredResponder {
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
    let check = check_responders(Some(&f), None, PREFIX, true);
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.responders.len(), 2);
    assert_eq!(check.source, ResponderSource::Field);
    let none = check_responders(None, None, PREFIX, true);
    assert!(none.problems.is_empty());
    assert_eq!(none.source, ResponderSource::Undeclared);
    assert!(check_responders(Some(&[]), None, PREFIX, false)
        .problems
        .is_empty());
}

#[test]
fn too_many_invalid_and_reserved_responders_are_named() {
    let many: Vec<(String, i32)> = (0..11)
        .map(|i| (format!("r{i}.example.com/x"), 5000))
        .collect();
    let refs: Vec<(&str, i32)> = many.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let check = check_responders(Some(&field(&refs)), None, PREFIX, true);
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert!(check.problems[0].contains("11 responders"));

    let bad = field(&[
        ("no-prefix", 5000),
        ("x.k8s.io/mine", 5000),
        ("low.example.com/x", 500),
        ("high.example.com/x", 100_001),
    ]);
    let problems = check_responders(Some(&bad), None, PREFIX, true).problems;
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems[0].contains("no domain prefix"));
    assert!(problems[1].contains("reserved for Kubernetes"));
    assert!(problems[2].contains("reserved for *.k8s.io"));
    assert!(problems[3].contains("outside 0..=100000"));
}

#[test]
fn the_old_annotation_is_deprecated_and_the_field_wins_over_it() {
    let annotations = annotated(&[(
        "interceptor.evictionrequest.coordination.k8s.io/priority_db.example.com",
        "20000/knowledgeable",
    )]);
    let f = field(&[("db.example.com/operator", 10000)]);
    let check = check_responders(Some(&f), Some(&annotations), PREFIX, true);
    assert_eq!(check.responders[0].name, "db.example.com/operator");
    assert_eq!(check.source, ResponderSource::Field);
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert!(check.problems[0].contains("deprecated and read by nothing"));
    assert!(check.problems[0].contains("disagree with spec.evictionResponders"));
    // Alone: nothing reads it; the sentence names what to declare instead.
    let alone = check_responders(None, Some(&annotations), PREFIX, true);
    assert!(alone.responders.is_empty());
    assert_eq!(alone.source, ResponderSource::Undeclared);
    assert_eq!(alone.problems.len(), 1);
    assert!(alone.problems[0].contains("deprecated and read by nothing"));
    assert!(alone.problems[0].contains("declare the responders in spec.evictionResponders"));
    let crd = check_responders(None, Some(&annotations), PREFIX, false);
    assert!(crd.problems[0].contains(&format!(
        "declare the responders in annotation {RESPONDERS_ANNOTATION}"
    )));
    let garbled = annotated(&[(
        "interceptor.evictionrequest.coordination.k8s.io/priority_x.example.com",
        "high",
    )]);
    let check = check_responders(None, Some(&garbled), PREFIX, true);
    assert!(check.problems[0].contains("not a number"), "{check:?}");
}

#[test]
fn the_annotation_declares_responders_where_the_pod_api_lacks_the_field() {
    let annotations = annotated(&[(
        RESPONDERS_ANNOTATION,
        r#"[{"name":"db.example.com/operator","priority":10000},{"name":"b.example.com/x","priority":2000}]"#,
    )]);
    let check = check_responders(None, Some(&annotations), PREFIX, false);
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.source, ResponderSource::Annotation);
    assert_eq!(
        check.responders,
        declared(&[
            ("db.example.com/operator", 10000),
            ("b.example.com/x", 2000)
        ])
    );
    // The same annotation where the pod API has the field: not read; said so.
    let in_tree = check_responders(None, Some(&annotations), PREFIX, true);
    assert_eq!(in_tree.source, ResponderSource::Undeclared);
    assert!(in_tree.responders.is_empty());
    assert_eq!(in_tree.problems.len(), 1, "{:?}", in_tree.problems);
    assert!(in_tree.problems[0].contains("declare them in spec.evictionResponders"));
}

#[test]
fn the_field_and_the_annotation_disagreeing_is_named_and_the_field_wins() {
    let f = field(&[("db.example.com/operator", 10000)]);
    let same = annotated(&[(
        RESPONDERS_ANNOTATION,
        r#"[{"name":"db.example.com/operator","priority":10000}]"#,
    )]);
    for served in [true, false] {
        let check = check_responders(Some(&f), Some(&same), PREFIX, served);
        assert!(check.problems.is_empty(), "{:?}", check.problems);
        assert_eq!(check.source, ResponderSource::Field);
    }
    let other = annotated(&[(
        RESPONDERS_ANNOTATION,
        r#"[{"name":"db.example.com/operator","priority":20000}]"#,
    )]);
    for served in [true, false] {
        let check = check_responders(Some(&f), Some(&other), PREFIX, served);
        assert_eq!(check.source, ResponderSource::Field);
        assert_eq!(
            check.responders,
            declared(&[("db.example.com/operator", 10000)])
        );
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(check.problems[0].contains("disagree; spec.evictionResponders is used"));
        assert!(check.problems[0].contains("db.example.com/operator=20000"));
    }
}

#[test]
fn a_malformed_annotation_is_named_entry_by_entry() {
    let problems = |value: &str| {
        let a = annotated(&[(RESPONDERS_ANNOTATION, value)]);
        check_responders(None, Some(&a), PREFIX, false)
    };
    let not_json = problems("[{name: db}]");
    assert!(not_json.responders.is_empty());
    assert_eq!(not_json.source, ResponderSource::Annotation);
    assert!(not_json.problems[0].contains("is not JSON"), "{not_json:?}");
    assert!(
        problems(r#"{"name":"a.example.com/x","priority":5000}"#).problems[0]
            .contains("must be a JSON list")
    );
    let check = problems(
        r#"[{"priority":5000},{"name":"a.example.com/x"},{"name":"b.example.com/x","priority":"high"},
            {"name":"c.example.com/x","priority":2.5},"d.example.com/x",
            {"name":"e.example.com/x","priority":5000,"role":"x"}]"#,
    );
    assert_eq!(check.responders, declared(&[("e.example.com/x", 5000)]));
    let p = &check.problems;
    assert_eq!(p.len(), 6, "{p:?}");
    assert!(p[0].contains("entry 1 has no name"), "{p:?}");
    assert!(
        p[1].contains("entry 2 (a.example.com/x) has no priority"),
        "{p:?}"
    );
    assert!(p[2].contains("\"high\" of entry 3"), "{p:?}");
    assert!(p[3].contains("2.5 of entry 4"), "{p:?}");
    assert!(p[4].contains("entry 5 is not an object"), "{p:?}");
    assert!(p[5].contains("unknown field \"role\""), "{p:?}");
    // What it declares is checked like the field.
    let eleven: Vec<String> = (0..11)
        .map(|i| format!(r#"{{"name":"r{i}.example.com/x","priority":5000}}"#))
        .collect();
    let check = problems(&format!("[{}]", eleven.join(",")));
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert!(check.problems[0]
        .contains("11 responders declared (annotation nodegrace.dev/eviction-responders)"));
    let check = problems(
        r#"[{"name":"x.k8s.io/mine","priority":5000},{"name":"low.example.com/x","priority":500},
            {"name":"no-prefix","priority":-1},{"name":"low.example.com/x","priority":500}]"#,
    );
    let p = &check.problems;
    assert!(
        p.iter().any(|s| s.contains("reserved for Kubernetes")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|s| s.contains("reserved for *.k8s.io")),
        "{p:?}"
    );
    assert!(p.iter().any(|s| s.contains("no domain prefix")), "{p:?}");
    assert!(p.iter().any(|s| s.contains("outside 0..=100000")), "{p:?}");
    assert!(p.iter().any(|s| s.contains("declared twice")), "{p:?}");
    // A malformed annotation beside the field: its problems, no disagreement on top.
    let f = field(&[("db.example.com/operator", 10000)]);
    let a = annotated(&[(RESPONDERS_ANNOTATION, "not json")]);
    let check = check_responders(Some(&f), Some(&a), PREFIX, true);
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert!(check.problems[0].contains("is not JSON"));
}

fn valid_responders() -> impl proptest::strategy::Strategy<Value = Vec<DeclaredResponder>> {
    use proptest::strategy::Strategy;
    let name = "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?){0,3}/[A-Za-z0-9]([-A-Za-z0-9_.]{0,30}[A-Za-z0-9])?"
        .prop_filter("not a reserved domain", |n| !is_reserved_domain(n));
    proptest::collection::btree_map(
        name,
        i64::from(RESERVED_PRIORITY_MAX) + 1..=i64::from(MAX_RESPONDER_PRIORITY),
        0..=MAX_POD_RESPONDERS,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(name, priority)| DeclaredResponder { name, priority })
            .collect()
    })
    .prop_shuffle()
}

proptest::proptest! {
    #[test]
    fn valid_responders_written_as_the_annotation_read_back_the_same(list in valid_responders()) {
        let value = serde_json::to_string(
            &list.iter().map(|r| json!({"name": r.name, "priority": r.priority})).collect::<Vec<_>>(),
        ).unwrap();
        let (parsed, problems) = parse_responders_annotation(&value);
        proptest::prop_assert!(problems.is_empty(), "{:?}", problems);
        proptest::prop_assert_eq!(&parsed, &list);
        let a = annotated(&[(RESPONDERS_ANNOTATION, value.as_str())]);
        let check = check_responders(None, Some(&a), PREFIX, false);
        proptest::prop_assert!(check.problems.is_empty(), "{:?}", check.problems);
        proptest::prop_assert_eq!(check.source, ResponderSource::Annotation);
        proptest::prop_assert_eq!(check.responders, list);
    }

    #[test]
    fn any_annotation_value_is_read_without_panicking(value in ".{0,200}") {
        let _ = parse_responders_annotation(&value);
    }
}

//! Fakes shared by the tests and by `nodegrace simulate`.

pub mod fake_apiserver;
pub mod fake_kubelet;

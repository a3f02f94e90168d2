//! Fakes shared by the tests and by `nodegrace simulate`.

//! A command during which anything panicked never exits 0, even when the panic was caught at a
//! task or thread boundary and the command went on (as the daemon does with a panicking drain).
//! Its own test binary: the panic hook and the record are process-wide.

use std::process::ExitCode;

use nodegrace::commands::{exit_code, record_panics, EXIT_CONFIG, EXIT_FAILURE};

fn code(c: ExitCode) -> String {
    format!("{c:?}")
}

#[test]
fn a_caught_panic_turns_success_into_failure() {
    record_panics();
    assert_eq!(
        code(exit_code("t", Ok(ExitCode::SUCCESS))),
        code(ExitCode::SUCCESS)
    );
    assert_eq!(
        code(exit_code("t", Ok(ExitCode::from(EXIT_CONFIG)))),
        code(ExitCode::from(EXIT_CONFIG))
    );
    assert_eq!(
        code(exit_code("t", Err(anyhow::anyhow!("no")))),
        code(ExitCode::from(EXIT_FAILURE))
    );

    let caught = std::thread::spawn(|| panic!("a bug in a task")).join();
    assert!(caught.is_err());
    assert_eq!(
        code(exit_code("t", Ok(ExitCode::SUCCESS))),
        code(ExitCode::from(EXIT_FAILURE))
    );
}

use std::fmt;
use std::path::PathBuf;

/// One configuration text and the name errors use for it.
#[derive(Debug, Clone)]
pub(crate) struct Fragment {
    pub name: PathBuf,
    pub text: String,
}

impl Fragment {
    pub(crate) fn new(name: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        Fragment {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// Why a configuration could not be loaded. Displays as one line:
/// `FILE[:LINE:COLUMN]: [KEY: ]MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigError {
    /// The file at fault.
    pub file: PathBuf,
    /// 1-based line and column (in characters) of the offending key or value.
    pub location: Option<(usize, usize)>,
    /// Dotted key, e.g. `drain.plan[1].pod_priority`.
    pub key: Option<String>,
    pub message: String,
}

impl ConfigError {
    pub(super) fn file(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.into(),
            location: None,
            key: None,
            message: one_line(&message.into()),
        }
    }
}

fn one_line(message: &str) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::text::clip(&line).into_owned()
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// 1-based line and character column of a byte offset.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

pub(super) fn located(
    file: PathBuf,
    text: &str,
    offset: Option<usize>,
    key: Option<String>,
    message: &str,
) -> ConfigError {
    ConfigError {
        file,
        location: offset.map(|offset| line_column(text, offset)),
        key,
        message: one_line(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_quoted_value_is_cut_in_the_middle() {
        let value = "x".repeat(900_000);
        let e = ConfigError::file(
            "/c",
            format!("invalid duration '{value}', expected e.g. 90s"),
        );
        assert!(e.message.len() < 700, "{}", e.message.len());
        assert!(
            e.message.starts_with("invalid duration 'xxx"),
            "{}",
            e.message
        );
        assert!(
            e.message.ends_with("xx', expected e.g. 90s"),
            "{}",
            e.message
        );
        assert!(e.message.contains("characters left out"), "{}", e.message);
        let short = ConfigError::file("/c", "bad\n  value");
        assert_eq!(short.message, "bad value");
    }
}

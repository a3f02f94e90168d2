//! Strings that came from outside (API objects, files and their names, logind, certificates)
//! on their way to a terminal.

use std::borrow::Cow;

/// Control characters (C0, DEL, C1), the bidirectional marks, overrides and isolates, the
/// line and paragraph separators and the zero-width space: what can move the cursor,
/// recolour, clear the screen, start a line that looks like ours, reorder what is shown, or
/// make two different names look the same.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

fn escape_where(s: &str, unsafe_char: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(&unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` with every unsafe character written as `\u001b`, which is also how JSON and TOML
/// strings spell it, so escaped reports stay valid: for one value (a name, a cell).
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    escape_where(s, is_unsafe)
}

/// The same for a whole text whose line breaks and tabs are its own (a report, an error):
/// they are kept, everything else unsafe is escaped.
pub(crate) fn escape_keeping_lines(s: &str) -> Cow<'_, str> {
    escape_where(s, |c| c != '\n' && c != '\t' && is_unsafe(c))
}

/// The same for one line of text that may hold tabs (a log record without its final
/// line break).
pub(crate) fn escape_keeping_tabs(s: &str) -> Cow<'_, str> {
    escape_where(s, |c| c != '\t' && is_unsafe(c))
}

/// Longest message kept whole: an error may quote the offending value, which can be as long
/// as the file it came from.
const MESSAGE_MAX_CHARS: usize = 600;

/// `message` with the middle of an overlong one left out: its start (what went wrong) and its
/// end (where: parsers put the line and column last) are kept.
pub(crate) fn clip(message: &str) -> Cow<'_, str> {
    let chars = message.chars().count();
    if chars <= MESSAGE_MAX_CHARS {
        return Cow::Borrowed(message);
    }
    let head: String = message.chars().take(400).collect();
    let tail: String = message.chars().skip(chars - 100).collect();
    Cow::Owned(format!(
        "{head} [... {} characters left out ...] {tail}",
        chars - 500
    ))
}

/// Writes a command's output, control characters other than line breaks and tabs escaped
/// (values that may hold a line break are escaped where they are put in). A closed pipe (`| head`) means the reader has what it
/// wanted; any other failure (`> /dev/full`) is the command's error.
pub fn print_stdout(text: &str) -> anyhow::Result<()> {
    write_stdout(&escape_keeping_lines(text))
}

/// [`print_stdout`] for output painted by the command itself ([`paint`]): its colour codes
/// reach the terminal when `colour`; everything else unsafe is escaped as always.
pub(crate) fn print_stdout_painted(text: &str, colour: bool) -> anyhow::Result<()> {
    if colour {
        write_stdout(&escape_keeping_colour(text))
    } else {
        print_stdout(text)
    }
}

const PAINT_START: &str = "\x1b[";
/// The colours [`paint`] is given: nothing that hides, blinks or moves.
const PAINT_CODES: [&str; 5] = ["0", "1", "31", "32", "33"];

/// `text` in the colour `code` (one of [`PAINT_CODES`]) for [`print_stdout_painted`].
pub(crate) fn paint(text: &str, code: &str) -> String {
    format!("{PAINT_START}{code}m{text}{PAINT_START}0m")
}

/// [`escape_keeping_lines`] that keeps the colour codes of [`paint`].
fn escape_keeping_colour(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(PAINT_START) {
        out.push_str(&escape_keeping_lines(&rest[..at]));
        let after = &rest[at + PAINT_START.len()..];
        let code = after.split_once('m').map(|(code, _)| code);
        match code.filter(|c| PAINT_CODES.contains(c)) {
            Some(code) => {
                out.push_str(&rest[at..at + PAINT_START.len() + code.len() + 1]);
                rest = &after[code.len() + 1..];
            }
            None => {
                out.push_str(&escape_keeping_lines(PAINT_START));
                rest = after;
            }
        }
    }
    out.push_str(&escape_keeping_lines(rest));
    out
}

fn write_stdout(text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// Writes one line to stderr. When stderr is closed or full there is nowhere left to say
/// anything, so that error is dropped (`eprintln!` would panic).
pub(crate) fn print_stderr(line: &str) {
    use std::io::Write;
    let line = escape_keeping_lines(line);
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// A parser's error about a file that may hold credentials (a kubeconfig, a key, the
/// kubelet's configuration, a pod list): what kind of fault and where, nothing of the file.
/// Parsers quote the lines around a fault or the offending value, which put a token or the
/// start of a private key into terminals and the journal. serde's "missing field `x`"
/// names the schema's field, not the file's text, and is kept.
pub(crate) fn parse_fault(message: &str, at: Option<(usize, usize)>) -> String {
    let kept = match message.strip_prefix("missing field `") {
        Some(rest) => match rest.find('`') {
            Some(end) => &message[.."missing field `".len() + end + 1],
            None => "missing field",
        },
        None => {
            let end = [
                message.find(['"', '`', '\'', '\n']),
                message.find(" at line "),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(message.len());
            message[..end].trim_end_matches([' ', ',', ':', ';'])
        }
    };
    let kept = if kept.is_empty() {
        "cannot be parsed"
    } else {
        kept
    };
    match at {
        Some((line, column)) => {
            format!("{kept} at line {line} column {column} (the file's text is not shown)")
        }
        None => format!("{kept} (the file's text is not shown)"),
    }
}

/// [`parse_fault`] of a YAML error.
pub(crate) fn yaml_fault(e: &serde_saphyr::Error) -> String {
    let at = e
        .location()
        .map(|l| (l.line() as usize, l.column() as usize));
    let message = e.without_snippet().to_string();
    // serde-saphyr names the key given twice, unquoted.
    if message.starts_with("duplicate mapping key") {
        return parse_fault("a key given twice in a mapping", at);
    }
    parse_fault(&message, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_shown_not_obeyed() {
        assert_eq!(escape("etcd-node-a"), "etcd-node-a");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(escape("a\u{1b}[2Jb"), "a\\u001b[2Jb");
        assert_eq!(escape("x\nProtected: yes"), "x\\u000aProtected: yes");
        assert_eq!(escape("\r\u{7f}\u{9b}"), "\\u000d\\u007f\\u009b");
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u202efed");
        assert_eq!(escape("tab\there"), "tab\\u0009here");
        assert_eq!(escape("日本\u{2069}"), "日本\\u2069");
        assert_eq!(
            escape("a\u{200b}b\u{200e}c\u{200f}d\u{061c}e\u{2028}f"),
            "a\\u200bb\\u200ec\\u200fd\\u061ce\\u2028f"
        );
    }

    #[test]
    fn an_escaped_json_report_stays_json_with_the_same_values() {
        let value = serde_json::json!({"who": "kubelet\u{7f}\u{9b}\u{202e}\\", "why": "a\nb"});
        let text = serde_json::to_string(&value).unwrap();
        let shown = escape_keeping_lines(&text);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            value
        );
    }

    #[test]
    fn a_parse_fault_quotes_nothing_of_the_file() {
        let key = "-----BEGIN EC PRIVATE KEY----- MHcCAQEEINCmmb017z9iltyDQ2FGXzn";
        assert_eq!(
            parse_fault(
                &format!(
                    "invalid type: string \"{key}\", expected struct RawPod at line 1 column 1"
                ),
                Some((1, 1))
            ),
            "invalid type: string at line 1 column 1 (the file's text is not shown)"
        );
        assert_eq!(
            parse_fault(
                "unknown field `abcdef.0123456789abcdef`, expected one of",
                Some((3, 5))
            ),
            "unknown field at line 3 column 5 (the file's text is not shown)"
        );
        assert_eq!(
            parse_fault("missing field `metadata`", Some((2, 1))),
            "missing field `metadata` at line 2 column 1 (the file's text is not shown)"
        );
        assert_eq!(
            parse_fault(
                "did not find expected ',' or ']' at line 9 column 1, while parsing",
                None
            ),
            "did not find expected (the file's text is not shown)"
        );
        assert_eq!(
            parse_fault("\"abcdef\"", Some((1, 2))),
            "cannot be parsed at line 1 column 2 (the file's text is not shown)"
        );
    }

    #[test]
    fn painted_output_keeps_its_colours_and_escapes_the_rest() {
        let text = format!(
            "{} a\u{1b}[2J b\u{1b}[8mhidden\u{1b}[0m\n{}\u{1b}[",
            paint("█", "32"),
            paint("x", "1")
        );
        assert_eq!(
            escape_keeping_colour(&text),
            "\u{1b}[32m█\u{1b}[0m a\\u001b[2J b\\u001b[8mhidden\u{1b}[0m\n\u{1b}[1mx\u{1b}[0m\\u001b["
        );
    }

    #[test]
    fn whole_texts_keep_their_lines() {
        assert_eq!(
            escape_keeping_lines("one\n\ttwo \u{1b}]0;title\u{7}\n"),
            "one\n\ttwo \\u001b]0;title\\u0007\n"
        );
    }
}

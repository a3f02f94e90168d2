//! A look at YAML before it is parsed. libyaml (serde_yaml) spends time in proportion to the
//! depth of nested flow collections for every token, so a file of `[[[[…` takes time in the
//! square of its size (1 MiB: tens of minutes). Block nesting costs it nothing extra and
//! serde_yaml refuses it past 128 levels; flow nesting is refused here, in one pass, past
//! [`MAX_FLOW_DEPTH`], and so is a file whose flow nesting, summed over its characters,
//! passes [`MAX_FLOW_COST`].

/// Deeper than any Kubernetes object written as JSON (a pod is about 10 levels).
pub(crate) const MAX_FLOW_DEPTH: usize = 64;

/// The most flow nesting read, as the sum over the characters inside flow collections of
/// their depth: about a quarter of a second of libyaml's time on the optimized build
/// (measured: 2^24 took 0.45 s of CPU), leaving the rest of a second to the block YAML of the
/// largest file read. A pod written as JSON, 10 levels deep, may be 800 KB; as block YAML,
/// which costs only its shallow flow collections here, any size read.
pub(crate) const MAX_FLOW_COST: u64 = 1 << 23;

/// Why `text` is not given to the YAML parser: flow collections (`[`, `{`) nested deeper
/// than [`MAX_FLOW_DEPTH`] or more of them than [`MAX_FLOW_COST`], with the line and column
/// where the scan stopped; None when it may be parsed.
///
/// The scan errs towards counting: a bracket that might open a collection is counted, and a
/// block scalar (`|`, `>`) is skipped only over lines indented past the entry it belongs to.
pub(crate) fn why_not_read(text: &str) -> Option<String> {
    let mut scan = Scan::default();
    let mut block_scalar_over: Option<usize> = None;
    for (n, line) in text.split('\n').enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        if let Some(over) = block_scalar_over {
            if line.trim().is_empty() || indent > over {
                continue;
            }
            block_scalar_over = None;
        }
        let at = |col: usize| format!("line {} column {}", n + 1, col + 1);
        match scan.line(line) {
            Ok(Some(entry_col)) => block_scalar_over = Some(entry_col),
            Ok(None) => {}
            Err(col) => {
                return Some(format!(
                    "flow collections nested deeper than {MAX_FLOW_DEPTH} levels at {}",
                    at(col)
                ))
            }
        }
        if scan.cost > MAX_FLOW_COST {
            return Some(format!(
                "more nested flow collections ([ ], {{ }}) than are read, at {}: write it as \
                 block YAML or JSON of fewer levels",
                at(line.len())
            ));
        }
    }
    None
}

#[derive(Default)]
struct Scan {
    depth: usize,
    /// The depth of each character read inside flow collections, summed.
    cost: u64,
    /// Inside a quoted scalar, which may go on over lines: its quote character.
    quote: Option<char>,
}

impl Scan {
    /// Scans one line. Ok(Some(column)): a block scalar starts, belonging to the entry at
    /// that column; Err(column): the flow collection opened there is too deep.
    fn line(&mut self, line: &str) -> Result<Option<usize>, usize> {
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        let mut i = 0;
        // Block context: whether a node may start here (a bracket there opens a collection).
        let mut node_start = true;
        let mut entry_col = line.len() - line.trim_start_matches(' ').len();
        let mut prev = ' ';
        while i < chars.len() {
            let (col, c) = chars[i];
            self.cost += self.depth as u64;
            if let Some(q) = self.quote {
                if q == '"' && c == '\\' {
                    i += 2;
                    continue;
                }
                if c == q {
                    if q == '\'' && chars.get(i + 1).map(|x| x.1) == Some('\'') {
                        i += 2;
                        continue;
                    }
                    self.quote = None;
                    node_start = false;
                }
                prev = c;
                i += 1;
                continue;
            }
            let after_space = matches!(prev, ' ' | '\t');
            let token_start =
                i == 0 || after_space || matches!(prev, '[' | '{' | ',' | ':' | '?' | '-');
            match c {
                '#' if i == 0 || after_space => break,
                '"' | '\'' if (self.depth > 0 || node_start) && token_start => {
                    self.quote = Some(c);
                }
                '[' | '{' if self.depth > 0 || node_start => {
                    self.depth += 1;
                    if self.depth > MAX_FLOW_DEPTH {
                        return Err(col);
                    }
                }
                ']' | '}' if self.depth > 0 => self.depth -= 1,
                '|' | '>' if self.depth == 0 && node_start => return Ok(Some(entry_col)),
                ' ' | '\t' => {}
                '-' | '?' | ':'
                    if self.depth == 0
                        && chars.get(i + 1).is_none_or(|x| matches!(x.1, ' ' | '\t')) =>
                {
                    node_start = true;
                    if c != ':' {
                        entry_col = chars
                            .iter()
                            .skip(i + 1)
                            .find(|x| !matches!(x.1, ' ' | '\t'))
                            .map_or(col + 2, |x| x.0);
                    }
                }
                '&' | '!' if self.depth == 0 && node_start && token_start => {
                    // An anchor or a tag: the node it marks comes after it.
                    while i + 1 < chars.len() && !matches!(chars[i + 1].1, ' ' | '\t') {
                        i += 1;
                    }
                }
                _ if self.depth == 0 => node_start = false,
                _ => {}
            }
            prev = c;
            i += 1;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_found_where_it_passes_the_limit() {
        let deep = format!("a: {}", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert!(why_not_read(&deep)
            .is_some_and(|w| w.ends_with("deeper than 64 levels at line 1 column 68")));
        let ok = format!(
            "a: {}{}",
            "[".repeat(MAX_FLOW_DEPTH),
            "]".repeat(MAX_FLOW_DEPTH)
        );
        assert_eq!(why_not_read(&ok), None);
        let json = format!("{}\n{}", "{\"a\":".repeat(70), "}".repeat(70));
        assert!(why_not_read(&json).is_some());
        let over_lines = "k:\n".to_string() + &"- [\n".repeat(70);
        assert!(why_not_read(&over_lines).is_some());
        let after_an_anchor = format!("k: &x !!seq {}", "[".repeat(70));
        assert!(why_not_read(&after_an_anchor).is_some());
    }

    #[test]
    fn brackets_that_are_text_are_not_counted() {
        let texts = [
            format!("msg: a{}\n", "[".repeat(100)),
            format!("msg: \"{}\"\n", "[".repeat(100)),
            format!("msg: '{}''{}'\n", "[".repeat(50), "{".repeat(50)),
            format!("msg: \"a\\\"{}\"\n", "[".repeat(100)),
            format!("# {}\nk: v\n", "[".repeat(100)),
            format!("k: [a, \"{}\", '{}']\n", "]".repeat(3), "[".repeat(100)),
            format!("script: |\n  {}\n  x\nnext: [1]\n", "[".repeat(100)),
            format!("- k: >-\n    {}\n  other: 1\n", "{".repeat(100)),
            format!("k: \"multi\n  {}\n  line\"\n", "[".repeat(100)),
        ];
        for t in &texts {
            assert_eq!(why_not_read(t), None, "{t}");
        }
    }

    #[test]
    fn a_block_scalar_hides_nothing_past_its_entry() {
        // `other` is a sibling of `k`, not part of its text.
        let t = format!("- k: |\n    text\n  other: {}\n", "[".repeat(100));
        assert!(why_not_read(&t).is_some());
        let t = format!("k: |\nnext: {}\n", "[".repeat(100));
        assert!(why_not_read(&t).is_some());
    }

    #[test]
    fn flow_nesting_past_the_cost_is_refused_where_it_passes_it() {
        // 4,096 per line: each bracket counts the depth it is read at.
        let line = format!("  - {}{}", "[".repeat(64), "]".repeat(64));
        let lines = |n: usize| format!("k:\n{}", format!("{line}\n").repeat(n));
        let most = (MAX_FLOW_COST / 4096) as usize;
        assert_eq!(why_not_read(&lines(most)), None);
        let over = why_not_read(&lines(most + 1)).unwrap_or_default();
        assert!(
            over.starts_with("more nested flow collections")
                && over.contains(&format!("line {}", most + 2)),
            "{over}"
        );
        // Block YAML costs only the depth of its shallow flow collections; text inside a
        // JSON object, its depth.
        assert_eq!(why_not_read(&"- k: [a]\n".repeat(1 << 20)), None);
        let json_pod = format!(
            "{}\"{}\"{}",
            "{\"a\":".repeat(10),
            "x".repeat(800_000),
            "}".repeat(10)
        );
        assert_eq!(why_not_read(&json_pod), None);
    }

    #[test]
    fn the_scan_is_linear() {
        let text = "[".repeat(1 << 20);
        let start = std::time::Instant::now();
        assert!(why_not_read(&text).is_some());
        let text = format!("k: [{}]\n", "a, ".repeat(300_000));
        assert_eq!(why_not_read(&text), None);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }
}

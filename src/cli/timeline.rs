//! One shutdown drawn on one time axis: its bands, the pods that waited and on what, the
//! apiserver's outages and the re-plans after them, the escalations. [`Story::tell`] reads
//! what nodegrace wrote (the daemon's phase changes, the Events on the shutdown maintenance);
//! [`draw`] turns a story into lines no wider than the terminal.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::daemon::status::PhaseChange;
use crate::daemon::Phase;

/// One Event nodegrace wrote: when, its reason and its note.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub at: DateTime<Utc>,
    pub reason: String,
    pub note: String,
}

/// Something that lasted: a band, an outage.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    pub label: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// A pod whose eviction was refused, from the first refusal until it was escalated or its
/// band ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Wait {
    pub pod: String,
    pub on: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// A moment: `R` re-planned, `E` escalated, `F` offline fallback.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mark {
    pub at: DateTime<Utc>,
    pub letter: char,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Story {
    pub node: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub outcome: String,
    pub bands: Vec<Span>,
    pub waits: Vec<Wait>,
    pub outages: Vec<Span>,
    pub marks: Vec<Mark>,
}

/// The pods an event lists (`a, b and 3 more`: the named ones).
fn pods_listed(list: &str) -> Vec<String> {
    let list = match list.rsplit_once(" and ") {
        Some((named, more)) if more.ends_with(" more") => named,
        _ => list,
    };
    list.split(", ")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// `eviction of N pod(s) blocked by BY; retrying with back-off: PODS`.
fn blocked(note: &str) -> Option<(String, Vec<String>)> {
    let (_, rest) = note.split_once(" blocked by ")?;
    let (by, pods) = rest.split_once("; retrying with back-off: ")?;
    Some((by.to_string(), pods_listed(pods)))
}

/// `planned again at A: CAUSE (L lost); ...`: the cause and the time lost.
fn replanned(note: &str) -> Option<(String, chrono::Duration)> {
    let (_, rest) = note.split_once(": ")?;
    let (cause, rest) = rest.rsplit_once(" (")?;
    let (lost, _) = rest.split_once(" lost)")?;
    let lost = humantime::parse_duration(lost).ok()?;
    Some((cause.to_string(), chrono::Duration::from_std(lost).ok()?))
}

impl Story {
    /// The last shutdown told by `phases` (the daemon's, oldest first; empty when read
    /// from the apiserver) and `events` (those on the shutdown's maintenance). `now` ends
    /// a shutdown still under way. None: nothing tells of a shutdown.
    pub(crate) fn tell(
        node: &str,
        phases: &[PhaseChange],
        events: &[Record],
        now: DateTime<Utc>,
    ) -> Option<Story> {
        let draining = phases.iter().rposition(|p| p.phase == Phase::Draining);
        let released = draining.and_then(|i| {
            phases[i..]
                .iter()
                .find(|p| matches!(p.phase, Phase::Released | Phase::Armed))
        });
        let mut events: Vec<&Record> = events.iter().collect();
        events.sort_by_key(|r| r.at);
        if let Some(i) = draining {
            // Events of an earlier shutdown's maintenance are not this one's.
            let from = phases[i].at - chrono::Duration::seconds(5);
            events.retain(|r| r.at >= from);
        }
        let start = match (draining.map(|i| phases[i].at), events.first()) {
            (Some(d), Some(e)) => d.min(e.at),
            (Some(d), None) => d,
            (None, Some(e)) => e.at,
            (None, None) => return None,
        };
        let (end, outcome) = Self::ending(released, draining.is_some(), &events, start, now);
        let mut reading = Reading {
            story: Story {
                node: node.to_string(),
                start,
                end,
                outcome,
                bands: Vec::new(),
                waits: Vec::new(),
                outages: Vec::new(),
                marks: Vec::new(),
            },
            band: None,
            open: HashMap::new(),
        };
        for r in events.iter().filter(|r| r.at <= end) {
            reading.read(r);
        }
        Some(reading.finish())
    }

    /// When and how the shutdown ended: its release, or `now` while it drains, or (told
    /// by events alone) its Drained event or else its last event.
    fn ending(
        released: Option<&PhaseChange>,
        draining: bool,
        events: &[&Record],
        start: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (DateTime<Utc>, String) {
        let drained = events.iter().find(|r| r.reason == "Drained").map(|r| r.at);
        match (released, draining, drained) {
            (Some(r), ..) => (r.at, format!("{}: {}", phase_name(r.phase), r.reason)),
            (None, true, _) => (now, "still draining".to_string()),
            (None, false, Some(at)) => (at, "drained".to_string()),
            (None, false, None) => (
                events
                    .iter()
                    .filter(|r| r.reason != "Completed")
                    .map(|r| r.at)
                    .max()
                    .unwrap_or(start),
                "no Drained event: not drained, or the event is gone".to_string(),
            ),
        }
    }
}

/// A story being read from its events, oldest first: the band under way and the waits
/// not yet ended, by pod (an event may name thousands).
struct Reading {
    story: Story,
    band: Option<(String, DateTime<Utc>)>,
    open: HashMap<String, Wait>,
}

impl Reading {
    fn read(&mut self, r: &Record) {
        match r.reason.as_str() {
            "DrainTargets" | "Drained" => self.band_event(r),
            "EvictionBlocked" | "Throttled" => self.wait_event(r),
            "Escalated" => {
                let pods = r.note.rsplit_once(": ").map(|(_, p)| pods_listed(p));
                let pods = pods.unwrap_or_default();
                for pod in &pods {
                    self.end_wait(pod, r.at);
                }
                self.mark(
                    r.at,
                    'E',
                    format!(
                        "escalated (deleted with the grace left): {}",
                        pods.join(", ")
                    ),
                );
            }
            "Replanned" => {
                if let Some((cause, lost)) = replanned(&r.note) {
                    if lost > chrono::Duration::zero() {
                        self.story.outages.push(Span {
                            label: cause,
                            from: (r.at - lost).max(self.story.start),
                            to: r.at,
                        });
                    }
                }
                self.mark(r.at, 'R', format!("re-planned: {}", r.note));
            }
            "FallbackUsed" => self.mark(r.at, 'F', format!("offline fallback: {}", r.note)),
            _ => {}
        }
    }

    fn band_event(&mut self, r: &Record) {
        let targets = r.note.rsplit_once(" drains ").map(|(_, t)| t);
        let same = self.band.as_ref().map(|(label, _)| label.as_str());
        if r.reason == "DrainTargets" && targets.is_some() && targets == same {
            return;
        }
        // A refusal told before its band's first event (both are written in the
        // background) waits on until a band ends.
        let ended = self.band.take();
        if let Some((label, from)) = ended.clone() {
            self.story.bands.push(Span {
                label,
                from,
                to: r.at,
            });
        }
        if ended.is_some() || r.reason == "Drained" {
            self.end_open_waits(r.at);
        }
        if let Some(t) = targets.filter(|t| r.reason == "DrainTargets" && *t != "nothing") {
            self.band = Some((t.to_string(), r.at));
        }
    }

    fn wait_event(&mut self, r: &Record) {
        let parsed = if r.reason == "Throttled" {
            r.note.rsplit_once(": ").map(|(_, pods)| {
                (
                    "the apiserver (429 Too Many Requests)".to_string(),
                    pods_listed(pods),
                )
            })
        } else {
            blocked(&r.note)
        };
        let Some((on, pods)) = parsed else { return };
        for pod in pods {
            if self.open.get(&pod).is_some_and(|w| w.on == on) {
                continue;
            }
            self.end_wait(&pod, r.at);
            self.open.insert(
                pod.clone(),
                Wait {
                    pod,
                    on: on.clone(),
                    from: r.at,
                    to: r.at,
                },
            );
        }
    }

    fn end_wait(&mut self, pod: &str, at: DateTime<Utc>) {
        if let Some(mut w) = self.open.remove(pod) {
            w.to = at;
            self.story.waits.push(w);
        }
    }

    fn end_open_waits(&mut self, at: DateTime<Utc>) {
        for (_, mut w) in self.open.drain() {
            w.to = at;
            self.story.waits.push(w);
        }
    }

    fn mark(&mut self, at: DateTime<Utc>, letter: char, text: String) {
        self.story.marks.push(Mark { at, letter, text });
    }

    fn finish(mut self) -> Story {
        let end = self.story.end;
        if let Some((label, from)) = self.band.take() {
            self.story.bands.push(Span {
                label,
                from,
                to: end,
            });
        }
        self.end_open_waits(end);
        self.story
            .waits
            .sort_by(|a, b| (a.from, &a.pod).cmp(&(b.from, &b.pod)));
        self.story
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Starting => "starting",
        Phase::Armed => "armed",
        Phase::Draining => "draining",
        Phase::Released => "released",
        Phase::Stopping => "stopping",
    }
}

/// Narrower than this, the story is a list: no axis fits.
const CHART_MIN_WIDTH: usize = 48;
/// Most pods drawn as rows; the rest are counted.
const WAIT_ROWS_MAX: usize = 12;
const BAND_CHAR: char = '█';
const WAIT_CHAR: char = '░';
const OUTAGE_CHAR: char = '×';

/// `s` cut to `width` characters, `…` marking the cut.
fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn seconds(d: chrono::Duration) -> String {
    format!("{:.1}s", d.num_milliseconds() as f64 / 1000.0)
}

fn tick_label(secs: i64) -> String {
    const DAY: i64 = 86_400;
    if secs >= DAY && secs % DAY == 0 {
        return format!("{}d", secs / DAY);
    }
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// The chart's geometry: where on the axis a time falls.
struct Axis {
    start: DateTime<Utc>,
    total_ms: i64,
    cols: usize,
}

impl Axis {
    fn col(&self, t: DateTime<Utc>) -> usize {
        let ms = (t - self.start).num_milliseconds().clamp(0, self.total_ms);
        let last = self.cols.saturating_sub(1) as i64;
        usize::try_from(ms * last / self.total_ms.max(1)).unwrap_or(0)
    }

    fn bar(&self, spans: &[(DateTime<Utc>, DateTime<Utc>)], c: char) -> String {
        let mut cells = vec![' '; self.cols];
        for (from, to) in spans {
            let (a, b) = (self.col(*from), self.col(*to));
            for cell in &mut cells[a..=b.max(a)] {
                *cell = c;
            }
        }
        cells.into_iter().collect::<String>().trim_end().to_string()
    }

    /// The seconds' labels and the ruler under them, ticks no closer than a label needs.
    fn ruler(&self) -> (String, String) {
        const STEPS: [i64; 13] = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
        let total_s = self.total_ms / 1000 + 1;
        let room = (self.cols / 8).max(1) as i64;
        // Past an hour a step, whole days: events dated years apart (a clock gone wrong, an
        // Event written by hand) still get a ruler of a few ticks, drawn at once.
        let step = STEPS
            .iter()
            .copied()
            .find(|s| total_s / s <= room)
            .unwrap_or_else(|| (total_s / room / 86_400 + 1) * 86_400);
        let mut labels = vec![' '; self.cols];
        let mut rule = vec!['-'; self.cols];
        let mut free_from = 0;
        let mut at = 0;
        while at * 1000 <= self.total_ms {
            let col = self.col(self.start + chrono::Duration::seconds(at));
            rule[col] = '|';
            let text = tick_label(at);
            if col >= free_from && col + text.len() <= self.cols {
                for (i, ch) in text.chars().enumerate() {
                    labels[col + i] = ch;
                }
                free_from = col + text.len() + 1;
            }
            at += step;
        }
        (
            labels
                .into_iter()
                .collect::<String>()
                .trim_end()
                .to_string(),
            rule.into_iter().collect(),
        )
    }
}

/// The story in lines of at most `width` characters; `colour` paints the bars (printed by
/// `print_stdout_painted`).
pub(crate) fn draw(story: &Story, width: usize, colour: bool) -> Vec<String> {
    let esc = |s: &str| crate::text::escape(s).into_owned();
    let total = story.end - story.start;
    let at = |t: DateTime<Utc>| format!("+{}", seconds(t - story.start));
    let mut lines = vec![fit(
        &format!(
            "{}: shutdown at {}, {}, {}",
            esc(&story.node),
            story.start.format("%Y-%m-%d %H:%M:%SZ"),
            seconds(total),
            esc(&story.outcome)
        ),
        width,
    )];
    let mut details = Vec::new();
    for b in &story.bands {
        details.push(format!(
            "  {} {}  band {}",
            at(b.from),
            seconds(b.to - b.from),
            esc(&b.label)
        ));
    }
    for o in &story.outages {
        details.push(format!(
            "  {} {}  apiserver lost: {}",
            at(o.from),
            seconds(o.to - o.from),
            esc(&o.label)
        ));
    }
    let mut waited = Vec::new();
    for w in &story.waits {
        waited.push(format!(
            "  {} {}  {} waited on {}",
            at(w.from),
            seconds(w.to - w.from),
            esc(&w.pod),
            esc(&w.on)
        ));
    }
    let mut marked = Vec::new();
    for m in &story.marks {
        marked.push(format!("  {} {} {}", m.letter, at(m.at), esc(&m.text)));
    }

    if width < CHART_MIN_WIDTH {
        for line in details.iter().chain(&waited).chain(&marked) {
            lines.push(fit(line, width));
        }
        return lines;
    }

    let label_width = (width / 3).min(28);
    let axis = Axis {
        start: story.start,
        total_ms: total.num_milliseconds().max(1),
        cols: width - label_width - 1,
    };
    let paint = |bar: String, code: &str| {
        if colour && !bar.trim().is_empty() {
            crate::text::paint(&bar, code)
        } else {
            bar
        }
    };
    let row = |label: &str, bar: String| {
        format!("{:<label_width$} {bar}", fit(label, label_width))
            .trim_end()
            .to_string()
    };
    let (labels, rule) = axis.ruler();
    lines.push(row("", labels));
    lines.push(row("", rule));
    for b in &story.bands {
        let bar = axis.bar(&[(b.from, b.to)], BAND_CHAR);
        lines.push(row(&format!("band {}", esc(&b.label)), paint(bar, "32")));
    }
    if !story.outages.is_empty() {
        let spans: Vec<_> = story.outages.iter().map(|o| (o.from, o.to)).collect();
        let bar = axis.bar(&spans, OUTAGE_CHAR);
        lines.push(row("apiserver lost", paint(bar, "31")));
    }
    for w in story.waits.iter().take(WAIT_ROWS_MAX) {
        let bar = axis.bar(&[(w.from, w.to)], WAIT_CHAR);
        lines.push(row(&esc(&w.pod), paint(bar, "33")));
    }
    if story.waits.len() > WAIT_ROWS_MAX {
        lines.push(format!(
            "and {} more pods waited (listed below)",
            story.waits.len() - WAIT_ROWS_MAX
        ));
    }
    if !story.marks.is_empty() {
        let mut cells = vec![' '; axis.cols];
        for m in &story.marks {
            cells[axis.col(m.at)] = m.letter;
        }
        let bar: String = cells.into_iter().collect::<String>().trim_end().to_string();
        lines.push(row("events", paint(bar, "1")));
    }
    lines.push(fit(
        &format!("{BAND_CHAR} band  {WAIT_CHAR} pod waiting  {OUTAGE_CHAR} apiserver lost  R re-planned  E escalated  F fallback"),
        width,
    ));
    for (title, part) in [
        ("Bands and outages:", &details),
        ("Waited:", &waited),
        ("Events:", &marked),
    ] {
        if !part.is_empty() {
            lines.push(title.to_string());
            lines.extend(part.iter().map(|l| fit(l, width)));
        }
    }
    lines
}

#[cfg(test)]
mod tests;

//! Rules for the repository's tracked text: it speaks of the product only.
//!
//! * No numbered work periods ("the <ordinal> session", "session <N>") and
//!   no references to such a period by its place (the one before, after or
//!   current); the product's saved sessions (`--save-session`, session
//!   files) are not touched by these patterns.
//! * No ticket numbers as provenance ("issue <N>", "#<N>").
//! * No words about who did what or who measured it.
//! * Markdown headings carry topics, not dates: a measurement's date goes in
//!   its text, and a new one replaces the old in its place.
//! * The README's "Speed" section stays within [`SPEED_BUDGET`] lines, and
//!   docs/PERFORMANCE.md within [`PERFORMANCE_BUDGET`].
//!
//! Text is matched after normalization, so that line breaks inside a
//! comment or a paragraph, comment markers, Markdown emphasis, underscores of
//! identifiers, case and Unicode dashes do not hide a phrase.

use regex::Regex;
use std::sync::OnceLock;

/// Most lines the README's "Speed" section may take, its heading included.
pub const SPEED_BUDGET: usize = 40;
/// Most lines docs/PERFORMANCE.md may take.
pub const PERFORMANCE_BUDGET: usize = 1000;

/// One rule broken at one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// 1-based line where the matched phrase starts.
    pub line: usize,
    pub rule: &'static str,
    /// The phrase as normalized (lowercase, markers removed).
    pub phrase: String,
}

/// Whether a tracked file is text this module checks: Markdown, Rust,
/// Python, shell, TOML, C, YAML, and scripts without an extension that start
/// with `#!` (`first_line`).
pub fn checked(path: &str, first_line: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.rsplit_once('.') {
        Some((_, ext)) => matches!(
            ext,
            "md" | "rs" | "py" | "sh" | "toml" | "c" | "h" | "yml" | "yaml"
        ),
        None => first_line.starts_with("#!"),
    }
}

/// The text with comment markers at line starts and Markdown emphasis
/// removed, underscores as spaces, lowercase, Unicode dashes and spaces as
/// ASCII, lines joined by one space; and where each line starts in it.
fn normalize(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut starts = Vec::new();
    for line in text.lines() {
        starts.push(out.len());
        let body = line.trim_start_matches(|c: char| c.is_whitespace() || "/!*#>".contains(c));
        for c in body.chars() {
            match c {
                '*' | '`' => {}
                '_' | '\u{a0}' | '\u{2007}' | '\u{202f}' | '\t' => out.push(' '),
                '\u{2010}'..='\u{2015}' | '\u{2212}' => out.push('-'),
                '\u{2018}' | '\u{2019}' => out.push('\''),
                c => out.extend(c.to_lowercase()),
            }
        }
        out.push(' ');
    }
    (out, starts)
}

struct Rule {
    name: &'static str,
    re: Regex,
    /// A match followed by this is not a finding (`issues 2 per cycle`).
    unless_followed_by: Option<Regex>,
}

fn rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        const ORD: &str = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|fortieth|fiftieth|sixtieth|seventieth|eightieth|ninetieth|hundredth|\d+\s*(?:st|nd|rd|th))";
        const TENS: &str = r"(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)";
        let re = |s: &str| Regex::new(s).expect("rule pattern");
        vec![
            Rule {
                name: "numbered work period",
                re: re(&format!(
                    r"\b(?:{TENS}[\s-]*)?{ORD}[\s-]+(?:sessions?|work[\s-]+periods?|sprints?)\b"
                )),
                unless_followed_by: None,
            },
            Rule {
                name: "numbered work period",
                re: re(r"(?:^|[^\w-])sessions?\s*(?:#\s*\d+|\d+\b)"),
                unless_followed_by: None,
            },
            Rule {
                name: "reference to a work period",
                re: re(r"\b(?:last|previous|next|earlier|later)\s+sessions?\b|\b(?:in|during|of|since|before|after)\s+this\s+session\b|\bsessions?\s+there\b"),
                unless_followed_by: re(r"^\s*(?:files?|format)\b").into(),
            },
            Rule {
                name: "ticket number as provenance",
                re: re(r"(?:^|[^\w-])(?:issues?|tickets?|pull\s+requests?)\s*(?:#\s*)?\d+"),
                unless_followed_by: re(
                    r"^[\d.]*\s*(?:per\b|every\b|an?\b|instructions?\b|µops?\b|uops?\b|cycles?\b|times\b|x\b|×)",
                )
                .into(),
            },
            Rule {
                name: "ticket number as provenance",
                re: re(r"(?:^|[\s(\[,;])#\d{1,5}\b"),
                unless_followed_by: None,
            },
            Rule {
                name: "who did what",
                re: re(r"\bengin[e]ers?\b|\bthe lead'?s\b|\blead\s+engin[e]er|\bby the lead\b|\bhelpers?\s+(?:had|have|were|was|ran|built|measured|finished)\b"),
                unless_followed_by: None,
            },
        ]
    })
}

fn line_of(starts: &[usize], at: usize) -> usize {
    starts.partition_point(|&s| s <= at)
}

/// Every place `text` names the team's bookkeeping.
pub fn bookkeeping(text: &str) -> Vec<Finding> {
    let (norm, starts) = normalize(text);
    let mut found = Vec::new();
    for rule in rules() {
        for m in rule.re.find_iter(&norm) {
            if let Some(after) = &rule.unless_followed_by {
                if after.is_match(&norm[m.end()..]) {
                    continue;
                }
            }
            // Skip the separator a pattern may have matched before the phrase.
            let s = m.as_str();
            let lead = s.len()
                - s.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '#')
                    .len();
            found.push(Finding {
                line: line_of(&starts, m.start() + lead),
                rule: rule.name,
                phrase: s[lead..].trim().to_string(),
            });
        }
    }
    found.sort_by_key(|f| f.line);
    found
}

/// Markdown headings that carry a date or a time of day.
pub fn dated_headings(markdown: &str) -> Vec<Finding> {
    static DATE: OnceLock<Regex> = OnceLock::new();
    let date = DATE.get_or_init(|| {
        Regex::new(r"(?i)\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d\s*utc\b").expect("date pattern")
    });
    let mut in_code = false;
    let mut found = Vec::new();
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let t = line.trim_start();
        if !in_code && t.starts_with('#') && t.trim_start_matches('#').starts_with(' ') {
            if let Some(m) = date.find(t) {
                found.push(Finding {
                    line: i + 1,
                    rule: "dated heading",
                    phrase: m.as_str().to_string(),
                });
            }
        }
    }
    found
}

/// The README's "Speed" section: its first line (1-based) and how many
/// lines it takes, from its heading to the next heading of its level or
/// above, trailing blank lines left out.
pub fn speed_section(readme: &str) -> Result<(usize, usize), String> {
    let lines: Vec<&str> = readme.lines().collect();
    let heads: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim_end() == "## Speed")
        .collect();
    let &[start] = heads.as_slice() else {
        return Err(format!(
            "the README needs exactly one \"## Speed\" section, found {}",
            heads.len()
        ));
    };
    let end = (start + 1..lines.len())
        .find(|&i| lines[i].starts_with("## ") || lines[i].starts_with("# "))
        .unwrap_or(lines.len());
    let mut last = end;
    while last > start + 1 && lines[last - 1].trim().is_empty() {
        last -= 1;
    }
    Ok((start + 1, last - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The phrases are assembled so that this file does not contain them.
    fn rules_hit(text: &str) -> Vec<&'static str> {
        bookkeeping(text).into_iter().map(|f| f.rule).collect()
    }

    #[test]
    fn numbered_work_periods_are_found_however_written() {
        for text in [
            concat!("see docs/PERFORMANCE.md, \"Twenty-sec", "ond ses", "sion\""),
            concat!("### Thirty-ninth ", "session: the f32 GEMM"),
            concat!("/// the 39th ", "session measured it"),
            concat!("the **twenty**-", "fifth _ses", "sion_"),
            concat!(
                "/// docs/PERFORMANCE.md, \"Twenty-\n/// first ",
                "session\")"
            ),
            concat!("fn results_of_the_eighth", "_session() {}"),
            concat!("as in ses", "sion 12"),
            concat!("(ses", "sion #", "3)"),
            concat!("In the next ", "session we"),
            concat!("measured during this ", "session"),
            concat!("A second run the", "re: later ses", "sions there"),
            concat!("the twenty\u{2011}", "second ", "session"),
        ] {
            let hits = rules_hit(text);
            assert!(
                hits.iter().any(|r| r.contains("work period")),
                "not found in {text:?}: {hits:?}"
            );
        }
    }

    #[test]
    fn ticket_numbers_and_people_are_found() {
        for text in [
            concat!("the chats of iss", "ue #", "20's table"),
            concat!("(iss", "ues 15, 16, 19: Q8_0)"),
            concat!("fn iss", "ue_19_targets() {}"),
            concat!("fixed in (#", "123)"),
            concat!("Ticket ", "7 asks"),
            concat!("shared with five other engin", "eers' builds"),
            concat!("The lead", "'s quiet run"),
        ] {
            assert!(!rules_hit(text).is_empty(), "not found in {text:?}");
        }
    }

    #[test]
    fn the_products_own_sessions_and_ordinary_words_pass() {
        for text in [
            "`--save-session FILE` / `--load-session FILE` continue a generation later",
            "let session = scratch.join(\"engine-ops.session\"); // a session saved, then loaded",
            "session file version 2 is not supported",
            "session: 25 tokens saved to {}",
            "Loading a session and clearing the sequence, again and again",
            "fuzz run gguf  # or session, tokenizer, template",
            "the second pass's loads; the first pass reads the old state",
            "`vpdpbusd` issues 2 per cycle; `vdpbf16ps` issues every other cycle",
            "{:#010x} and r#\"raw\"# strings; #[derive(Debug)]",
            "the lead over llama-server is smaller at 8 clients",
            "helpers shared by the subcommands",
            "save this session with --save-session, then load the session file",
            "1st token, 2nd row, the first period of the text",
        ] {
            assert!(
                bookkeeping(text).is_empty(),
                "{text:?}: {:?}",
                bookkeeping(text)
            );
        }
    }

    #[test]
    fn findings_name_their_line() {
        let text = concat!("fine\nalso fine\nsee the ninth\n", "session\n");
        let f = bookkeeping(text);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].line, 3);
        assert_eq!(f[0].phrase, concat!("ninth ", "session"));
    }

    #[test]
    fn dated_headings_are_found_outside_code_blocks() {
        let md = concat!(
            "# T\n\n### Quiet run (2026-",
            "12-01 17:34 UTC)\n\ntext 2026-12-01\n",
            "```\n# 2026-",
            "12-01 in a code block\n```\n## Topic\n"
        );
        let f = dated_headings(md);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].line, 3);
    }

    #[test]
    fn the_speed_section_is_measured_to_the_next_heading() {
        let md = "# coil\n\n## Speed\n\na\nb\n\n\n## Layout\nx\n";
        assert_eq!(speed_section(md), Ok((3, 4)));
        assert!(speed_section("# coil\n## Speedy\n").is_err());
        assert!(speed_section("## Speed\n## Speed\n").is_err());
        assert_eq!(speed_section("## Speed\na\n# Next\n"), Ok((1, 2)));
    }
}

//! The repository's tracked text against the rules of `coil_docs::text`:
//! no numbered work periods, ticket numbers or words about who did what in
//! any tracked Markdown, Rust, Python, shell, TOML, C or YAML file; Markdown
//! headings without dates; the README's "Speed" section and
//! docs/PERFORMANCE.md within their budgets.

use coil_docs::text::{
    bookkeeping, checked, dated_headings, speed_section, PERFORMANCE_BUDGET, SPEED_BUDGET,
};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tracked files (`git ls-files`), or, outside a git checkout, every
/// file under the root but `target/` and hidden directories.
fn tracked() -> Vec<String> {
    let root = root();
    if let Ok(out) = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
    {
        if out.status.success() && !out.stdout.is_empty() {
            return out
                .stdout
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
        }
    }
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name != ".ci" || name == "target" {
                continue;
            }
            let rel = dir.join(&name);
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(rel),
                Ok(t) if t.is_file() => files.push(rel.to_string_lossy().replace('\\', "/")),
                _ => {}
            }
        }
    }
    files
}

#[test]
fn tracked_text_names_no_bookkeeping() {
    let mut report = Vec::new();
    let mut scanned = 0;
    for path in tracked() {
        // A file listed but gone (deleted in the work tree) or not text.
        let Ok(text) = std::fs::read_to_string(root().join(&path)) else {
            continue;
        };
        if !checked(&path, text.lines().next().unwrap_or("")) {
            continue;
        }
        scanned += 1;
        let mut found = bookkeeping(&text);
        if path.ends_with(".md") {
            found.extend(dated_headings(&text));
        }
        for f in found {
            report.push(format!("{path}:{}: {} — \"{}\"", f.line, f.rule, f.phrase));
        }
    }
    assert!(
        scanned > 100,
        "only {scanned} files scanned: is the checkout complete?"
    );
    assert!(
        report.is_empty(),
        "the repository speaks of the product only: name a topic or a section instead \
         (docs/PERFORMANCE.md's sections, ARCHITECTURE.md), or nothing; put a \
         measurement's date in its text, not its heading.\n{}",
        report.join("\n")
    );
}

#[test]
fn the_readme_speed_section_keeps_its_budget() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let (line, n) = speed_section(&readme).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        n <= SPEED_BUDGET,
        "README.md:{line}: the Speed section takes {n} lines, {SPEED_BUDGET} at most: \
         one table per CPU class there, every other figure in docs/PERFORMANCE.md"
    );
    let section: String = readme
        .lines()
        .skip(line - 1)
        .take(n)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        section.contains("docs/PERFORMANCE.md"),
        "README.md:{line}: the Speed section links docs/PERFORMANCE.md"
    );
}

#[test]
fn the_performance_reference_keeps_its_budget() {
    let text = std::fs::read_to_string(root().join("docs/PERFORMANCE.md")).expect("PERFORMANCE.md");
    let n = text.lines().count();
    assert!(
        n <= PERFORMANCE_BUDGET,
        "docs/PERFORMANCE.md takes {n} lines, {PERFORMANCE_BUDGET} at most: a new measurement \
         replaces the old one in its section (git keeps the old), it is not appended"
    );
}

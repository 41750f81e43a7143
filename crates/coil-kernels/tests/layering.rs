//! The crate's files depend on each other in one direction only: a file
//! names items of its own module tree below it, of its siblings and of
//! other folders, never of a module above it (a `mod.rs` or `lib.rs` that
//! declares it), and no chain of such references comes back to where it
//! started. Read from the source text: `mod` declarations, `use` trees and
//! `crate::` / `super::` / `self::` paths in code (comments, strings and
//! test modules left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file and the module path it defines (`["matmul", "plan"]`).
struct File {
    module: Vec<String>,
    text: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src readable") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// The text without comments, string and char literals, and without the
/// item after each `#[cfg(test)]` / `#[cfg(all(test, ...))]` attribute
/// (test modules and test-only declarations).
fn code_of(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' || (b[i] == b'r' && b.get(i + 1) == Some(&b'#')) {
            // a string (raw strings with any number of #)
            if b[i] == b'r' {
                let mut hashes = 0;
                i += 1;
                while b[i] == b'#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
            } else {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if b[i] == b'\'' && (b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\')) {
            // a char literal (not a lifetime)
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    strip_test_items(&out)
}

/// Drops the item that follows a `#[cfg(test)]`-like attribute: to the end
/// of its `;` or of its braces.
fn strip_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    loop {
        let at = ["#[cfg(test)]", "#[cfg(all(test"]
            .iter()
            .filter_map(|m| rest.find(m))
            .min();
        let Some(at) = at else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        let b = rest.as_bytes();
        // skip the attribute itself
        let mut i = at + rest[at..].find(']').expect("attribute end") + 1;
        let mut depth = 0i32;
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        rest = &rest[i..];
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`super::{a, b::{c, d}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(&tree);
        return vec![path.split("as").next().unwrap_or(path).to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.len() - 1];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            expand_use(p)
                .into_iter()
                .map(|s| match s.as_str() {
                    "self" => prefix.trim_end_matches("::").to_string(),
                    _ => format!("{prefix}{s}"),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The module paths that `code` (the code of module `module`) names:
/// `(inline module path, path text)` pairs.
fn referenced_paths(module: &[String], code: &str) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    let here = |stack: &Vec<(String, i32)>| {
        let mut m = module.to_vec();
        m.extend(stack.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == '}' {
            depth -= 1;
            if stack.last().is_some_and(|(_, d)| *d == depth) {
                stack.pop();
            }
            i += 1;
            continue;
        }
        if !is_ident(c) || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        if word == "mod" {
            // `mod name {` opens an inline module
            let rest: String = chars[i..chars.len().min(i + 80)].iter().collect();
            let rest = rest.trim_start();
            // (`mod $name {` in a macro's body too)
            let name: String = rest
                .chars()
                .take_while(|&c| is_ident(c) || c == '$')
                .collect();
            if rest[name.len()..].trim_start().starts_with('{') {
                stack.push((name, depth));
            }
        } else if word == "use" {
            let end = chars[i..]
                .iter()
                .position(|&c| c == ';')
                .map_or(chars.len(), |p| i + p);
            let tree: String = chars[i..end].iter().collect();
            for p in expand_use(&tree) {
                if p.starts_with("crate::") || p.starts_with("super::") || p.starts_with("self::") {
                    out.push((here(&stack), p));
                }
            }
            i = end;
        } else if matches!(word.as_str(), "crate" | "super" | "self") {
            let mut j = i;
            let mut path = word.clone();
            while chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') {
                let s = j + 2;
                let mut e = s;
                while e < chars.len() && is_ident(chars[e]) {
                    e += 1;
                }
                if e == s {
                    break;
                }
                path.push_str("::");
                path.extend(&chars[s..e]);
                j = e;
            }
            // not a visibility (`pub(in crate::x)`) nor a macro (`crate::m!`)
            let before: String = chars[..start].iter().rev().take(4).collect();
            let visibility = before.starts_with(" ni") || before.starts_with("(ni");
            let mut k = j;
            while chars.get(k).is_some_and(|c| c.is_whitespace()) {
                k += 1;
            }
            if path.contains("::") && !visibility && chars.get(k) != Some(&'!') {
                out.push((here(&stack), path));
            }
            i = j;
        }
    }
    out
}

/// The file (index) that `path`, written in module `at`, names: the
/// deepest file module along it.
fn resolve(
    files: &BTreeMap<Vec<String>, usize>,
    at: &[String],
    path: &str,
) -> Option<(usize, Vec<String>)> {
    let mut segs = path.split("::");
    let mut m: Vec<String> = match segs.next()? {
        "crate" => Vec::new(),
        "self" => at.to_vec(),
        "super" => at[..at.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    let mut rest: Vec<&str> = segs.collect();
    while rest.first() == Some(&"super") {
        m.pop();
        rest.remove(0);
    }
    let mut best = None;
    for k in 0..=rest.len() {
        let mut cand = m.clone();
        cand.extend(rest[..k].iter().map(|s| s.to_string()));
        if let Some(&f) = files.get(&cand) {
            best = Some((f, cand));
        }
    }
    best
}

#[test]
fn no_file_depends_on_a_module_above_it_and_no_cycles() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let files: Vec<File> = paths
        .iter()
        .map(|p| File {
            module: module_of(&src, p),
            text: std::fs::read_to_string(p).expect("readable"),
        })
        .collect();
    let index: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let codes: Vec<String> = files.iter().map(|f| code_of(&f.text)).collect();
    // files declared only under `#[cfg(test)]` are tests: left out
    let declared = |f: &File| {
        let Some((last, parent)) = f.module.split_last() else {
            return true;
        };
        let decl = format!("mod {last};");
        files
            .iter()
            .zip(&codes)
            .any(|(g, c)| g.module == parent && c.contains(&decl))
    };
    let product: Vec<bool> = files.iter().map(declared).collect();
    // `#[macro_export]` macros live at the crate root whatever file defines
    // them: `crate::name` is where Rust puts them, not a dependency on lib.rs
    let exported: Vec<String> = files
        .iter()
        .flat_map(|f| {
            f.text
                .split("#[macro_export]")
                .skip(1)
                .filter_map(|t| {
                    let t = &t[t.find("macro_rules!")? + "macro_rules!".len()..];
                    Some(
                        t.trim_start()
                            .chars()
                            .take_while(|&c| is_ident(c))
                            .collect(),
                    )
                })
                .collect::<Vec<String>>()
        })
        .collect();
    let name = |i: usize| match files[i].module.is_empty() {
        true => "lib".to_string(),
        false => files[i].module.join("::"),
    };
    // edges: a declaring file to the files it declares (`mod x;`), and a
    // file to every file whose items it names
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut upward = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if !product[i] {
            continue;
        }
        let code = &codes[i];
        for (j, g) in files.iter().enumerate() {
            if g.module.len() == f.module.len() + 1 && g.module.starts_with(&f.module) {
                let decl = format!("mod {};", g.module.last().expect("child"));
                if code.contains(&decl) {
                    edges.entry(i).or_default().insert(j);
                }
            }
        }
        for (at, path) in referenced_paths(&f.module, code) {
            if exported.iter().any(|m| path == format!("crate::{m}")) {
                continue;
            }
            if let Some((j, target)) = resolve(&index, &at, &path) {
                if j != i {
                    edges.entry(i).or_default().insert(j);
                    if f.module.starts_with(&target) {
                        upward.push(format!("{} names {path} (in {})", name(i), name(j)));
                    }
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "files naming items of a module above them:\n{}",
        upward.join("\n")
    );
    // a depth-first search for a cycle
    let mut state = vec![0u8; files.len()];
    let mut trail = Vec::new();
    fn visit(
        i: usize,
        edges: &BTreeMap<usize, BTreeSet<usize>>,
        state: &mut [u8],
        trail: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[i] = 1;
        trail.push(i);
        for &j in edges.get(&i).into_iter().flatten() {
            if state[j] == 1 {
                let from = trail.iter().position(|&t| t == j).expect("on trail");
                let mut cycle = trail[from..].to_vec();
                cycle.push(j);
                return Some(cycle);
            }
            if state[j] == 0 {
                if let Some(c) = visit(j, edges, state, trail) {
                    return Some(c);
                }
            }
        }
        trail.pop();
        state[i] = 2;
        None
    }
    for i in 0..files.len() {
        if state[i] == 0 {
            if let Some(c) = visit(i, &edges, &mut state, &mut trail) {
                let names: Vec<String> = c.into_iter().map(name).collect();
                panic!("files in a cycle: {}", names.join(" -> "));
            }
        }
    }
}

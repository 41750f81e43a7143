//! llama.cpp's GBNF grammars, translated to llguidance's Lark dialect.
//!
//! GBNF (llama.cpp's `grammars/README.md`): `name ::= alternatives` rules,
//! `root` the start; `"literal"`, `[a-z]` / `[^...]` classes of code points
//! (escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`), `.` any
//! character, `( )` groups, `|`, `* + ?`, `{m}`, `{m,}`, `{m,n}`; `<[id]>`
//! a token by id, `<text>` the token whose text that is, `!` before either
//! any token but it; `#` comments. A newline ends a rule except inside
//! parentheses and after `|`.
//!
//! The translation keeps the language: a rule that uses no token and no
//! rule recursively becomes a Lark *terminal* (an uppercase name: one
//! regular expression, lexed at once) and the others stay rules; `root`
//! becomes `start`. llguidance's lexer matches a terminal as long as the
//! next byte extends it: where a GBNF grammar needs a terminal to stop
//! short (`[a-z]+ "a"` read as one terminal then `"a"`), the constraint
//! allows the longest reading only — every output still belongs to the
//! grammar. Errors name the line and column.

use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;

/// A grammar that does not parse, with where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("grammar error at line {line}, column {column}: {message}")]
pub struct GbnfError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Clone, Debug)]
enum Node {
    Lit(String),
    /// Code point ranges, negated or not.
    Class(bool, Vec<(char, char)>),
    Any,
    /// A rule by name, and where it was named (for errors).
    Ref(String, usize),
    /// A token id, or any token but it.
    Token(u32, bool),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Rep(Box<Node>, u32, Option<u32>),
}

struct Rule {
    name: String,
    body: Node,
    at: usize,
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    token_id: &'a dyn Fn(&str) -> Option<u32>,
    n_vocab: usize,
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Line and column (1-based, in characters) of byte offset `at`.
fn line_col(src: &str, at: usize) -> (usize, usize) {
    let at = at.min(src.len());
    let before = &src[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

impl Parser<'_> {
    fn err<T>(&self, at: usize, msg: impl Into<String>) -> Result<T, GbnfError> {
        let (line, column) = line_col(self.src, at);
        Err(GbnfError {
            line,
            column,
            message: msg.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Spaces, tabs and comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' || c == '\r' {
                            break;
                        }
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word) {
            self.pos += 1;
        }
        if self.pos == start {
            return self.err(start, "expected a rule name");
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn int(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start {
            return self.err(start, "expected a number");
        }
        self.src[start..self.pos]
            .parse()
            .or_else(|_| self.err(start, "the number is too large"))
    }

    fn hex(&mut self, n: usize, at: usize) -> Result<char, GbnfError> {
        let digits: String = self.src[self.pos..].chars().take(n).collect();
        if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return self.err(at, format!("expected {n} hex digits in the escape"));
        }
        self.pos += n;
        let v = u32::from_str_radix(&digits, 16).or_else(|_| self.err(at, "bad hex escape"))?;
        char::from_u32(v).map_or_else(
            || self.err(at, format!("\\u{v:x} is not a Unicode scalar value")),
            Ok,
        )
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, GbnfError> {
        let at = self.pos;
        match self.bump() {
            None => self.err(at, "unexpected end of the grammar"),
            Some('\\') => match self.bump() {
                Some('x') => self.hex(2, at),
                Some('u') => self.hex(4, at),
                Some('U') => self.hex(8, at),
                Some('t') => Ok('\t'),
                Some('r') => Ok('\r'),
                Some('n') => Ok('\n'),
                Some(c @ ('\\' | '"' | '[' | ']')) => Ok(c),
                Some(c) => self.err(at, format!("unknown escape \\{c}")),
                None => self.err(at, "unexpected end of the grammar"),
            },
            Some(c) => Ok(c),
        }
    }

    fn literal(&mut self) -> Result<Node, GbnfError> {
        let start = self.pos;
        self.pos += 1; // "
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return self.err(start, "unterminated string literal"),
                Some('"') => {
                    self.pos += 1;
                    return Ok(Node::Lit(s));
                }
                Some(_) => s.push(self.char()?),
            }
        }
    }

    fn class(&mut self) -> Result<Node, GbnfError> {
        let start = self.pos;
        self.pos += 1; // [
        let neg = self.peek() == Some('^');
        if neg {
            self.pos += 1;
        }
        let mut items = Vec::new();
        loop {
            match self.peek() {
                None => return self.err(start, "unterminated character class"),
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let lo = self.char()?;
                    let mut hi = lo;
                    let rest = &self.src[self.pos..];
                    if rest.starts_with('-') && !rest[1..].starts_with(']') && rest.len() > 1 {
                        self.pos += 1;
                        let at = self.pos;
                        hi = self.char()?;
                        if hi < lo {
                            return self.err(at, format!("the range {lo:?}-{hi:?} is reversed"));
                        }
                    }
                    items.push((lo, hi));
                }
            }
        }
        if items.is_empty() && !neg {
            return self.err(start, "empty character class");
        }
        Ok(Node::Class(neg, items))
    }

    /// `<[id]>` or `<text>`, after an optional `!`.
    fn token(&mut self, neg: bool) -> Result<Node, GbnfError> {
        let start = self.pos;
        let Some(end) = self.src[self.pos..].find('>') else {
            return self.err(start, "unterminated token reference (no '>')");
        };
        let inner = &self.src[self.pos + 1..self.pos + end];
        let id = if let Some(num) = inner.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            match num.trim().parse::<u32>() {
                Ok(id) if (id as usize) < self.n_vocab => id,
                Ok(id) => {
                    return self.err(
                        start,
                        format!(
                            "token id {id} is outside the vocabulary of {}",
                            self.n_vocab
                        ),
                    )
                }
                Err(_) => return self.err(start, format!("bad token id <[{num}]>")),
            }
        } else {
            let text = &self.src[self.pos..self.pos + end + 1];
            match (self.token_id)(text) {
                Some(id) => id,
                None => {
                    return self.err(
                        start,
                        format!("{text} is not a token of this model's vocabulary"),
                    )
                }
            }
        };
        self.pos += end + 1;
        Ok(Node::Token(id, neg))
    }

    fn alternatives(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or(Node::Seq(Vec::new()))
        } else {
            Node::Alt(alts)
        })
    }

    fn sequence(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut items: Vec<Node> = Vec::new();
        while let Some(c) = self.peek() {
            let at = self.pos;
            match c {
                '"' => items.push(self.literal()?),
                '[' => items.push(self.class()?),
                '.' => {
                    self.pos += 1;
                    items.push(Node::Any);
                }
                '<' => items.push(self.token(false)?),
                '!' => {
                    self.pos += 1;
                    if self.peek() != Some('<') {
                        return self.err(at, "expected a token reference after '!'");
                    }
                    items.push(self.token(true)?);
                }
                '(' => {
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternatives(true)?;
                    if self.peek() != Some(')') {
                        return self.err(self.pos, "expected ')'");
                    }
                    self.pos += 1;
                    items.push(inner);
                }
                '*' | '+' | '?' | '{' => {
                    let Some(last) = items.pop() else {
                        return self.err(at, format!("'{c}' follows nothing to repeat"));
                    };
                    let (min, max) = match c {
                        '*' => {
                            self.pos += 1;
                            (0, None)
                        }
                        '+' => {
                            self.pos += 1;
                            (1, None)
                        }
                        '?' => {
                            self.pos += 1;
                            (0, Some(1))
                        }
                        _ => self.braces()?,
                    };
                    items.push(Node::Rep(Box::new(last), min, max));
                }
                c if is_word(c) => {
                    let name = self.name()?;
                    items.push(Node::Ref(name, at));
                }
                _ => break,
            }
            self.space(nested);
        }
        Ok(if items.len() == 1 {
            items.pop().unwrap_or(Node::Seq(Vec::new()))
        } else {
            Node::Seq(items)
        })
    }

    /// `{m}`, `{m,}`, `{m,n}` or `{,n}`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let start = self.pos;
        self.pos += 1;
        self.space(true);
        let min = if self.peek() == Some(',') {
            0
        } else {
            self.int()?
        };
        self.space(true);
        let max = match self.peek() {
            Some('}') => Some(min),
            Some(',') => {
                self.pos += 1;
                self.space(true);
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    Some(self.int()?)
                } else {
                    None
                }
            }
            _ => return self.err(self.pos, "expected ',' or '}' in a repetition"),
        };
        self.space(true);
        if self.peek() != Some('}') {
            return self.err(self.pos, "expected '}'");
        }
        self.pos += 1;
        if let Some(max) = max {
            if max < min {
                return self.err(start, format!("the repetition {{{min},{max}}} is reversed"));
            }
        }
        Ok((min, max))
    }

    fn rules(&mut self) -> Result<Vec<Rule>, GbnfError> {
        let mut rules: Vec<Rule> = Vec::new();
        self.space(true);
        while self.pos < self.src.len() {
            let at = self.pos;
            let name = self.name()?;
            self.space(false);
            if !self.src[self.pos..].starts_with("::=") {
                return self.err(
                    self.pos,
                    format!("expected '::=' after the rule name {name}"),
                );
            }
            self.pos += 3;
            self.space(true);
            let body = self.alternatives(false)?;
            match self.peek() {
                None | Some('\n') | Some('\r') => {}
                Some(c) => return self.err(self.pos, format!("unexpected {c:?}")),
            }
            if let Some(prev) = rules.iter().find(|r| r.name == name) {
                let (line, _) = line_col(self.src, prev.at);
                return self.err(
                    at,
                    format!("rule {name} is defined twice (first on line {line})"),
                );
            }
            rules.push(Rule { name, body, at });
            self.space(true);
        }
        Ok(rules)
    }
}

/// Whether `n` can be a terminal given which rules are.
fn is_terminal(n: &Node, terminal: &HashMap<&str, bool>) -> bool {
    match n {
        Node::Lit(_) | Node::Class(..) | Node::Any => true,
        Node::Token(..) => false,
        Node::Ref(name, _) => terminal.get(name.as_str()).copied().unwrap_or(false),
        Node::Seq(v) | Node::Alt(v) => v.iter().all(|c| is_terminal(c, terminal)),
        Node::Rep(c, ..) => is_terminal(c, terminal),
    }
}

fn refs<'a>(n: &'a Node, out: &mut Vec<(&'a str, usize)>) {
    match n {
        Node::Ref(name, at) => out.push((name, *at)),
        Node::Seq(v) | Node::Alt(v) => v.iter().for_each(|c| refs(c, out)),
        Node::Rep(c, ..) => refs(c, out),
        _ => {}
    }
}

fn push_class_char(out: &mut String, c: char) {
    let _ = write!(out, "\\x{{{:x}}}", c as u32);
}

fn write_node(n: &Node, names: &HashMap<&str, String>, out: &mut String) {
    match n {
        Node::Lit(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Node::Class(neg, items) => {
            out.push_str(if *neg { "/[^" } else { "/[" });
            for &(lo, hi) in items {
                push_class_char(out, lo);
                if hi != lo {
                    out.push('-');
                    push_class_char(out, hi);
                }
            }
            out.push_str("]/");
        }
        Node::Any => out.push_str("/(?s:.)/"),
        Node::Ref(name, _) => out.push_str(&names[name.as_str()]),
        Node::Token(id, neg) => {
            let _ = write!(out, "<[{}{id}]>", if *neg { "^" } else { "" });
        }
        Node::Seq(v) if v.is_empty() => out.push_str("\"\""),
        Node::Seq(v) => {
            for (i, c) in v.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let group = matches!(c, Node::Alt(_));
                if group {
                    out.push('(');
                }
                write_node(c, names, out);
                if group {
                    out.push(')');
                }
            }
        }
        Node::Alt(v) => {
            for (i, c) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                write_node(c, names, out);
            }
        }
        Node::Rep(c, min, max) => {
            out.push('(');
            write_node(c, names, out);
            out.push(')');
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(x)) => {
                    let _ = write!(out, "{{{m},{x}}}");
                }
            }
        }
    }
}

/// Translates a GBNF grammar to Lark. `token_id` finds the token a
/// `<text>` reference names; `n_vocab` bounds `<[id]>`.
pub fn to_lark(
    src: &str,
    token_id: &dyn Fn(&str) -> Option<u32>,
    n_vocab: usize,
) -> Result<String, GbnfError> {
    let mut p = Parser {
        src,
        pos: 0,
        token_id,
        n_vocab,
    };
    let rules = p.rules()?;
    let Some(root) = rules.iter().position(|r| r.name == "root") else {
        return p.err(src.len(), "the grammar has no 'root' rule");
    };
    for r in &rules {
        let mut named = Vec::new();
        refs(&r.body, &mut named);
        if let Some((name, at)) = named
            .into_iter()
            .find(|(n, _)| !rules.iter().any(|r| r.name == *n))
        {
            return p.err(at, format!("rule {name} is used but not defined"));
        }
    }
    // Terminals: to a fixed point (a rule that reaches itself never is one).
    let mut terminal: HashMap<&str, bool> =
        rules.iter().map(|r| (r.name.as_str(), false)).collect();
    loop {
        let mut changed = false;
        for r in &rules {
            if !terminal[r.name.as_str()] && is_terminal(&r.body, &terminal) {
                terminal.insert(&r.name, true);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let names: HashMap<&str, String> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let clean: String = r
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let name = if terminal[r.name.as_str()] {
                format!("T{i}_{}", clean.to_ascii_uppercase())
            } else {
                format!("r{i}_{}", clean.to_ascii_lowercase())
            };
            (r.name.as_str(), name)
        })
        .collect();
    let mut out = String::from("%llguidance {}\n\n");
    let _ = writeln!(out, "start: {}", names["root"]);
    let _ = root;
    for r in &rules {
        out.push_str(&names[r.name.as_str()]);
        out.push_str(": ");
        write_node(&r.body, &names, &mut out);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lark(src: &str) -> Result<String, GbnfError> {
        to_lark(src, &|t| (t == "<think>").then_some(7), 100)
    }

    #[test]
    fn translates_rules_terminals_and_tokens() {
        let l = lark("root ::= item+ <think> !<[3]>\n# c\nitem ::= \"- \" [^\\n\\x85]+ \"\\n\"\n")
            .unwrap();
        assert!(l.contains("start: r0_root"), "{l}");
        assert!(l.contains("r0_root: (T1_ITEM)+ <[7]> <[^3]>"), "{l}");
        assert!(
            l.contains(r#"T1_ITEM: "- " (/[^\x{a}\x{85}]/)+ "\n""#),
            "{l}"
        );
        // recursion stays a rule
        let l = lark("root ::= e\ne ::= \"(\" e \")\" | [0-9]{1,3}\n").unwrap();
        assert!(
            l.contains("r1_e: \"(\" r1_e \")\" | (/[\\x{30}-\\x{39}]/){1,3}"),
            "{l}"
        );
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = lark("root ::= a\n").unwrap_err();
        assert_eq!((e.line, e.column), (1, 10), "{e}");
        assert!(e.message.contains("a is used but not defined"));
        let e = lark("root ::= \"x\"\nfoo ::= [a-\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e = lark("root ::= \"x\" )\n").unwrap_err();
        assert_eq!((e.line, e.column), (1, 14), "{e}");
        let e = lark("item ::= \"x\"\n").unwrap_err();
        assert!(e.message.contains("root"), "{e}");
        let e = lark("root ::= <nope>\n").unwrap_err();
        assert!(e.message.contains("<nope>"), "{e}");
        let e = lark("root ::= * \"x\"\n").unwrap_err();
        assert_eq!((e.line, e.column), (1, 10), "{e}");
        let e = lark("root ::= \"x\"\nroot ::= \"y\"\n").unwrap_err();
        assert!(e.message.contains("defined twice"), "{e}");
        let e = lark("root ::= \"\\q\"\n").unwrap_err();
        assert!(e.message.contains("escape"), "{e}");
    }
}

//! PCRE patterns, as ngx.re compiles them for the Lua WAF, rewritten for
//! the regex crate so that both find a match in the same subjects.
//!
//! ngx.re.find(s, p, "jo") compiles `p` with PCRE 8 in byte mode (no "u"
//! flag): `.`, classes, `\d \w \s \b` and `(?i)` are about bytes and ASCII.
//! The regex crate's `(?-u)` mode in `regex::bytes` has the same meaning;
//! what differs is spelled out here:
//!
//! - `$` (no multiline flag) also matches before a final newline in PCRE;
//!   here it becomes `(?:\n?\z)`. Consuming that newline changes where a
//!   match ends, not whether there is one, and the WAF only asks whether.
//! - `{` not starting a quantifier, `]` outside a class, `[` and `^` inside
//!   one are literals in PCRE; here they are escaped.
//! - Inside a class `&&`, `--` and `~~` are set operations here; `&`, `~`
//!   and a literal `-` are escaped.
//! - `\xh` takes one or two hex digits in PCRE; it becomes `\x{hh}`, and
//!   `[\b]` (backspace) becomes `\x{08}`.
//!
//! Whatever the regex crate cannot express with the same meaning
//! (lookaround, backreferences, atomic groups, possessive quantifiers,
//! `\Q`, inline flags other than `i`, ...) is an [`Unsupported`] error
//! naming the construct, never a silent approximation.

use std::fmt;

/// A construct of a PCRE pattern with no equivalent here.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unsupported PCRE construct {}", self.0)
    }
}

impl std::error::Error for Unsupported {}

/// Escapes that mean the same in PCRE byte mode and in `(?-u)`.
const SAME_ESCAPES: &[u8] = b"dDwWsSbBnrtfaAz";
/// The same inside a class (`\b` there is a backspace, handled apart).
const SAME_CLASS_ESCAPES: &[u8] = b"dDwWsSnrtfa";

/// Appends the byte `b` as a literal.
fn literal(out: &mut String, b: u8) {
    match b {
        b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'<' | b'>' => out.push(b as char),
        // Every other ASCII punctuation character may be escaped.
        b'!'..=b'~' => {
            out.push('\\');
            out.push(b as char);
        }
        _ => out.push_str(&format!("\\x{{{b:02X}}}")),
    }
}

struct Translator<'a> {
    src: &'a [u8],
    pos: usize,
    out: String,
}

impl<'a> Translator<'a> {
    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn rest(&self) -> &'a [u8] {
        &self.src[self.pos..]
    }

    /// The length of a PCRE quantifier `{n}`, `{n,}` or `{n,m}` whose `{`
    /// was just read, or None if that `{` is a literal.
    fn counted_len(&self) -> Option<usize> {
        let rest = &self.src[self.pos - 1..];
        let digits = |from: usize| {
            rest[from..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
        };
        let n = digits(1);
        if n == 0 {
            return None;
        }
        let mut end = 1 + n;
        if rest.get(end) == Some(&b',') {
            end += 1 + digits(end + 1);
        }
        (rest.get(end) == Some(&b'}')).then_some(end + 1)
    }

    /// `\x` with one or two hex digits (the cursor after the `x`).
    fn hex(&mut self) -> Result<u8, Unsupported> {
        let n = self
            .rest()
            .iter()
            .take(2)
            .take_while(|c| c.is_ascii_hexdigit())
            .count();
        if n == 0 {
            return Err(Unsupported("\\x without hex digits (or \\x{...})".into()));
        }
        let digits = std::str::from_utf8(&self.rest()[..n]).expect("hex digits are ASCII");
        self.pos += n;
        Ok(u8::from_str_radix(digits, 16).expect("checked hex digits"))
    }

    /// An escape outside a class (the cursor after the backslash).
    fn escape(&mut self) -> Result<(), Unsupported> {
        let Some(c) = self.peek() else {
            return Err(Unsupported("trailing \\".into()));
        };
        self.pos += 1;
        if c == b'x' {
            let b = self.hex()?;
            literal(&mut self.out, b);
        } else if SAME_ESCAPES.contains(&c) {
            self.out.push('\\');
            self.out.push(c as char);
        } else if c.is_ascii_alphanumeric() {
            return Err(Unsupported(format!("\\{}", c as char)));
        } else {
            literal(&mut self.out, c);
        }
        Ok(())
    }

    /// `(` and what follows it (the cursor after the parenthesis).
    fn group(&mut self) -> Result<(), Unsupported> {
        if self.peek() != Some(b'?') {
            self.out.push('(');
            return Ok(());
        }
        let rest = self.rest();
        for ok in [&b"?:"[..], b"?i)", b"?i:"] {
            if rest.starts_with(ok) {
                self.out.push('(');
                self.out.push_str(std::str::from_utf8(ok).expect("ASCII"));
                self.pos += ok.len();
                return Ok(());
            }
        }
        let end = rest.len().min(4);
        Err(Unsupported(format!(
            "({}",
            String::from_utf8_lossy(&rest[..end])
        )))
    }

    /// A character class (the cursor after the `[`).
    fn class(&mut self) -> Result<(), Unsupported> {
        self.out.push('[');
        if self.peek() == Some(b'^') {
            self.out.push('^');
            self.pos += 1;
        }
        // Whether the last item was one character, which a `-` then makes
        // the start of a range (unless the class ends right after it).
        let mut single = false;
        let mut first = true;
        loop {
            let Some(c) = self.peek() else {
                return Err(Unsupported("unterminated class".into()));
            };
            self.pos += 1;
            match c {
                b']' if !first => {
                    self.out.push(']');
                    return Ok(());
                }
                b'-' if single && self.peek() != Some(b']') => {
                    self.out.push('-');
                    // The range's end: one character, as an item.
                    let Some(end) = self.peek() else { continue };
                    self.pos += 1;
                    match end {
                        b'\\' => {
                            let b = self.class_escape()?;
                            literal(
                                &mut self.out,
                                b.ok_or_else(|| {
                                    Unsupported("a class escape ending a range".into())
                                })?,
                            );
                        }
                        _ => literal(&mut self.out, end),
                    }
                    single = false;
                }
                b'\\' => match self.class_escape()? {
                    Some(b) => {
                        literal(&mut self.out, b);
                        single = true;
                    }
                    None => single = false,
                },
                b'[' if self.rest().starts_with(b":") => {
                    let Some(len) = self.rest().windows(2).position(|w| w == b":]") else {
                        return Err(Unsupported("[: without :]".into()));
                    };
                    self.out.push('[');
                    self.out
                        .push_str(&String::from_utf8_lossy(&self.rest()[..len + 2]));
                    self.pos += len + 2;
                    single = false;
                }
                _ => {
                    literal(&mut self.out, c);
                    single = true;
                }
            }
            first = false;
        }
    }

    /// An escape inside a class (the cursor after the backslash): the byte
    /// it stands for, or None for a class like `\d`, already written.
    fn class_escape(&mut self) -> Result<Option<u8>, Unsupported> {
        let Some(c) = self.peek() else {
            return Err(Unsupported("trailing \\".into()));
        };
        self.pos += 1;
        match c {
            b'x' => Ok(Some(self.hex()?)),
            b'b' => Ok(Some(0x08)),
            b'n' => Ok(Some(b'\n')),
            b'r' => Ok(Some(b'\r')),
            b't' => Ok(Some(b'\t')),
            b'f' => Ok(Some(0x0C)),
            b'a' => Ok(Some(0x07)),
            _ if SAME_CLASS_ESCAPES.contains(&c) => {
                self.out.push('\\');
                self.out.push(c as char);
                Ok(None)
            }
            _ if c.is_ascii_alphanumeric() => Err(Unsupported(format!("[\\{}]", c as char))),
            _ => Ok(Some(c)),
        }
    }

    fn run(mut self) -> Result<String, Unsupported> {
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                b'\\' => self.escape()?,
                b'[' => self.class()?,
                b'(' => self.group()?,
                b'$' => self.out.push_str(r"(?:\n?\z)"),
                b'{' => match self.counted_len() {
                    Some(len) => {
                        let q = &self.src[self.pos - 1..self.pos - 1 + len];
                        self.out.push_str(std::str::from_utf8(q).expect("ASCII"));
                        self.pos += len - 1;
                        self.possessive()?;
                    }
                    None => literal(&mut self.out, c),
                },
                b'*' | b'+' | b'?' => {
                    self.out.push(c as char);
                    self.possessive()?;
                }
                b')' | b'|' | b'.' | b'^' => self.out.push(c as char),
                _ => literal(&mut self.out, c),
            }
        }
        Ok(self.out)
    }

    /// Lets a lazy `?` after a quantifier through; rejects a possessive `+`.
    fn possessive(&mut self) -> Result<(), Unsupported> {
        match self.peek() {
            Some(b'+') => Err(Unsupported("possessive quantifier".into())),
            Some(b'?') => {
                self.pos += 1;
                self.out.push('?');
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// `pattern` (PCRE, byte mode) as a pattern for `regex::bytes` that
/// matches the same subjects.
pub fn translate(pattern: &str) -> Result<String, Unsupported> {
    let t = Translator {
        src: pattern.as_bytes(),
        pos: 0,
        out: String::from("(?-u)"),
    };
    t.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(p: &str) -> String {
        translate(p).unwrap()
    }

    #[test]
    fn rewrites_what_differs() {
        assert_eq!(t("a$"), r"(?-u)a(?:\n?\z)");
        assert_eq!(t(r"[$]\$"), r"(?-u)[\$]\$");
        assert_eq!(t("a{2,}b{x}c{,3}"), r"(?-u)a{2,}b\{x\}c\{\,3\}");
        assert_eq!(t(r"[]a&&~-]"), r"(?-u)[\]a\&\&\~\-]");
        assert_eq!(t(r"[a-z-9\d-x]"), r"(?-u)[a-z\-9\d\-x]");
        assert_eq!(t(r"[[:alpha:]^[]"), r"(?-u)[[:alpha:]\^\[]");
        assert_eq!(t(r"\x0\xff[\b]"), r"(?-u)\x{00}\x{FF}[\x{08}]");
        assert_eq!(t(r#"(?i)\"'<\b"#), r#"(?-u)(?i)\"\'<\b"#);
        assert_eq!(t(r"a*?(?:b)+?"), r"(?-u)a*?(?:b)+?");
    }

    #[test]
    fn names_what_has_no_equivalent() {
        for (p, what) in [
            ("a(?=b)", "(?=b)"),
            ("(a)\\1", "\\1"),
            ("(?>a)", "(?>a)"),
            ("a++", "possessive quantifier"),
            ("(?m)a$", "(?m)a"),
            (r"\Qa\E", "\\Q"),
        ] {
            assert_eq!(translate(p), Err(Unsupported(what.into())), "{p}");
        }
    }
}

//! Reads nginx-conf/waf_rules.lua, the rule file the Lua WAF (waf.lua)
//! `require`s, so that both WAFs run the same rules from one file.
//!
//! The file is a Lua chunk returning a table constructor: `return { { id =
//! N, pattern = [[...]], targets = { "args", ... }, msg = "..." }, ... }`.
//! This reads that subset of Lua (table constructors of strings, integers
//! and names, comments, short and long strings), enough for the generated
//! file and for hand edits of it, and nothing that would need running Lua.

use std::fmt;

/// What a rule looks at (waf.lua's `TARGETS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The decoded path.
    Uri,
    /// Query argument names and values.
    Args,
    /// All header values.
    Headers,
    /// The decoded body.
    Body,
    /// The values of the User-Agent header.
    UserAgent,
}

impl Target {
    /// Every target, in the order [`Target::index`] numbers them.
    pub const ALL: [Target; 5] = [
        Target::Uri,
        Target::Args,
        Target::Headers,
        Target::Body,
        Target::UserAgent,
    ];

    /// The position of this target in [`Target::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    fn from_name(name: &[u8]) -> Option<Target> {
        Some(match name {
            b"uri" => Target::Uri,
            b"args" => Target::Args,
            b"headers" => Target::Headers,
            b"body" => Target::Body,
            b"user_agent" => Target::UserAgent,
            _ => return None,
        })
    }
}

/// One rule as the file states it; `pattern` is PCRE, for
/// `ngx.re.find(subject, pattern, "jo")`.
#[derive(Clone, Debug)]
pub struct Rule {
    pub id: u32,
    pub pattern: String,
    /// Not empty.
    pub targets: Vec<Target>,
    pub msg: String,
}

/// Why the rule file cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub enum RulesError {
    /// Not the Lua subset this reads, at a 1-based line.
    Syntax { line: usize, what: String },
    /// A rule without a field it needs, or with a bad one (1-based position).
    Field { rule: usize, what: String },
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RulesError::Syntax { line, what } => write!(f, "line {line}: {what}"),
            RulesError::Field { rule, what } => write!(f, "rule #{rule}: {what}"),
        }
    }
}

impl std::error::Error for RulesError {}

/// A value of the table constructor.
#[derive(Debug)]
enum Value {
    Str(Vec<u8>),
    Int(u64),
    Table(Vec<(Option<Vec<u8>>, Value)>),
}

struct Reader<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
}

impl<'a> Reader<'a> {
    fn error<T>(&self, what: impl Into<String>) -> Result<T, RulesError> {
        Err(RulesError::Syntax {
            line: self.line,
            what: what.into(),
        })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Skips spaces and comments.
    fn skip(&mut self) -> Result<(), RulesError> {
        loop {
            match self.peek() {
                Some(c) if c.is_ascii_whitespace() => {
                    self.bump();
                }
                Some(b'-') if self.src.get(self.pos + 1) == Some(&b'-') => {
                    self.pos += 2;
                    if self.long_level().is_some() {
                        self.long_bracket()?;
                    } else {
                        while !matches!(self.peek(), None | Some(b'\n')) {
                            self.bump();
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    /// The level of a long bracket `[==[` at the cursor, if one is there.
    fn long_level(&self) -> Option<usize> {
        let rest = self.src.get(self.pos..)?;
        let eq = rest.iter().skip(1).take_while(|&&c| c == b'=').count();
        (rest.first() == Some(&b'[') && rest.get(1 + eq) == Some(&b'[')).then_some(eq)
    }

    /// A long string or comment; the cursor is on its `[`.
    fn long_bracket(&mut self) -> Result<Vec<u8>, RulesError> {
        let level = self.long_level().unwrap_or(0);
        for _ in 0..level + 2 {
            self.bump();
        }
        // Lua drops a newline right after the opening bracket.
        if self.peek() == Some(b'\n') {
            self.bump();
        }
        let mut close = vec![b']'];
        close.extend(std::iter::repeat_n(b'=', level));
        close.push(b']');
        let start = self.pos;
        while !self.src[self.pos..].starts_with(&close) {
            if self.bump().is_none() {
                return self.error("unfinished long string");
            }
        }
        let s = self.src[start..self.pos].to_vec();
        self.pos += close.len();
        Ok(s)
    }

    /// A quoted string; the cursor is on its quote.
    fn quoted(&mut self) -> Result<Vec<u8>, RulesError> {
        let quote = self.bump();
        let mut s = Vec::new();
        loop {
            match self.bump() {
                None | Some(b'\n') => return self.error("unfinished string"),
                Some(c) if Some(c) == quote => return Ok(s),
                Some(b'\\') => s.push(match self.bump() {
                    Some(b'n') => b'\n',
                    Some(b't') => b'\t',
                    Some(b'r') => b'\r',
                    Some(c @ (b'\\' | b'"' | b'\'')) => c,
                    Some(c) if c.is_ascii_digit() => {
                        let mut n = u32::from(c - b'0');
                        for _ in 0..2 {
                            match self.peek() {
                                Some(d) if d.is_ascii_digit() => {
                                    n = n * 10 + u32::from(d - b'0');
                                    self.bump();
                                }
                                _ => break,
                            }
                        }
                        match u8::try_from(n) {
                            Ok(b) => b,
                            Err(_) => return self.error("decimal escape too large"),
                        }
                    }
                    _ => return self.error("unsupported escape in a string"),
                }),
                Some(c) => s.push(c),
            }
        }
    }

    fn name(&mut self) -> Vec<u8> {
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.bump();
        }
        self.src[start..self.pos].to_vec()
    }

    fn value(&mut self) -> Result<Value, RulesError> {
        self.skip()?;
        match self.peek() {
            Some(b'{') => self.table(),
            Some(b'"' | b'\'') => Ok(Value::Str(self.quoted()?)),
            Some(b'[') if self.long_level().is_some() => Ok(Value::Str(self.long_bracket()?)),
            Some(c) if c.is_ascii_digit() => {
                let digits = self.name();
                match std::str::from_utf8(&digits)
                    .ok()
                    .and_then(|d| d.parse().ok())
                {
                    Some(n) => Ok(Value::Int(n)),
                    None => self.error("not a decimal integer"),
                }
            }
            _ => self.error("expected a string, an integer or a table"),
        }
    }

    /// A table constructor; the cursor is on its `{`.
    fn table(&mut self) -> Result<Value, RulesError> {
        self.bump();
        let mut fields = Vec::new();
        loop {
            self.skip()?;
            if self.peek() == Some(b'}') {
                self.bump();
                return Ok(Value::Table(fields));
            }
            let key = match self.peek() {
                Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                    let key = self.name();
                    self.skip()?;
                    if self.bump() != Some(b'=') {
                        return self.error("expected = after a field name");
                    }
                    Some(key)
                }
                _ => None,
            };
            fields.push((key, self.value()?));
            self.skip()?;
            match self.peek() {
                Some(b',' | b';') => {
                    self.bump();
                }
                Some(b'}') => {}
                _ => return self.error("expected , or } in a table"),
            }
        }
    }
}

fn field<'v>(fields: &'v [(Option<Vec<u8>>, Value)], name: &str) -> Option<&'v Value> {
    fields
        .iter()
        .find(|(k, _)| k.as_deref() == Some(name.as_bytes()))
        .map(|(_, v)| v)
}

fn rule(n: usize, value: &Value) -> Result<Rule, RulesError> {
    let bad = |what: &str| RulesError::Field {
        rule: n,
        what: what.to_string(),
    };
    let Value::Table(fields) = value else {
        return Err(bad("not a table"));
    };
    let text = |name: &str| match field(fields, name) {
        Some(Value::Str(s)) => String::from_utf8(s.clone()).map_err(|_| bad("not UTF-8")),
        _ => Err(bad(&format!("no string {name}"))),
    };
    let id = match field(fields, "id") {
        Some(&Value::Int(id)) => u32::try_from(id).map_err(|_| bad("id too large"))?,
        _ => return Err(bad("no integer id")),
    };
    let targets = match field(fields, "targets") {
        Some(Value::Table(list)) if !list.is_empty() => list
            .iter()
            .map(|(k, v)| match (k, v) {
                (None, Value::Str(s)) => Target::from_name(s)
                    .ok_or_else(|| bad(&format!("unknown target {}", String::from_utf8_lossy(s)))),
                _ => Err(bad("targets is not a list of names")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad("no targets")),
    };
    Ok(Rule {
        id,
        pattern: text("pattern")?,
        targets,
        msg: text("msg")?,
    })
}

/// The rules of a rule file's text, in file order.
pub fn parse(src: &[u8]) -> Result<Vec<Rule>, RulesError> {
    let mut r = Reader {
        src,
        pos: 0,
        line: 1,
    };
    r.skip()?;
    if r.name() != b"return" {
        return r.error("expected `return {`");
    }
    let Value::Table(list) = r.value()? else {
        return r.error("expected `return {`");
    };
    r.skip()?;
    if r.peek().is_some() {
        return r.error("text after the table");
    }
    list.iter()
        .enumerate()
        .map(|(i, (key, v))| match key {
            None => rule(i + 1, v),
            Some(_) => Err(RulesError::Field {
                rule: i + 1,
                what: "a named field in the list of rules".into(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_generated_forms() {
        let src = br#"-- a comment
return {
{ id = 7, pattern = [==[a]]b]==], targets = { "args", "user_agent" },
  msg = "say \"hi\" \\ \65" },
--[[ a long
comment ]]
{ id = 8, pattern = '[\n]', targets = { "uri" }, msg = [[
m]] };
}
"#;
        let rules = parse(src).unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].id, 7);
        assert_eq!(rules[0].pattern, "a]]b");
        assert_eq!(rules[0].targets, [Target::Args, Target::UserAgent]);
        assert_eq!(rules[0].msg, "say \"hi\" \\ A");
        assert_eq!(rules[1].pattern, "[\n]");
        assert_eq!(rules[1].msg, "m");
    }

    #[test]
    fn names_what_is_wrong() {
        let err = |src: &[u8]| parse(src).unwrap_err().to_string();
        assert_eq!(err(b"return {\n{ id = 1 }}"), "rule #1: no targets");
        assert_eq!(
            err(b"return {{ id = 1, pattern = 'a', targets = { 'cookie' }, msg = '' }}"),
            "rule #1: unknown target cookie"
        );
        assert_eq!(
            err(b"return {\n\n{ id = 1 "),
            "line 3: expected , or } in a table"
        );
        assert_eq!(err(b"x = 1"), "line 1: expected `return {`");
    }
}

//! Reads nginx-conf/waf_rules.lua, the rule file the Lua WAF (waf.lua)
//! `require`s, so that both WAFs run the same rules from one file.
//!
//! The file is a Lua chunk returning a table constructor: `return { { id =
//! N, pattern = [[...]], targets = { "args", ... }, msg = "..." }, ... }`.
//! This reads that subset of Lua (table constructors of strings, integers
//! and names, comments, short and long strings), enough for the generated
//! file and for hand edits of it, and nothing that would need running Lua.
//! A pool update's extra rules ([`RuleList`]) have the same shape, as a
//! Lua array, and are checked by the same code.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};

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
    /// A rule without a field it needs, or with a bad one: its 1-based
    /// position, and its id once that was read.
    Field {
        rule: usize,
        id: Option<u32>,
        what: String,
    },
    /// A list of rules that is not a list.
    NotAList,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RulesError::Syntax { line, what } => write!(f, "line {line}: {what}"),
            RulesError::Field {
                id: Some(id), what, ..
            } => write!(f, "waf rule {id}: {what}"),
            RulesError::Field { rule, what, .. } => write!(f, "rule #{rule}: {what}"),
            RulesError::NotAList => f.write_str("expected a list of rules"),
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
    let error = |id, what: &str| RulesError::Field {
        rule: n,
        id,
        what: what.to_string(),
    };
    let Value::Table(fields) = value else {
        return Err(error(None, "not a table"));
    };
    let id = match field(fields, "id") {
        Some(&Value::Int(id)) => u32::try_from(id).map_err(|_| error(None, "id too large"))?,
        _ => return Err(error(None, "no integer id")),
    };
    let bad = |what: &str| error(Some(id), what);
    let text = |name: &str| match field(fields, name) {
        Some(Value::Str(s)) => String::from_utf8(s.clone()).map_err(|_| bad("not UTF-8")),
        _ => Err(bad(&format!("no string {name}"))),
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
    rules_of(&list)
}

/// The rules of a list's items, in order.
fn rules_of(list: &[(Option<Vec<u8>>, Value)]) -> Result<Vec<Rule>, RulesError> {
    list.iter()
        .enumerate()
        .map(|(i, (key, v))| match key {
            None => rule(i + 1, v),
            Some(_) => Err(RulesError::Field {
                rule: i + 1,
                id: None,
                what: "a named field in the list of rules".into(),
            }),
        })
        .collect()
}

/// Rules sent as a Lua value (a pool update's argument): an array of
/// tables in the rule file's shape, read and checked as the file's are.
pub struct RuleList(pub Vec<Rule>);

impl<'de> Deserialize<'de> for RuleList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RuleList, D::Error> {
        match Value::deserialize(d)? {
            Value::Table(list) => rules_of(&list).map(RuleList),
            _ => Err(RulesError::NotAList),
        }
        .map_err(de::Error::custom)
    }
}

/// The values the file's reader takes (strings, non-negative integers,
/// tables whose keys are names or positions), from a Lua value.
impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, an integer or a table")
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Int(n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        u64::try_from(n)
            .map(Value::Int)
            .map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::Str(s.as_bytes().to_vec()))
    }

    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Value, E> {
        Ok(Value::Str(b.to_vec()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push((None, v));
        }
        Ok(Value::Table(items))
    }

    /// A table with names (a rule); one with other keys is a list with
    /// holes or a mix, which the file's syntax cannot write either.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Vec::new();
        while let Some(key) = map.next_key()? {
            let Value::Str(name) = key else {
                return Err(de::Error::custom("a table key that is not a name"));
            };
            fields.push((Some(name), map.next_value()?));
        }
        Ok(Value::Table(fields))
    }
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
        assert_eq!(err(b"return {\n{ id = 1 }}"), "waf rule 1: no targets");
        assert_eq!(
            err(b"return {\n{ pattern = 'a' }}"),
            "rule #1: no integer id"
        );
        assert_eq!(
            err(b"return {{ id = 1, pattern = 'a', targets = { 'cookie' }, msg = '' }}"),
            "waf rule 1: unknown target cookie"
        );
        assert_eq!(
            err(b"return {\n\n{ id = 1 "),
            "line 3: expected , or } in a table"
        );
        assert_eq!(err(b"x = 1"), "line 1: expected `return {`");
    }
}

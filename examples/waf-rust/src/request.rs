//! The request table the Lua WAF is given (waf_http.request()), as it
//! crosses to a pool: a Lua value whose strings are borrowed from the
//! task's payload, and the subjects waf.lua's `subjects` takes from it.
//!
//!   { uri = "/decoded/path",
//!     args = { name = "value" or true or { "value", ... }, ... },
//!     headers = { ["user-agent"] = "value" or { "value", ... }, ... },
//!     body = "decoded body" or nil }

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::rules::Target;

/// A Lua value. A table is its pairs; an array crosses with keys 1..n.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// A number with an integer value (the keys ipairs walks).
    Int(i64),
    /// Any other number.
    Float(f64),
    Str(&'a [u8]),
    Table(Vec<(Value<'a>, Value<'a>)>),
}

/// What waf.lua raises for a request that is not a table.
#[derive(Debug, PartialEq, Eq)]
pub struct NotATable(pub &'static str);

impl fmt::Display for NotATable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad argument #1 to waf (table expected, got {})", self.0)
    }
}

impl std::error::Error for NotATable {}

impl<'a> Value<'a> {
    /// Lua's `type(v)`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "boolean",
            Value::Int(_) | Value::Float(_) => "number",
            Value::Str(_) => "string",
            Value::Table(_) => "table",
        }
    }

    /// `t[key]` for a string key; Nil when absent or not a table.
    pub fn get(&self, key: &[u8]) -> &Value<'a> {
        match self {
            Value::Table(pairs) => pairs
                .iter()
                .find(|(k, _)| *k == Value::Str(key))
                .map_or(&Value::Nil, |(_, v)| v),
            _ => &Value::Nil,
        }
    }

    /// `t[i]` for an integer key.
    fn index(&self, i: i64) -> &Value<'a> {
        match self {
            Value::Table(pairs) => pairs
                .iter()
                .find(|(k, _)| *k == Value::Int(i))
                .map_or(&Value::Nil, |(_, v)| v),
            _ => &Value::Nil,
        }
    }
}

/// waf.lua's `add`: a non-empty string, or the non-empty strings among
/// the values `ipairs` walks in a table.
fn add<'a>(v: &Value<'a>, f: &mut impl FnMut(&'a [u8])) {
    match v {
        Value::Str(s) if !s.is_empty() => f(s),
        Value::Table(_) => {
            let mut i = 1;
            loop {
                match v.index(i) {
                    Value::Nil => break,
                    Value::Str(s) if !s.is_empty() => f(s),
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {}
    }
}

/// Calls `f` on each string of `req` that rules for `target` look at
/// (waf.lua's `subjects`). Err for a request that is not a table.
pub fn for_each_subject<'a>(
    req: &Value<'a>,
    target: Target,
    mut f: impl FnMut(&'a [u8]),
) -> Result<(), NotATable> {
    if !matches!(req, Value::Table(_)) {
        return Err(NotATable(req.type_name()));
    }
    let pairs = |name: &[u8]| match req.get(name) {
        Value::Table(pairs) => pairs.as_slice(),
        _ => &[],
    };
    match target {
        Target::Uri => add(req.get(b"uri"), &mut f),
        Target::Body => add(req.get(b"body"), &mut f),
        Target::Args => {
            for (name, value) in pairs(b"args") {
                add(name, &mut f);
                add(value, &mut f);
            }
        }
        Target::Headers => {
            for (_, value) in pairs(b"headers") {
                add(value, &mut f);
            }
        }
        Target::UserAgent => {
            for (name, value) in pairs(b"headers") {
                if *name == Value::Str(b"user-agent") {
                    add(value, &mut f);
                }
            }
        }
    }
    Ok(())
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Lua value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value<'de>, E> {
        Ok(Value::Nil)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value<'de>, E> {
        Ok(Value::Nil)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value<'de>, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value<'de>, E> {
        Ok(Value::Int(n))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value<'de>, E> {
        Ok(i64::try_from(n).map_or(Value::Float(n as f64), Value::Int))
    }

    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Value<'de>, E> {
        // Lua 5.1 has one number type: 2.0 and 2 are the same key.
        if x.fract() == 0.0 && x.abs() < 9.0e15 {
            Ok(Value::Int(x as i64))
        } else {
            Ok(Value::Float(x))
        }
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Value<'de>, E> {
        Ok(Value::Str(s.as_bytes()))
    }

    fn visit_borrowed_bytes<E: de::Error>(self, b: &'de [u8]) -> Result<Value<'de>, E> {
        Ok(Value::Str(b))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value<'de>, A::Error> {
        let mut pairs = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element()? {
            pairs.push((Value::Int(pairs.len() as i64 + 1), v));
        }
        Ok(Value::Table(pairs))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value<'de>, A::Error> {
        let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(kv) = map.next_entry()? {
            pairs.push(kv);
        }
        Ok(Value::Table(pairs))
    }
}

/// Strings borrow from the input: a string that would need copying (an
/// escaped string of a text format) is an error, not a copy.
impl<'de> Deserialize<'de> for Value<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value<'de>, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subjects<'a>(req: &Value<'a>, target: Target) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        for_each_subject(req, target, |s| out.push(s)).unwrap();
        out
    }

    #[test]
    fn takes_what_waf_lua_takes() {
        use Value::*;
        let req = Table(vec![
            (Str(b"uri"), Str(b"/p")),
            (
                Str(b"args"),
                Table(vec![
                    (Str(b"a"), Str(b"1")),
                    (Str(b"flag"), Bool(true)),
                    (Str(b""), Str(b"")),
                    (
                        Str(b"list"),
                        Table(vec![
                            (Int(1), Str(b"x")),
                            (Int(2), Int(5)),
                            (Int(4), Str(b"gap")),
                        ]),
                    ),
                ]),
            ),
            (
                Str(b"headers"),
                Table(vec![
                    (Str(b"user-agent"), Str(b"ua")),
                    (Str(b"host"), Str(b"h")),
                ]),
            ),
        ]);
        assert_eq!(subjects(&req, Target::Uri), [b"/p"]);
        let args: Vec<&[u8]> = vec![b"a", b"1", b"flag", b"list", b"x"];
        assert_eq!(subjects(&req, Target::Args), args);
        let headers: Vec<&[u8]> = vec![b"ua", b"h"];
        assert_eq!(subjects(&req, Target::Headers), headers);
        assert_eq!(subjects(&req, Target::UserAgent), [b"ua"]);
        assert!(subjects(&req, Target::Body).is_empty());
        assert_eq!(
            for_each_subject(&Str(b"x"), Target::Uri, |_| {})
                .unwrap_err()
                .to_string(),
            "bad argument #1 to waf (table expected, got string)"
        );
    }
}

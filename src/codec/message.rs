//! Error messages of the encoder: what cannot cross, and where in the
//! value it is (`cannot pass function in argument #1 at ["a"][3]`).

use mlua::ffi;
use std::ffi::c_int;

pub(super) enum Kind {
    /// Value of this Lua type cannot be passed.
    Type(&'static str),
    /// Table key of this Lua type cannot be passed.
    Key(&'static str),
    Cyclic,
    Deep,
    Size,
}

/// Why a value cannot be encoded, and where.
pub(super) struct EncError {
    pub(super) kind: Kind,
    /// Path segments, innermost first: they are added while unwinding so
    /// that the success path never formats anything.
    pub(super) segs: Vec<String>,
}

impl From<Kind> for EncError {
    fn from(kind: Kind) -> EncError {
        EncError {
            kind,
            segs: Vec::new(),
        }
    }
}

impl EncError {
    /// The caller's text for a failure in `what` #`pos`.
    pub(super) fn message(self, what: &str, pos: usize) -> String {
        let path: String = self.segs.iter().rev().map(String::as_str).collect();
        let at = if path.is_empty() {
            String::new()
        } else {
            format!(" at {path}")
        };
        match self.kind {
            Kind::Type(t) => format!("cannot pass {t} in {what} #{pos}{at}"),
            Kind::Key(t) => format!("cannot pass table key {t} in {what} #{pos}{at}"),
            Kind::Cyclic => format!("cyclic table in {what} #{pos}{at}"),
            Kind::Deep => format!("{} in {what} #{pos}{at}", ngx_threadpool_wire::too_deep()),
            Kind::Size => size_message(what),
        }
    }
}

/// The error of a payload over MAX_PAYLOAD, naming what it holds
/// ("argument", "return value").
pub use ngx_threadpool_wire::too_large as size_message;

/// Lua's `type()` name for a `lua_type` code.
pub fn lua_type_name(t: c_int) -> &'static str {
    match t {
        ffi::LUA_TNIL => "nil",
        ffi::LUA_TBOOLEAN => "boolean",
        ffi::LUA_TLIGHTUSERDATA | ffi::LUA_TUSERDATA => "userdata",
        ffi::LUA_TNUMBER => "number",
        ffi::LUA_TSTRING => "string",
        ffi::LUA_TTABLE => "table",
        ffi::LUA_TFUNCTION => "function",
        ffi::LUA_TTHREAD => "thread",
        // LuaJIT's only other type a value can have.
        _ => "cdata",
    }
}

/// Escapes a key for an error message: a valid Lua string literal body,
/// ASCII only.
pub(super) fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0..=0x1f | 0x7f..=0xff => out.push_str(&format!("\\{b:03}")),
            _ => out.push(b as char),
        }
    }
    out
}

/// Formats like LuaJIT's `tostring(number)` ("%.14g", ties away from zero),
/// so both sides print numeric keys alike.
pub(super) fn format_g14(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // Plenty of digits to round from by hand: Rust rounds ties to even,
    // LuaJIT away from zero, and only the 15th digit decides.
    let sci = format!("{:.40e}", x.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let mut exp: i32 = exp.parse().unwrap_or(0);
    let mut digits: Vec<u8> = mant
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|d| d - b'0')
        .collect();
    let round_up = digits.get(14).is_some_and(|&d| d >= 5);
    digits.truncate(14);
    if round_up {
        let mut i = digits.len();
        loop {
            if i == 0 {
                digits.insert(0, 1);
                digits.truncate(14);
                exp += 1;
                break;
            }
            i -= 1;
            if digits[i] == 9 {
                digits[i] = 0;
            } else {
                digits[i] += 1;
                break;
            }
        }
    }
    while digits.len() > 1 && digits.last() == Some(&0) {
        digits.pop();
    }
    let ds: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
    if !(-4..14).contains(&exp) {
        let (head, tail) = ds.split_at(1);
        let dot = if tail.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}{dot}{tail}e{esign}{:02}", exp.abs())
    } else if exp < 0 {
        format!("{sign}0.{}{ds}", "0".repeat((-exp - 1) as usize))
    } else {
        let int_len = exp as usize + 1;
        if ds.len() <= int_len {
            format!("{sign}{ds}{}", "0".repeat(int_len - ds.len()))
        } else {
            let (i, f) = ds.split_at(int_len);
            format!("{sign}{i}.{f}")
        }
    }
}

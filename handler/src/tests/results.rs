//! Results: the payload bytes for typed values, checked by hand, and read
//! back as arguments (the format is the same).

use super::with_task;
use crate::results::sealed::Sealed;
use crate::{serde_bytes::Bytes, Values};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::collections::BTreeMap;

fn encode(v: &impl Sealed) -> Vec<u8> {
    let mut out = Vec::new();
    v.write_results(&mut out).expect("encodes");
    out
}

/// The caller's error for results that cannot be written.
fn encode_err(v: &impl Sealed) -> String {
    v.write_results(&mut Vec::new())
        .expect_err("refused")
        .to_string()
}

#[test]
fn one_value() {
    // uint(1) map(1) { 1: "ab" }, a str
    assert_eq!(encode(&"ab"), [0x01, 0x81, 0x01, 0xa2, b'a', b'b']);
    assert_eq!(encode(&String::from("ab")), encode(&"ab"));
    // bytes as bin
    assert_eq!(
        encode(&Bytes::new(b"ab")),
        [0x01, 0x81, 0x01, 0xc4, 2, b'a', b'b']
    );
    // nil: one value, none in the map
    assert_eq!(encode(&()), [0x01, 0x80]);
    assert_eq!(encode(&None::<u8>), [0x01, 0x80]);
    assert_eq!(encode(&-1i32), [0x01, 0x81, 0x01, 0xff]);
    assert_eq!(encode(&300u64), [0x01, 0x81, 0x01, 0xcd, 0x01, 0x2c]);
    let mut f = vec![0x01, 0x81, 0x01, 0xcb];
    f.extend_from_slice(&0.5f64.to_be_bytes());
    assert_eq!(encode(&0.5f32), f);
}

#[test]
fn several_values_keep_their_nils() {
    // uint32(3) map32(2) { 1: 7, 3: true }
    let want = [0xce, 0, 0, 0, 3, 0xdf, 0, 0, 0, 2, 0x01, 0x07, 0x03, 0xc3];
    assert_eq!(encode(&Values((7, None::<&str>, true))), want);
    assert_eq!(encode(&Values(())), [0xce, 0, 0, 0, 0, 0xdf, 0, 0, 0, 0]);
    let v = vec![Some("a"), None];
    let p = encode(&Values(v));
    with_task(&p, &[], |t| {
        assert_eq!(t.nargs(), 2);
        assert_eq!(t.args::<(&str, Option<&str>)>().unwrap(), ("a", None));
    });
}

#[test]
fn tables_structs_enums_and_keys_of_any_type() {
    #[derive(Serialize)]
    enum E {
        Unit,
        New(u8),
    }
    #[derive(Serialize)]
    struct S<'a> {
        name: &'a str,
        list: Vec<u8>,
        by_id: BTreeMap<i64, bool>,
        e: (E, E),
        #[serde(skip_serializing_if = "Option::is_none")]
        gone: Option<u8>,
    }
    let s = S {
        name: "n",
        list: vec![1, 2],
        by_id: BTreeMap::from([(-1, true), (5, false)]),
        e: (E::Unit, E::New(9)),
        gone: None,
    };
    let p = encode(&s);
    // map(4) of str keys, with int keys inside
    assert_eq!(&p[..5], [0x01, 0x81, 0x01, 0x84, 0xa4]);
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Back<'a> {
        name: &'a str,
        list: Vec<u8>,
        by_id: BTreeMap<i64, bool>,
        e: (&'a str, BTreeMap<&'a str, u8>),
    }
    with_task(&p, &[], |t| {
        let b: Back = t.arg(1).unwrap();
        assert_eq!(b.name, "n");
        assert_eq!(b.list, [1, 2]);
        assert_eq!(b.by_id, s.by_id);
        assert_eq!(b.e, ("Unit", BTreeMap::from([("New", 9)])));
    });
}

/// A map whose length is known only at its end (serde's `flatten`, a
/// filtered iterator) gets a map32 header patched in.
#[test]
fn unknown_lengths_are_patched() {
    struct Odd;
    impl Serialize for Odd {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            for i in (1..=5).filter(|i| i % 2 == 1) {
                m.serialize_entry(&i, &"odd")?;
            }
            m.end()
        }
    }
    let p = encode(&Odd);
    assert_eq!(&p[3..8], [0xdf, 0, 0, 0, 3]);
    struct Seq;
    impl Serialize for Seq {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq((0..4).filter(|i| i % 2 == 0))
        }
    }
    with_task(&encode(&Seq), &[], |t| {
        assert_eq!(t.arg::<Vec<u8>>(1).unwrap(), [0, 2]);
    });
}

#[test]
fn what_a_lua_table_cannot_hold_is_an_error_naming_the_value() {
    let nil_key = BTreeMap::from([(None::<u8>, 1)]);
    assert_eq!(
        encode_err(&nil_key),
        "cannot encode return value #1: nil table key"
    );
    let nan_key = Values((1, vec![(f64::NAN, 1)].into_iter().collect::<Vec<_>>()));
    // a Vec of pairs is an array: fine
    encode(&nan_key);
    struct NanKey;
    impl Serialize for NanKey {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map([(f64::NAN, 1)])
        }
    }
    assert_eq!(
        encode_err(&Values(("ok", NanKey))),
        "cannot encode return value #2: NaN table key"
    );
    assert!(encode_err(&1u128).starts_with("cannot encode return value #1: "));
}

/// A table `levels` deep: arrays of one, the innermost two levels an
/// enum variant's table of one entry around an array when `variant`.
struct Nest {
    levels: usize,
    variant: bool,
}

impl Serialize for Nest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.levels {
            0 => s.serialize_u8(1),
            2 if self.variant => s.serialize_newtype_variant("E", 0, "V", &[1u8]),
            n => s.collect_seq([Nest {
                levels: n - 1,
                variant: self.variant,
            }]),
        }
    }
}

fn nested(levels: usize, variant: bool) -> Values<(u8, Nest)> {
    Values((0, Nest { levels, variant }))
}

#[test]
fn results_past_the_modules_limits_are_refused_in_the_lua_encoders_words() {
    use ngx_threadpool_wire::{MAX_DEPTH, MAX_VALUES};
    // as many values as a payload holds, then one more
    let p = encode(&Values(vec![1u8; MAX_VALUES]));
    with_task(&p, &[], |t| assert_eq!(t.nargs(), MAX_VALUES));
    assert_eq!(
        encode_err(&Values(vec![None::<u8>; MAX_VALUES + 1])),
        "too many return values (max 4096)"
    );
    // nesting: the deepest the module decodes, then one level more, an
    // enum variant's table counted as one
    for variant in [false, true] {
        let p = encode(&nested(MAX_DEPTH, variant));
        with_task(&p, &[], |t| assert_eq!(t.nargs(), 2));
        assert_eq!(
            encode_err(&nested(MAX_DEPTH + 1, variant)),
            "cannot encode return value #2: table nested deeper than 100"
        );
    }
}

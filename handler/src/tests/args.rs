//! Arguments: hand-built payloads read into typed values, borrowed in
//! place, and the errors that name the argument.

use super::{payload, raw_task, with_task, V};
use crate::{ArgError, Task};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

fn err_text<T: std::fmt::Debug>(r: Result<T, ArgError>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn positional_tuple_with_nils_and_options() {
    // push_task("abc", nil, 7, 1.5, true)
    let p = payload(&[
        Some(V::Bin(b"abc")),
        None,
        Some(V::Int(7)),
        Some(V::Float(1.5)),
        Some(V::Bool(true)),
    ]);
    with_task(&p, &[], |t| {
        assert_eq!(t.nargs(), 5);
        let args: (&str, Option<u32>, i64, f64, bool) = t.args().unwrap();
        assert_eq!(args, ("abc", None, 7, 1.5, true));
        // missing trailing positions are nil
        let more: (&[u8], Option<u8>, u8, f64, bool, Option<&str>) = t.args().unwrap();
        assert_eq!(more.5, None);
        assert_eq!(t.arg::<f64>(3).unwrap(), 7.0);
        assert_eq!(t.arg::<Option<&str>>(9).unwrap(), None);
        assert_eq!(
            t.arg::<Option<&str>>(0).unwrap_err().to_string(),
            "bad argument #0: positions start at 1"
        );
        assert_eq!(t.args::<Vec<IgnoredAny>>().unwrap().len(), 5);
    });
}

#[test]
fn strings_are_borrowed_inline_and_from_spans() {
    let big = vec![b'x'; 100_000];
    let p = payload(&[Some(V::Str("inline")), Some(V::Span(0)), Some(V::Span(0))]);
    with_task(&p, &[&big], |t| {
        let (a, b, c): (&str, &[u8], &str) = t.args().unwrap();
        // in place: a in the payload, b and c in the span's own bytes
        let inline = p.windows(6).position(|w| w == b"inline").unwrap();
        assert_eq!(a.as_ptr(), p[inline..].as_ptr());
        assert_eq!(b.as_ptr(), big.as_ptr());
        assert_eq!(c.as_ptr(), big.as_ptr());
        assert_eq!(c.len(), big.len());
    });
}

#[test]
fn tables_nested_read_as_structs_maps_and_vecs() {
    #[derive(Deserialize, Debug, PartialEq)]
    struct Opts<'a> {
        name: &'a str,
        limit: Option<u32>,
        tags: Vec<&'a str>,
    }
    let opts = V::Map(vec![
        (V::Bin(b"name"), V::Bin(b"n")),
        (V::Bin(b"tags"), V::Array(vec![V::Bin(b"a"), V::Span(0)])),
        (V::Bin(b"other"), V::Map(vec![])),
    ]);
    let by_int = V::Map(vec![(V::Int(10), V::Bool(true)), (V::Int(-2), V::Nil)]);
    let p = payload(&[Some(opts), Some(by_int)]);
    with_task(&p, &[b"span"], |t| {
        let (o, m): (Opts, HashMap<i32, Option<bool>>) = t.args().unwrap();
        assert_eq!(
            o,
            Opts {
                name: "n",
                limit: None,
                tags: vec!["a", "span"]
            }
        );
        assert_eq!(m, HashMap::from([(10, Some(true)), (-2, None)]));
    });
}

#[test]
fn a_tuple_struct_reads_positional_arguments_and_enums_their_names() {
    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Fast,
        Exact(u8),
    }
    #[derive(Deserialize, Debug, PartialEq)]
    struct Args<'a>(&'a str, Mode, Mode);
    let p = payload(&[
        Some(V::Bin(b"s")),
        Some(V::Bin(b"fast")),
        Some(V::Map(vec![(V::Bin(b"exact"), V::Int(3))])),
    ]);
    with_task(&p, &[], |t| {
        let a: Args = t.args().unwrap();
        assert_eq!(a, Args("s", Mode::Fast, Mode::Exact(3)));
    });
}

#[test]
fn a_struct_is_a_table_read_by_field_name_wherever_it_is() {
    #[derive(Deserialize, Debug, PartialEq)]
    struct Opts<'a> {
        name: &'a str,
        limit: u32,
    }
    let opts = V::Map(vec![
        (V::Bin(b"limit"), V::Int(10)),
        (V::Bin(b"name"), V::Bin(b"x")),
    ]);
    let want = || Opts {
        name: "x",
        limit: 10,
    };
    let p = payload(&[Some(opts.clone())]);
    with_task(&p, &[], |t| {
        assert_eq!(t.args::<Opts>().unwrap(), want());
        assert_eq!(t.args::<(Opts,)>().unwrap(), (want(),));
        assert_eq!(t.arg::<Opts>(1).unwrap(), want());
    });
    let extra = payload(&[Some(opts), Some(V::Int(1))]);
    with_task(&extra, &[], |t| {
        assert_eq!(
            err_text(t.args::<Opts>()),
            "bad argument #2: expected at most 1 argument, got number"
        );
    });
}

#[test]
fn a_single_type_reads_the_first_argument() {
    let p = payload(&[Some(V::Bin(b"one")), None, Some(V::Nil)]);
    with_task(&p, &[], |t| {
        // trailing nils and ngx.null are not extra arguments
        assert_eq!(t.args::<&str>().unwrap(), "one");
        assert_eq!(t.args::<(&str,)>().unwrap(), ("one",));
    });
    let none = payload(&[]);
    with_task(&none, &[], |t| {
        t.args::<()>().unwrap();
        assert_eq!(t.args::<Option<&str>>().unwrap(), None);
    });
}

#[test]
fn errors_name_the_argument_and_where_in_it() {
    let p = payload(&[
        Some(V::Bin(b"abc")),
        Some(V::Bin(b"12")),
        Some(V::Map(vec![(
            V::Bin(b"opts"),
            V::Map(vec![(V::Bin(b"limit"), V::Int(-1))]),
        )])),
        Some(V::Array(vec![V::Int(1), V::Float(2.5)])),
        Some(V::Bin(b"\xffbad")),
    ]);
    with_task(&p, &[], |t| {
        assert_eq!(
            err_text(t.args::<(&str, u32)>()),
            "bad argument #2: expected u32, got string"
        );
        assert_eq!(
            err_text(t.args::<(&str, &str)>()),
            "bad argument #3: expected at most 2 arguments, got table"
        );
        assert_eq!(
            err_text(t.arg::<HashMap<&str, HashMap<&str, u32>>>(3)),
            r#"bad argument #3 at ["opts"]["limit"]: expected u32, got -1"#
        );
        assert_eq!(
            err_text(t.arg::<Vec<i32>>(4)),
            "bad argument #4 at [2]: expected i32, got 2.5"
        );
        assert_eq!(
            err_text(t.arg::<&str>(5)),
            "bad argument #5: expected a UTF-8 string, got invalid UTF-8 at byte 1"
        );
        assert_eq!(t.arg::<&[u8]>(5).unwrap(), b"\xffbad");
        assert_eq!(
            err_text(t.arg::<(f64, f64, f64)>(4)),
            "bad argument #4: invalid length 2, expected a tuple of size 3"
        );
        assert_eq!(
            err_text(t.arg::<(f64,)>(4)),
            "bad argument #4: expected a table of length 1, got length 2"
        );
        let missing = t.arg::<&str>(6).unwrap_err();
        assert_eq!(
            missing,
            ArgError::Bad {
                position: 6,
                path: String::new(),
                message: "expected a borrowed string, got nil".into()
            }
        );
    });
}

#[test]
fn broken_payloads_are_payload_errors() {
    let flag = AtomicBool::new(false);
    let ok = payload(&[Some(V::Int(1))]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "bad payload: bad value count"),
        (vec![0x01], "bad payload: expected a map"),
        (vec![0x01, 0x81, 0x02, 0x01], "bad payload: bad position"),
        (vec![0x01, 0x81, 0x01, 0xd9], "bad payload: truncated"),
        (
            vec![0x02, 0x82, 0x01, 0xc0, 0x01, 0xc0],
            "bad payload: repeated position",
        ),
        ([&ok[..], &[0xc0]].concat(), "bad payload: trailing bytes"),
    ];
    for (p, want) in cases {
        let raw = raw_task(&p, &[], &flag);
        // SAFETY: the payload outlives the task.
        let e = unsafe { Task::new(&raw.raw) }.err().expect("refused");
        assert_eq!(e.to_string(), want, "{p:02x?}");
    }
    // A value's own bytes are read when asked for.
    for (value, want) in [
        (
            vec![0xd6, 2, 0, 0, 0, 0],
            "bad payload: unsupported msgpack ext type",
        ),
        (
            vec![0xd6, 1, 0, 0, 0, 9],
            "bad payload: bad borrowed string",
        ),
        (vec![0xc1], "bad payload: unsupported msgpack marker"),
    ] {
        let p = [&[0x01, 0x81, 0x01][..], &value].concat();
        let raw = raw_task(&p, &[], &flag);
        // SAFETY: the payload outlives the task.
        let e = unsafe { Task::new(&raw.raw) }.err();
        let e = match e {
            Some(e) => e,
            None => with_task(&p, &[], |t| t.arg::<&str>(1).unwrap_err()),
        };
        assert!(matches!(e, ArgError::Payload(_)), "{e:?}");
        assert_eq!(e.to_string(), want);
    }
}

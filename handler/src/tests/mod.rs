//! Unit tests: payloads built by hand in the header's format, read and
//! written by the crate, and the generated exports called as the module
//! calls them.

mod args;
mod exports;
mod results;

use crate::ffi::{ngx_tp_bytes_t, ngx_tp_out_t, ngx_tp_task_t};
use crate::Task;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

/// A msgpack value, built by hand.
#[derive(Clone)]
enum V {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'static str),
    Bin(&'static [u8]),
    /// A borrowed string: the index of its span.
    Span(u32),
    Array(Vec<V>),
    Map(Vec<(V, V)>),
}

impl V {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            V::Nil => out.push(0xc0),
            V::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
            V::Int(i) => drop(rmp::encode::write_sint(out, *i)),
            V::Float(f) => drop(rmp::encode::write_f64(out, *f)),
            V::Str(s) => drop(rmp::encode::write_str(out, s)),
            V::Bin(b) => drop(rmp::encode::write_bin(out, b)),
            V::Span(i) => {
                out.extend_from_slice(&[0xd6, 1]);
                out.extend_from_slice(&i.to_be_bytes());
            }
            V::Array(items) => {
                drop(rmp::encode::write_array_len(out, items.len() as u32));
                items.iter().for_each(|v| v.encode(out));
            }
            V::Map(entries) => {
                drop(rmp::encode::write_map_len(out, entries.len() as u32));
                for (k, v) in entries {
                    k.encode(out);
                    v.encode(out);
                }
            }
        }
    }
}

/// `uint(n) map(k) { uint(position) value }*k`, for the values that are
/// `Some` (a `Some(V::Nil)` is ngx.null, a value in the map).
fn payload(values: &[Option<V>]) -> Vec<u8> {
    let mut out = Vec::new();
    drop(rmp::encode::write_uint(&mut out, values.len() as u64));
    let k = values.iter().flatten().count();
    drop(rmp::encode::write_map_len(&mut out, k as u32));
    for (i, v) in values.iter().enumerate() {
        if let Some(v) = v {
            drop(rmp::encode::write_uint(&mut out, i as u64 + 1));
            v.encode(&mut out);
        }
    }
    out
}

fn bytes_of(b: &[u8]) -> ngx_tp_bytes_t {
    ngx_tp_bytes_t {
        data: b.as_ptr(),
        len: b.len(),
    }
}

/// The `cancelled` callback: the flag `module` points to.
unsafe extern "C" fn cancelled(task: *const ngx_tp_task_t) -> c_int {
    // SAFETY: the tests' tasks point `module` at an AtomicBool that
    // outlives them.
    unsafe { (*(*task).module.cast::<AtomicBool>()).load(Ordering::Relaxed) as c_int }
}

/// A task pushed otherwise than by push_stream.
unsafe extern "C" fn no_stream_send(_: *const ngx_tp_task_t, _: *const u8, _: usize) -> c_int {
    ngx_threadpool_wire::status::NO_STREAM
}

unsafe extern "C" fn no_stream_receive(_: *const ngx_tp_task_t, _: *mut ngx_tp_out_t) -> c_int {
    ngx_threadpool_wire::status::NO_STREAM
}

/// A task as the module hands it over: `payload`, borrowing `spans`.
struct RawTask {
    raw: ngx_tp_task_t,
    _spans: Vec<ngx_tp_bytes_t>,
}

fn raw_task(payload: &[u8], spans: &[&[u8]], flag: &AtomicBool) -> RawTask {
    let spans: Vec<ngx_tp_bytes_t> = spans.iter().map(|s| bytes_of(s)).collect();
    RawTask {
        raw: ngx_tp_task_t {
            args: bytes_of(payload),
            spans: spans.as_ptr(),
            nspans: spans.len(),
            cancelled,
            module: (flag as *const AtomicBool).cast(),
            send: no_stream_send,
            receive: no_stream_receive,
        },
        _spans: spans,
    }
}

/// Runs `f` on the task of `payload` and `spans`.
fn with_task<R>(payload: &[u8], spans: &[&[u8]], f: impl FnOnce(&Task) -> R) -> R {
    let flag = AtomicBool::new(false);
    let raw = raw_task(payload, spans, &flag);
    // SAFETY: the payload and spans outlive the task.
    let task = unsafe { Task::new(&raw.raw) }.expect("a well-formed payload");
    f(&task)
}

/// The module's side of `ngx_tp_out_t`: a growing buffer, or one that
/// refuses to grow past `limit`.
#[repr(C)]
struct Out {
    out: ngx_tp_out_t,
    buf: Vec<u8>,
    limit: usize,
}

unsafe extern "C" fn write(out: *mut ngx_tp_out_t, data: *const u8, len: usize) -> c_int {
    // SAFETY: `out` is the first field of an Out (repr(C)), and data
    // points to len bytes.
    let (out, data) = unsafe {
        (
            &mut *out.cast::<Out>(),
            std::slice::from_raw_parts(data, len),
        )
    };
    if out.buf.len() + len > out.limit {
        return -1;
    }
    out.buf.extend_from_slice(data);
    0
}

impl Out {
    fn new(limit: usize) -> Box<Out> {
        Box::new(Out {
            out: ngx_tp_out_t {
                write,
                module: std::ptr::null_mut::<c_void>(),
            },
            buf: Vec::new(),
            limit,
        })
    }

    fn ptr(&mut self) -> *mut ngx_tp_out_t {
        &mut self.out
    }
}

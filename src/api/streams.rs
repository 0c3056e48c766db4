//! Streams (`push_stream`): the C functions behind a stream object of
//! lua/resty/threadpool.lua, on the caller's stack, with the same checks
//! and order as the task functions (functions.rs, whose helpers they use):
//! a stream is one task whose handler sends chunks and receives input
//! through the bounded queues of handoff/stream.rs.

use super::functions::{
    bad_argument, caller_of, int_arg, ms_arg, pool_arg, push_one, push_result, recycle, refused,
    unanchor, Mode, AGAIN, BAD_CONTEXT, DECLINED, ERROR, OK,
};
use crate::codec::{self, Source};
use crate::handoff::job::PushId;
use crate::handoff::payload::Payload;
use crate::handoff::stream::Written;
use crate::ngx::guard;
use crate::ngx::lua::{may_suspend, NOT_YIELDABLE};
use crate::ngx::shim::{ErrOut, Request};
use crate::worker::tasks::{Read, Release};
use crate::worker::with_worker;
use mlua::ffi::{self as lua, lua_State};
use std::ffi::c_int;
/// What `read` pushes first: a chunk follows, or the handler's return
/// values (or nil and its error) follow.
const CHUNK: c_int = 1;
const DONE: c_int = 2;

/// The most a stream's id can be: generation < 2^20 above 32 bits.
const MAX_ID: f64 = 9_007_199_254_740_991.0;

/// `id = push_stream(pool, chunks, ...)`: queues one task whose handler
/// may send chunks, at most `chunks` unread (0: the pool's
/// thread_pool_stream_chunks), and returns the stream's id at once; its
/// chunks and results come with `read(id, ms)`. Refusals as push.
pub(super) unsafe extern "C-unwind" fn push_stream(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked before anything
    // else; the values are at 3..=top.
    unsafe {
        let f = c"push_stream";
        let pool = pool_arg(l, 1, f);
        let max = crate::conf::settings::STREAM_CHUNKS_MAX as f64;
        let chunks = int_arg(l, 2, f, (0.0, max), c"chunks out of range: 1 to 65536") as usize;
        let chunks = match chunks {
            0 => crate::conf::running_pools()
                .get(pool)
                .map_or(1, |p| p.settings.stream_chunks),
            n => n,
        };
        push_one(l, pool, Mode::Stream(chunks), 3)
    }
}

/// What a read got.
enum Got {
    Chunk(Payload),
    Results(Vec<Payload>, u64),
    /// The coroutine waits on the stream's semaphore: yield (AGAIN), or
    /// read again at once (OK: a resource was there).
    Waiting(c_int),
    Refused(c_int, String),
}

/// `code, values... = read(id, timeout_ms)`: the next of the running
/// coroutine's stream `id`: CHUNK and the chunk, or, once every chunk was
/// read and the handler returned, DONE and its return values (or nil and
/// its error). Else the coroutine waits for the next of them, at most
/// `timeout_ms`, and yields: true when there may be one (read again),
/// false and "timeout". A negative code and a message: nothing to wait
/// for (no such stream of this coroutine's, or the wait refused).
pub(super) unsafe extern "C-unwind" fn read(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked before anything
    // else; what is taken is a local here, so an error raised while the
    // values are built drops it.
    unsafe {
        let f = c"read";
        let id = int_arg(l, 1, f, (1.0, MAX_ID), c"not a stream") as PushId;
        let ms = ms_arg(l, 2, f);
        let (r, caller) = match caller_of(l) {
            None => return refused(l, BAD_CONTEXT, ""),
            Some(Err(())) => return refused(l, ERROR, "no memory"),
            Some(Ok(found)) => found,
        };
        let got = guard::catch(|| {
            with_worker(|w| {
                let Some(id) = w.tasks.stream_of(caller, id) else {
                    return Got::Refused(ERROR, STREAM_CLOSED.into());
                };
                match w.tasks.read_stream(id) {
                    Read::Chunk(chunk) => Got::Chunk(chunk),
                    Read::Done => match w.tasks.take_result(id) {
                        Some((results, anchor)) => Got::Results(results, anchor),
                        None => Got::Refused(ERROR, STREAM_CLOSED.into()),
                    },
                    Read::Gone => Got::Refused(ERROR, STREAM_CLOSED.into()),
                    Read::Wait => match wait_on(l, &r, w, id, ms) {
                        Ok(rc) => Got::Waiting(rc),
                        Err(msg) => Got::Refused(ERROR, msg),
                    },
                }
            })
            .unwrap_or_else(|| Got::Refused(ERROR, "not in a worker process".into()))
        })
        .unwrap_or_else(|panic| Got::Refused(ERROR, ngx_threadpool_wire::panicked(panic)));
        lua::lua_settop(l, 0);
        match got {
            Got::Waiting(AGAIN) => lua::lua_yield(l, 0),
            Got::Waiting(_) => {
                lua::lua_pushboolean(l, 1);
                1
            }
            Got::Refused(rc, msg) => refused(l, rc, &msg),
            Got::Chunk(chunk) => {
                lua::lua_pushinteger(l, CHUNK as lua::lua_Integer);
                let results = vec![chunk];
                let n = push_result(l, &results, 2);
                recycle(results);
                n
            }
            Got::Results(results, anchor) => {
                if anchor != 0 {
                    unanchor(l, &[anchor]);
                }
                lua::lua_pushinteger(l, DONE as lua::lua_Integer);
                let n = push_result(l, &results, 2);
                recycle(results);
                n
            }
        }
    }
}

/// Starts the running coroutine's wait on stream `id`'s semaphore: the
/// wait's code (AGAIN: yield; OK: a resource was there), else why not.
///
/// # Safety
/// `l` is the running coroutine of `r`'s handler, on the event loop.
unsafe fn wait_on(
    l: *mut lua_State,
    r: &Request,
    w: &mut crate::worker::Worker,
    id: PushId,
    ms: c_int,
) -> Result<c_int, String> {
    // SAFETY: `l` is the running coroutine of a request's handler on the
    // event loop (the contract), which may_suspend asks lua-nginx-module about.
    if !unsafe { may_suspend(l) } {
        return Err(NOT_YIELDABLE.into());
    }
    let mut buf = [0u8; 256];
    let mut len = buf.len();
    // SAFETY: a stack buffer for the message.
    let err = unsafe { ErrOut::new(buf.as_mut_ptr(), &mut len) };
    let sema = w.tasks.sema(id).ok_or(STREAM_CLOSED)?;
    match crate::ngx::shim::wait(sema, r, ms, &err) {
        ERROR => Err(String::from_utf8_lossy(&buf[..len]).into_owned()),
        rc => Ok(rc),
    }
}

/// `code, msg = write(id, timeout_ms, wait, chunk)`: appends one value to
/// the input of the running coroutine's stream `id`: OK; DECLINED when
/// its bound of unread chunks is reached and `wait` is false; else, with
/// `wait`, the coroutine waits for room, at most `timeout_ms`, and
/// yields: true (write again) or false and "timeout". ERROR and a
/// message: the input ended, the value cannot cross, or no such stream.
pub(super) unsafe extern "C-unwind" fn write(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked before anything
    // else; the chunk is a local here until it is handed over.
    unsafe {
        let f = c"write";
        let id = int_arg(l, 1, f, (1.0, MAX_ID), c"not a stream") as PushId;
        let ms = ms_arg(l, 2, f);
        let wait = lua::lua_toboolean(l, 3) != 0;
        lua::lua_settop(l, 4);
        if lua::lua_type(l, 4) == lua::LUA_TNIL {
            bad_argument(l, 4, f, c"a chunk expected, got nil")
        }
        let (r, caller) = match caller_of(l) {
            None => return refused(l, BAD_CONTEXT, ""),
            Some(Err(())) => return refused(l, ERROR, "no memory"),
            Some(Ok(found)) => found,
        };
        let mut chunk = Payload::default();
        if let Err(e) = codec::write_values(
            l,
            Source::Stack(4),
            1,
            "chunk",
            None,
            &mut chunk.bytes,
            &mut chunk.spans,
        ) {
            return refused(l, ERROR, &e.to_string());
        }
        let wrote = guard::catch(|| {
            with_worker(|w| {
                let Some(id) = w.tasks.stream_of(caller, id) else {
                    return Got::Refused(ERROR, STREAM_CLOSED.into());
                };
                match w.tasks.write_stream(id, chunk, wait) {
                    Written::Done => Got::Waiting(OK),
                    Written::Full(_) if !wait => Got::Refused(DECLINED, INPUT_FULL.into()),
                    Written::Full(_) => match wait_on(l, &r, w, id, ms) {
                        // a resource was there: write again
                        Ok(OK) => Got::Refused(AGAIN, String::new()),
                        Ok(rc) => Got::Waiting(rc),
                        Err(msg) => Got::Refused(ERROR, msg),
                    },
                    Written::Ended => Got::Refused(ERROR, INPUT_ENDED.into()),
                }
            })
            .unwrap_or_else(|| Got::Refused(ERROR, "not in a worker process".into()))
        })
        .unwrap_or_else(|panic| Got::Refused(ERROR, ngx_threadpool_wire::panicked(panic)));
        lua::lua_settop(l, 0);
        match wrote {
            Got::Waiting(AGAIN) => lua::lua_yield(l, 0),
            Got::Waiting(_) => {
                lua::lua_pushinteger(l, OK as lua::lua_Integer);
                1
            }
            Got::Refused(AGAIN, _) => {
                lua::lua_pushboolean(l, 1);
                1
            }
            Got::Refused(rc, msg) => refused(l, rc, &msg),
            Got::Chunk(_) | Got::Results(..) => 0,
        }
    }
}

/// What a write gets when the stream's input is full and it may not wait.
const INPUT_FULL: &str = "stream input full";
/// What a write gets once the input was ended or the handler returned.
const INPUT_ENDED: &str = "stream input ended";

/// `close_write(id)`: the running coroutine wrote its last chunk to its
/// stream `id`: the handler's receive() gives nil after the chunks.
pub(super) unsafe extern "C-unwind" fn close_write(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the argument is checked first.
    unsafe {
        let id = int_arg(l, 1, c"close_write", (1.0, MAX_ID), c"not a stream") as PushId;
        let Some(Ok((_, caller))) = caller_of(l) else {
            return 0;
        };
        let _ = guard::catch(|| {
            with_worker(|w| {
                let id = w.tasks.stream_of(caller, id)?;
                w.tasks.end_input(id);
                Some(())
            })
        });
    }
    0
}

/// What a read of a stream that is no longer there gets.
const STREAM_CLOSED: &str = "stream closed";

/// `close(id, timed_out)`: the running coroutine lets go of its stream
/// `id` (its read timed out, when `timed_out` is true): a running handler
/// is cancelled (its sends fail at once), unread chunks are dropped.
pub(super) unsafe extern "C-unwind" fn close(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked first.
    unsafe {
        let id = int_arg(l, 1, c"close", (1.0, MAX_ID), c"not a stream") as PushId;
        let why = if lua::lua_toboolean(l, 2) != 0 {
            Release::Timeout
        } else {
            Release::Closed
        };
        let Some(Ok((_, caller))) = caller_of(l) else {
            return 0;
        };
        let _ = guard::catch(|| {
            with_worker(|w| {
                let id = w.tasks.stream_of(caller, id)?;
                crate::ngx::log::debug(format_args!("stream {id:#x} closed by its caller"));
                drop(w.tasks.release(id, why));
                Some(())
            })
        });
    }
    0
}

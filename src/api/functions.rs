//! The `ngx_threadpool` Lua module of the event loop: C functions on the
//! caller's own Lua stack, registered with lua-nginx-module's public API
//! for modules that extend it (`ngx_http_lua_add_package_preload`). The
//! shim (lua/resty/threadpool.lua) keeps the timeouts and the API; these
//! walk the arguments, queue the tasks and wait in one call, and build the
//! results on the caller's stack in another, as ngx.run_worker_thread
//! copies its values in C. They are the module's whole event-loop API:
//! nothing is exported for the FFI, whose pointer arguments no callee can
//! check.
//!
//! Any Lua code can `require` them, so each checks its arguments before
//! anything else (a Lua error naming the function and the argument, as
//! lua-nginx-module's C functions raise), and no call can leave a wait
//! started without the yield that goes with it, nor reach another
//! coroutine's task: a caller's task is found by its request and
//! coroutine; a stream's id, the one handle Lua holds (push_stream), is
//! honoured only for the request and coroutine that pushed it.
//!
//! Every function here may see a Lua error raised under it: building
//! values allocates, and an allocation may run a finalizer that fails, as
//! anywhere on the event loop. Such an error unwinds through these frames
//! to the caller's Lua code, as it would from a Lua function. So the
//! functions keep to one order: what may raise (reserving stack, pushing
//! results, anchoring strings) happens before anything is queued or after
//! everything the module owns is out of reach of the unwind (a local that
//! the unwind drops), and the Rust code between runs under a panic guard
//! that never sees a Lua call that raises (guard.rs: a panic must not
//! unwind into LuaJIT, and a Lua error must not reach a guard).
//!
//! Upvalues of every function: 1, the table of anchored argument strings
//! by anchor key; 2, the string "n".

use crate::codec::{self, Borrow, Source, Span};
use crate::conf::MainConf;
use crate::handoff::job::{PoolId, PushId};
use crate::handoff::payload::{Args, Payload};
use crate::luajit::stack;
use crate::ngx::lua::{in_init_worker, may_suspend, request_of, NOT_YIELDABLE};
use crate::ngx::shim::{ErrOut, Request};
use crate::ngx::{guard, os};
use crate::stats::{Reading, Unit, BUCKET_BOUNDS_US, STATS};
use crate::worker::tasks::{Caller, Release, RequestTasks};
use crate::worker::{with_worker, WorkerError, OVERLOADED};
use mlua::ffi::{self as lua, lua_State};
use std::ffi::{c_int, CStr};
use std::time::Duration;

/// Return codes, as lua-resty-core's C functions return them.
pub const OK: c_int = 0;
pub const ERROR: c_int = -1;
pub const AGAIN: c_int = -2;
pub const DECLINED: c_int = -5;
pub const BAD_CONTEXT: c_int = -101;

/// What init_worker_by_lua gets from a pool (`not_started` in the module
/// table, for the shim's stats); where a push may wait is `yieldable`
/// (`ngx::lua::waitable_names`, for the shim's error elsewhere).
pub(super) const NOT_STARTED: &str =
    "thread pools start after init_worker_by_lua: reach them from ngx.timer.at(0, ...)";

const ANCHORS: c_int = lua::lua_upvalueindex(1);
const N_KEY: c_int = lua::lua_upvalueindex(2);

/// Pushes `code` and a message: what a call that queued nothing returns.
///
/// # Safety
/// Called from one of the functions above, on its stack.
pub(super) unsafe fn refused(l: *mut lua_State, code: c_int, msg: &str) -> c_int {
    // SAFETY: l is the running state of a function Lua called (the contract),
    // whose stack has LUA_MINSTACK free slots for the two values; the string
    // push may raise, with nothing queued.
    unsafe {
        lua::lua_pushinteger(l, code as lua::lua_Integer);
        lua::lua_pushlstring_(l, msg.as_ptr().cast(), msg.len());
    }
    2
}

/// Raises `bad argument #i to 'f' (msg)`, as luaL_argerror words it but
/// naming the function whatever its caller calls it. Any Lua code may
/// call these functions, so each checks its arguments first, before it
/// owns anything that the error's unwind would have to free.
///
/// # Safety
/// Called by one of the functions above on its stack, owning nothing yet.
pub(super) unsafe fn bad_argument(l: *mut lua_State, i: c_int, f: &CStr, msg: &CStr) -> ! {
    // SAFETY: l is the running state of a function Lua called, owning nothing
    // (the contract): lua_error unwinds through frames that hold nothing to
    // drop, to the calling Lua code; the message's pieces are C strings.
    unsafe {
        lua::lua_pushfstring(
            l,
            c"bad argument #%d to '%s' (%s)".as_ptr(),
            i,
            f.as_ptr(),
            msg.as_ptr(),
        );
        lua::lua_error(l)
    }
}

/// Raises `bad argument #i to 'f' (T expected, got U)` unless argument
/// `i` has Lua type `t`.
///
/// # Safety
/// As bad_argument.
unsafe fn check_type(l: *mut lua_State, i: c_int, f: &CStr, t: c_int) {
    // SAFETY: l is the running state of a function Lua called, owning nothing
    // (bad_argument's contract), and `i` one of its slots; type names are
    // static strings, and the message stays on the stack while bad_argument
    // reads it.
    unsafe {
        let got = lua::lua_type(l, i);
        if got != t {
            lua::lua_pushfstring(
                l,
                c"%s expected, got %s".as_ptr(),
                lua::lua_typename(l, t),
                lua::lua_typename(l, got),
            );
            let msg = CStr::from_ptr(lua::lua_tostring(l, -1));
            bad_argument(l, i, f, msg)
        }
    }
}

/// Argument `i` of `f`: a whole number in `min..=max`, else raises with
/// `msg`.
///
/// # Safety
/// As bad_argument.
pub(super) unsafe fn int_arg(
    l: *mut lua_State,
    i: c_int,
    f: &CStr,
    range: (f64, f64),
    msg: &CStr,
) -> i64 {
    // SAFETY: l is the running state of a function Lua called, owning nothing
    // (bad_argument's contract), as check_type and bad_argument need; reading
    // a number neither allocates nor raises.
    unsafe {
        check_type(l, i, f, lua::LUA_TNUMBER);
        let n = lua::lua_tonumber(l, i);
        // NaN fails every comparison
        if !(n >= range.0 && n <= range.1 && n.fract() == 0.0) {
            bad_argument(l, i, f, msg)
        }
        n as i64
    }
}

/// Argument `i` of `f`: the id of a pool of the running configuration.
///
/// # Safety
/// As bad_argument.
pub(super) unsafe fn pool_arg(l: *mut lua_State, i: c_int, f: &CStr) -> usize {
    let last = crate::conf::running_pools().len() as f64 - 1.0;
    // SAFETY: l is the running state of a function Lua called, owning nothing
    // (this function's contract), as int_arg needs.
    unsafe { int_arg(l, i, f, (0.0, last), c"no such thread pool") as usize }
}

/// Argument `i` of `f`: a timeout in milliseconds.
///
/// # Safety
/// As bad_argument.
pub(super) unsafe fn ms_arg(l: *mut lua_State, i: c_int, f: &CStr) -> c_int {
    let range = (1.0, f64::from(c_int::MAX));
    // SAFETY: l is the running state of a function Lua called, owning nothing
    // (this function's contract), as int_arg needs.
    unsafe { int_arg(l, i, f, range, c"timeout out of range: 1 to 2147483647 ms") as c_int }
}

/// The running configuration, when the caller runs in its
/// lua-nginx-module main VM, which outlives every task. Only that VM lends
/// strings (a VM of its own per request, with `lua_code_cache off`, may
/// close while a thread still reads them) and anchors them, so only it
/// reaps: another VM would take the main VM's keys and let go of nothing.
///
/// # Safety
/// As refused.
unsafe fn lender(l: *mut lua_State) -> Option<&'static MainConf> {
    // SAFETY: l is the running coroutine, a live state on this thread (the
    // contract), which is what runs() needs to compare it with the main VM.
    crate::conf::running().filter(|c| c.lua_vm.is_some_and(|vm| unsafe { vm.runs(l) }))
}

/// Which strings of pool `pool`'s arguments are borrowed.
///
/// # Safety
/// As refused.
unsafe fn borrow_of(l: *mut lua_State, pool: PoolId) -> Option<Borrow> {
    // SAFETY: l is the running coroutine on the event loop (this function's
    // contract), as lender needs.
    let min = unsafe { lender(l) }?.pools.get(pool)?.settings.zero_copy?;
    Some(Borrow { min, nested: true })
}

/// Where a push's values are, to find the strings they borrowed again.
#[derive(Clone, Copy)]
enum Values<'a> {
    /// `n` values on the stack from this absolute index.
    Stack(c_int, usize),
    /// A batch: entry `i + 1` of the list at this absolute index holds
    /// `counts[i]` values.
    List(c_int, &'a [usize]),
}

/// Anchors the strings the arguments borrowed, whose spans are `spans`,
/// under a new key: the key (0 when nothing is borrowed), None when they
/// are not all found again. A collector step run by the anchor table's
/// allocation may run a `__gc` that changes a table among the values:
/// what is anchored is then compared with what the payload reads.
///
/// # Safety
/// As refused, with the values encoded from `values`.
unsafe fn anchor(
    l: *mut lua_State,
    values: Values,
    borrow: Option<Borrow>,
    spans: &[Span],
) -> Option<u64> {
    let Some(borrow) = borrow.filter(|_| !spans.is_empty()) else {
        return Some(0);
    };
    let key = with_worker(|w| w.anchor_key())?;
    let end = spans.len() as c_int + 1;
    // SAFETY: l is the running state of push, push_batch or push_stream, holding `values`
    // (the contract), and ANCHORS is its upvalue; the table has room for every
    // borrowed string in its array part (codec::anchor's contract). The
    // allocations and the stack's growth may raise, before anything is queued.
    unsafe {
        lua::lua_createtable(l, spans.len() as c_int, 0);
        let table = lua::lua_gettop(l);
        let mut next = 1;
        match values {
            Values::Stack(at, n) => {
                next = codec::anchor(l, Source::Stack(at), n, borrow, table, next, end);
            }
            // Each entry on top of the table while it is walked. The list
            // may have changed too: an entry that is no table ends the walk
            // short, and the push is refused.
            Values::List(list, counts) => {
                if crate::luajit::stack::reserve(l, 1) {
                    for (i, &n) in counts.iter().enumerate() {
                        lua::lua_rawgeti_(l, list, i as c_int + 1);
                        if lua::lua_type(l, table + 1) != lua::LUA_TTABLE {
                            break;
                        }
                        let entry = Source::Array(table + 1);
                        next = codec::anchor(l, entry, n, borrow, table, next, end);
                        lua::lua_settop(l, table);
                    }
                    lua::lua_settop(l, table);
                }
            }
        }
        if next != end || !holds(l, table, spans) {
            lua::lua_settop(l, table - 1);
            return None;
        }
        lua::lua_pushnumber(l, key as f64);
        lua::lua_insert(l, table);
        lua::lua_rawset(l, ANCHORS);
    }
    Some(key)
}

/// Whether `t[1..]` of the table at `table` are the strings at `spans`.
///
/// # Safety
/// As refused, with the table's array part holding `spans.len()` slots.
unsafe fn holds(l: *mut lua_State, table: c_int, spans: &[Span]) -> bool {
    spans.iter().zip(1..).all(|(span, i)| {
        // SAFETY: l is the running state and `table` a table on its stack (the
        // contract); reading an array slot and a string's bytes neither
        // allocates nor raises (a non-string gives null).
        unsafe {
            lua::lua_rawgeti_(l, table, i);
            let mut len = 0;
            let data = lua::lua_tolstring(l, -1, &mut len);
            lua::lua_settop(l, table);
            data.cast() == span.data && len == span.len
        }
    })
}

/// Lets go of anchored strings (a removal allocates nothing).
///
/// # Safety
/// As refused.
pub(super) unsafe fn unanchor(l: *mut lua_State, keys: &[u64]) {
    // SAFETY: l is the running state of a function of this module's table,
    // whose upvalue ANCHORS is the anchor table; setting an existing key to
    // nil neither allocates nor raises.
    unsafe {
        for &key in keys {
            lua::lua_pushnumber(l, key as f64);
            lua::lua_pushnil(l);
            lua::lua_rawset(l, ANCHORS);
        }
    }
}

/// `id, deadline_ms = pool_id(name)`: the id of the pool `name` (0-based),
/// -1 if no pool of that name has a process handler, and its
/// `thread_pool_deadline` in ms (nil: none). Read from the configuration,
/// so it also answers before the worker's threads exist
/// (init_worker_by_lua runs first).
pub(super) unsafe extern "C-unwind" fn pool_id(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the argument is checked first, and a string's
    // bytes stay put while it is on the stack.
    unsafe {
        check_type(l, 1, c"pool_id", lua::LUA_TSTRING);
        let mut len = 0;
        let data = lua::lua_tolstring(l, 1, &mut len);
        let name = std::slice::from_raw_parts(data.cast::<u8>(), len);
        let pools = crate::conf::running_pools();
        let id = pools.iter().position(|p| p.name.as_bytes() == name);
        lua::lua_pushinteger(l, id.map_or(-1, |id| id as lua::lua_Integer));
        // within the range of a timeout (ms_arg)
        match id.and_then(|id| pools[id].settings.deadline) {
            Some(d) => lua::lua_pushinteger(l, d.as_millis().min(c_int::MAX as u128) as _),
            None => lua::lua_pushnil(l),
        }
    }
    2
}

/// `stats = stats(pool)`: this worker's numbers of pool `pool`, keyed by
/// their names in stats/counters.rs (µs as seconds; a histogram as
/// `{ buckets = { { le = s, count = n }, ... }, count = n, sum = s }`, its
/// last bound the string "+Inf"); nil outside a worker.
pub(super) unsafe extern "C-unwind" fn stats(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the argument is checked first. The counters
    // are atomics in memory that outlives the worker: an error raised while
    // the table is built leaves nothing behind. At most 6 slots deep, within
    // LUA_MINSTACK.
    unsafe {
        let pool = pool_arg(l, 1, c"stats");
        let stats = guard::catch(|| with_worker(|w| w.stats(pool)));
        let Some(stats) = stats.ok().flatten().flatten() else {
            lua::lua_pushnil(l);
            return 1;
        };
        // + thread_versions and the shim's in_flight
        lua::lua_createtable(l, 0, STATS.len() as c_int + 2);
        for stat in STATS {
            lua::lua_pushlstring_(l, stat.name.as_ptr().cast(), stat.name.len());
            match (stat.read)(stats) {
                Reading::Number(n) => lua::lua_pushnumber(l, stat.unit.shown(n)),
                Reading::Histogram { buckets, sum_us } => {
                    lua::lua_createtable(l, 0, 3);
                    lua::lua_createtable(l, buckets.len() as c_int, 0);
                    for (i, &count) in buckets.iter().enumerate() {
                        lua::lua_createtable(l, 0, 2);
                        match BUCKET_BOUNDS_US.get(i) {
                            Some(&us) => lua::lua_pushnumber(l, Unit::Micros.shown(us)),
                            // as Prometheus writes it, and cjson encodes it
                            None => lua::lua_pushlstring_(l, c"+Inf".as_ptr(), 4),
                        }
                        lua::lua_setfield(l, -2, c"le".as_ptr());
                        lua::lua_pushnumber(l, count as f64);
                        lua::lua_setfield(l, -2, c"count".as_ptr());
                        lua::lua_rawseti_(l, -2, i as c_int + 1);
                    }
                    lua::lua_setfield(l, -2, c"buckets".as_ptr());
                    lua::lua_pushnumber(l, buckets.iter().sum::<u64>() as f64);
                    lua::lua_setfield(l, -2, c"count".as_ptr());
                    lua::lua_pushnumber(l, Unit::Micros.shown(sum_us));
                    lua::lua_setfield(l, -2, c"sum".as_ptr());
                }
            }
            lua::lua_rawset(l, -3);
        }
        // each thread's update version (stats/versions.rs)
        let me = crate::ngx::http::worker_number();
        let threads = crate::conf::running_pools()
            .get(pool)
            .map_or(0, |p| p.threads);
        let versions = crate::conf::running()
            .and_then(|c| c.status.as_ref()?.versions(me, pool))
            .map_or(&[][..], |(_, slots)| &slots[..threads.min(slots.len())]);
        lua::lua_createtable(l, versions.len() as c_int, 0);
        for (i, v) in versions.iter().enumerate() {
            lua::lua_pushnumber(
                l,
                v.applied.load(std::sync::atomic::Ordering::Relaxed) as f64,
            );
            lua::lua_rawseti_(l, -2, i as c_int + 1);
        }
        lua::lua_setfield(l, -2, THREAD_VERSIONS.as_ptr());
    }
    1
}

/// The key of each thread's update version in `stats()`.
pub const THREAD_VERSIONS: &CStr = c"thread_versions";

/// `reap()`: lets go of the strings of tasks that ended after their
/// caller stopped waiting or went away; each push reaps too, so that a
/// busy worker lets go as it goes. Once the worker stopped there is
/// nothing to reap, and the configuration is not read: at exit, the main
/// VM's last collection runs this after the cycle's memory is gone.
pub(super) unsafe extern "C-unwind" fn reap(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua on the event loop.
    if with_worker(|w| w.tasks.has_reaped()) != Some(true) || unsafe { lender(l) }.is_none() {
        return 0;
    }
    let keys = guard::catch(|| with_worker(|w| w.tasks.take_reaped()))
        .ok()
        .flatten()
        .unwrap_or_default();
    // SAFETY: l is reap's running state, called by Lua on the event loop,
    // whose upvalue ANCHORS holds the keys' anchors; their tasks ended, so no
    // thread reads the strings.
    unsafe { unanchor(l, &keys) };
    0
}

/// `ok, err = push(pool, timeout_ms, deadline, ...)`: queues one task and waits:
/// the coroutine yields until the task is done (true) or the timeout
/// (false, "timeout"), then takes the results with `result()` or lets go
/// of the task with `release()`. The wait is started and yielded here, in
/// one call, so that no Lua code can start a wait and not yield for it.
/// `deadline`: false, none; true, the timeout is also the push's deadline;
/// a number, the deadline in seconds since the epoch (see deadline_arg).
/// Nothing
/// queued: DECLINED when the queue is full, BAD_CONTEXT where it may not
/// wait, ERROR and a message ("overloaded" when the pool cannot finish the
/// task before its deadline).
pub(super) unsafe extern "C-unwind" fn push(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked before anything
    // else; the values are at 4..=top.
    unsafe {
        let pool = pool_arg(l, 1, c"push");
        let (ms, deadline) = deadline_arg(l, 3, c"push", ms_arg(l, 2, c"push"));
        if !admitted(pool, 1, deadline) {
            return refused(l, ERROR, OVERLOADED);
        }
        push_one(l, pool, Mode::Wait(ms, deadline), 4)
    }
}

/// What push and push_stream share: encodes the values at first..=top as
/// one task's arguments and queues it.
///
/// # Safety
/// As refused, with the arguments checked.
pub(super) unsafe fn push_one(l: *mut lua_State, pool: PoolId, mode: Mode, first: c_int) -> c_int {
    // SAFETY: called from push or push_stream on the caller's stack with
    // the pool and mode checked; the values to encode are at first..=top.
    unsafe {
        let n = (lua::lua_gettop(l) - first + 1).max(0) as usize;
        let borrow = borrow_of(l, pool);
        let mut args = new_args();
        if let Err(e) = codec::write_values(
            l,
            Source::Stack(first),
            n,
            "argument",
            borrow,
            &mut args.bytes,
            &mut args.spans,
        ) {
            return refused(l, ERROR, &e.to_string());
        }
        args.end_part();
        queue(l, pool, mode, args, Values::Stack(first, n), borrow)
    }
}

/// `ok, err = push_batch(pool, timeout_ms, deadline, list, count)`: as push, one
/// task per entry of list[1..count], count <= #list, an argument table
/// whose `n` field, when a number, counts its values; the results come
/// with `results()`. One record, one wait.
pub(super) unsafe extern "C-unwind" fn push_batch(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked before anything
    // else (list at 4, a table); each entry is pushed at 6, above the
    // count, with the walk's slots reserved above it.
    unsafe {
        let f = c"push_batch";
        let pool = pool_arg(l, 1, f);
        let (ms, deadline) = deadline_arg(l, 3, f, ms_arg(l, 2, f));
        check_type(l, 4, f, lua::LUA_TTABLE);
        let len = lua::lua_objlen(l, 4) as f64;
        let count = int_arg(l, 5, f, (1.0, len), c"count out of range: 1 to #list") as usize;
        if !admitted(pool, count, deadline) {
            return refused(l, ERROR, OVERLOADED);
        }
        let borrow = borrow_of(l, pool);
        lua::lua_settop(l, 5);
        if !codec::reserve_walk(l, 2) {
            return refused(l, ERROR, &codec::stack_overflow().to_string());
        }
        let mut args = new_args();
        let mut counts = Vec::with_capacity(count);
        // An entry stays on the stack only while it is walked: a batch
        // may hold more tasks than a C function's stack may hold values.
        const ENTRY: c_int = 6;
        // One guard for the whole list: nothing in it raises (raw reads,
        // and walks whose slots are reserved).
        let walked = guard::catch(|| {
            for i in 1..=count {
                lua::lua_rawgeti_(l, 4, i as c_int);
                if lua::lua_type(l, ENTRY) != lua::LUA_TTABLE {
                    return Err(format!("task {i}: expected a table of arguments"));
                }
                lua::lua_pushvalue(l, N_KEY);
                lua::lua_rawget(l, ENTRY);
                let n = if lua::lua_type(l, -1) == lua::LUA_TNUMBER {
                    lua::lua_tonumber(l, -1).max(0.0) as usize
                } else {
                    lua::lua_objlen(l, ENTRY)
                };
                lua::lua_settop(l, ENTRY);
                let entry = Source::Array(ENTRY);
                codec::write_walked(
                    l,
                    entry,
                    n,
                    "argument",
                    borrow,
                    &mut args.bytes,
                    &mut args.spans,
                )
                .map_err(|e| format!("task {i}: {e}"))?;
                lua::lua_settop(l, 5);
                args.end_part();
                counts.push(n);
            }
            Ok(())
        });
        if let Err(msg) = walked.unwrap_or_else(|panic| Err(ngx_threadpool_wire::panicked(panic))) {
            lua::lua_settop(l, 5);
            return refused(l, ERROR, &msg);
        }
        queue(
            l,
            pool,
            Mode::Wait(ms, deadline),
            args,
            Values::List(4, &counts),
            borrow,
        )
    }
}

/// Argument `i` of `f`, the push's deadline, with `ms`, its timeout: the
/// wait's timeout in ms and the deadline from now. false: none; true: the
/// timeout, from now; a number: an absolute deadline in seconds since the
/// epoch, as ngx.now() and ngx.req.start_time() give it (gRPC's kind, so
/// that time the request spent before the push counts), read against the
/// precise clock now; the timeout is then the time left, at most `ms`. A
/// deadline already past gives a zero deadline, which admission refuses.
///
/// # Safety
/// As bad_argument.
unsafe fn deadline_arg(
    l: *mut lua_State,
    i: c_int,
    f: &CStr,
    ms: c_int,
) -> (c_int, Option<Duration>) {
    // SAFETY: l is the running state of a function Lua called, owning nothing
    // (bad_argument's contract), as check_type needs; reading a boolean or
    // a number neither allocates nor raises.
    unsafe {
        if lua::lua_type(l, i) != lua::LUA_TNUMBER {
            check_type(l, i, f, lua::LUA_TBOOLEAN);
            let deadline = lua::lua_toboolean(l, i) != 0;
            return (ms, deadline.then(|| Duration::from_millis(ms as u64)));
        }
        let at = lua::lua_tonumber(l, i);
        // NaN fails the comparison; Duration::from_secs_f64 would panic on it
        if !(at >= 0.0 && at.is_finite()) {
            bad_argument(l, i, f, c"deadline: seconds since the epoch expected")
        }
        let left = time_left(at).min(Duration::from_millis(ms as u64));
        // whole ms, rounded up: the wait ends no sooner than the deadline
        let wait = left.as_micros().div_ceil(1000).clamp(1, ms as u128) as c_int;
        (wait, Some(left))
    }
}

/// The time left to `at`, seconds since the epoch (finite, >= 0), by the
/// system's clock (CLOCK_REALTIME, which nginx's cached time also reads):
/// zero once it has passed.
fn time_left(at: f64) -> Duration {
    let now = Duration::from_micros(os::wall_clock_us());
    // at most ~2^63 s: beyond any timeout, and what from_secs_f64 takes
    Duration::from_secs_f64(at.min(9.2e18)).saturating_sub(now)
}

/// Whether `n` tasks with `deadline` may be pushed to pool `pool`: always
/// without one (or outside a worker, where the push fails on its own).
fn admitted(pool: PoolId, n: usize, deadline: Option<Duration>) -> bool {
    let Some(deadline) = deadline else {
        return true;
    };
    let refused = |w: &mut crate::worker::Worker| {
        matches!(w.admit(pool, n, deadline), Err(WorkerError::Overloaded))
    };
    !guard::catch(|| with_worker(refused))
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Arguments to encode a push in, from the worker's spares.
fn new_args() -> Args {
    with_worker(|w| w.tasks.args()).unwrap_or_default()
}

/// What a push does once its tasks are queued.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// Waits for them this long (ms), and the deadline from now if it is
    /// one.
    Wait(c_int, Option<Duration>),
    /// Starts a stream of at most this many unread chunks, and waits for
    /// nothing: its reads wait.
    Stream(usize),
}

/// What push, push_batch and push_stream share: anchors the borrowed
/// strings, queues the tasks and starts the wait, and yields for it (the
/// value of their `return`), or pushes what the shim gets at once.
///
/// # Safety
/// As refused, with `args` encoded from `values`.
unsafe fn queue(
    l: *mut lua_State,
    pool: PoolId,
    mode: Mode,
    args: Args,
    values: Values,
    borrow: Option<Borrow>,
) -> c_int {
    // SAFETY: l is the running state of push, push_batch or push_stream, on the event loop,
    // with `args` encoded from `values` (the contract): what reap, anchor,
    // refused and unanchor need. lua_yield only marks the coroutine, found
    // able to yield before its wait started.
    unsafe {
        reap(l);
        let Some(anchor) = anchor(l, values, borrow, &args.spans) else {
            return refused(l, ERROR, "an argument changed while it was pushed");
        };
        let queued = guard::catch(|| queue_and_wait(l, pool, mode, args, anchor))
            .unwrap_or_else(|panic| Queued::Refused(ERROR, ngx_threadpool_wire::panicked(panic)));
        match queued {
            // lua_yield only marks the coroutine (it yields when this
            // function returns its value): the coroutine was found able
            // to yield before the wait started
            Queued::Waiting(AGAIN) => lua::lua_yield(l, 0),
            Queued::Waiting(_) => {
                lua::lua_pushboolean(l, 1);
                1
            }
            Queued::Stream(id) => {
                lua::lua_pushnumber(l, id as f64);
                1
            }
            Queued::Refused(rc, msg) => {
                // nothing reads the strings
                if anchor != 0 {
                    unanchor(l, &[anchor]);
                }
                refused(l, rc, &msg)
            }
            // the anchor goes when the tasks end
            Queued::NotWaiting(msg) => refused(l, ERROR, &msg),
        }
    }
}

/// How a push went.
enum Queued {
    /// Queued; the wait's code (AGAIN or OK).
    Waiting(c_int),
    /// A stream started: its record.
    Stream(PushId),
    /// Nothing queued: the code and message.
    Refused(c_int, String),
    /// Queued, but the wait failed: the tasks run for no one.
    NotWaiting(String),
}

/// The running coroutine of `l` as a caller that may wait: None outside a
/// request or where it may not wait, and when the request's pool is out
/// of memory (`Err`).
///
/// # Safety
/// `l` is the running coroutine, on the event loop.
pub(super) unsafe fn caller_of(l: *mut lua_State) -> Option<Result<(Request, Caller), ()>> {
    // SAFETY: l is the running coroutine on the event loop (the contract);
    // request_of gives its request or null, which from_raw turns into None.
    let r = unsafe { Request::from_raw(request_of(l)) }.filter(Request::may_yield)?;
    // SAFETY: this module keeps only its RequestTasks in the slot.
    let Some(tasks) = (unsafe { r.module_ctx::<RequestTasks>() }) else {
        return Some(Err(()));
    };
    let co = l.cast_const().cast();
    Some(Ok((
        r,
        Caller {
            tasks: tasks.as_ptr(),
            co,
        },
    )))
}

/// Queues the tasks for the running coroutine and starts its wait.
fn queue_and_wait(l: *mut lua_State, pool: PoolId, mode: Mode, args: Args, anchor: u64) -> Queued {
    // SAFETY: l is the running coroutine (queue's contract).
    let (r, caller) = match unsafe { caller_of(l) } {
        None => return Queued::Refused(BAD_CONTEXT, String::new()),
        Some(Err(())) => return Queued::Refused(ERROR, "no memory".into()),
        Some(Ok(found)) => found,
    };
    // SAFETY: l is the running coroutine (queue's contract), as may_suspend
    // needs.
    if !unsafe { may_suspend(l) } {
        return Queued::Refused(ERROR, NOT_YIELDABLE.into());
    }
    let queued = with_worker(|w| {
        let (stream, deadline) = match mode {
            Mode::Stream(bound) => (Some(bound), None),
            Mode::Wait(_, deadline) => (None, deadline),
        };
        // SAFETY: the caller's list lives in r->pool and unlinks its
        // records when that pool is destroyed; the shim's stack anchors
        // the borrowed strings.
        let task = match unsafe { w.push(pool, Some(caller), args, anchor, deadline, stream) } {
            Ok(task) => task,
            Err(WorkerError::QueueFull) => return Queued::Refused(DECLINED, String::new()),
            Err(e) => return Queued::Refused(ERROR, e.to_string()),
        };
        crate::worker::gate::pushed(r.connection_number());
        let Mode::Wait(ms, _) = mode else {
            return Queued::Stream(task);
        };
        let mut buf = [0u8; 256];
        let mut len = buf.len();
        // SAFETY: a stack buffer for the message.
        let err = unsafe { ErrOut::new(buf.as_mut_ptr(), &mut len) };
        // The semaphore belongs to the record, which outlives the wait.
        let rc = match w.tasks.sema(task) {
            Some(sema) => crate::ngx::shim::wait(sema, &r, ms, &err),
            None => ERROR,
        };
        if rc == ERROR {
            // Not waiting after all: the tasks run for no one, and the
            // anchor is reaped once they end.
            w.tasks.release(task, Release::NotWaiting);
            return Queued::NotWaiting(String::from_utf8_lossy(&buf[..len]).into_owned());
        }
        Queued::Waiting(rc)
    });
    queued.unwrap_or_else(|| Queued::Refused(ERROR, "not in a worker process".into()))
}

/// `ok, err = post(pool, ...)`: queues a task whose result nobody takes.
/// Its arguments borrow nothing: nobody would hear when they are free.
pub(super) unsafe extern "C-unwind" fn post(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the pool checked before anything else; the
    // values at 2..=top.
    unsafe {
        let pool = pool_arg(l, 1, c"post");
        let n = (lua::lua_gettop(l) - 1).max(0) as usize;
        let mut args = new_args();
        if let Err(e) = codec::write_values(
            l,
            Source::Stack(2),
            n,
            "argument",
            None,
            &mut args.bytes,
            &mut args.spans,
        ) {
            return refused(l, ERROR, &e.to_string());
        }
        args.end_part();
        let posted = guard::catch(|| {
            // SAFETY: a posted task has no owner and borrows nothing.
            with_worker(|w| w.push(pool, None, args, 0, None, None))
        });
        match posted {
            Ok(Some(Ok(_))) => {
                lua::lua_pushinteger(l, OK as lua::lua_Integer);
                1
            }
            Ok(Some(Err(WorkerError::QueueFull))) => refused(l, DECLINED, "queue full"),
            Ok(Some(Err(e))) => refused(l, ERROR, &e.to_string()),
            Ok(None) if in_init_worker(request_of(l)) => refused(l, ERROR, NOT_STARTED),
            Ok(None) => refused(l, ERROR, "not in a worker process with running pools"),
            Err(panic) => refused(l, ERROR, &ngx_threadpool_wire::panicked(panic)),
        }
    }
}

/// Takes the results of the running coroutine's finished task and lets
/// go of its anchored strings: None when it has none.
///
/// # Safety
/// As refused.
unsafe fn take(l: *mut lua_State) -> Option<Vec<Payload>> {
    // SAFETY: l is the running coroutine on the event loop (refused's
    // contract), as caller_of needs.
    let (_, caller) = unsafe { caller_of(l) }?.ok()?;
    let taken = guard::catch(|| {
        with_worker(|w| {
            let task = w.tasks.of(caller)?;
            Some((task, w.tasks.take_result(task)?))
        })
    });
    let (task, (results, anchor)) = taken.ok().flatten().flatten()?;
    if anchor != 0 {
        // SAFETY: l is result()'s running state, whose upvalue ANCHORS holds
        // this task's anchor; the task is finished, so no thread reads the
        // strings any more.
        unsafe { unanchor(l, &[anchor]) };
    }
    for (i, p) in results.iter().enumerate() {
        crate::ngx::log::debug(format_args!(
            "task {task:#x}.{i} resumed, {} bytes of results, borrowed {}",
            p.bytes.len(),
            p.spans.len()
        ));
    }
    Some(results)
}

/// Gives the result buffers back for reuse; the pins of borrowed strings
/// go with their payloads.
pub(super) fn recycle(results: Vec<Payload>) {
    with_worker(|w| w.tasks.recycle(results));
}

/// `values... = result()`: the handler's return values of the running
/// coroutine's task, once its push was resumed with true, or nil and the
/// error (the handler's error value, or the module's: "no result" when
/// it has no finished task).
pub(super) unsafe extern "C-unwind" fn result(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; its arguments are not read; the results are
    // a local here, so an error raised while building the values drops
    // them.
    unsafe {
        let Some(results) = take(l) else {
            return nil_and(l, "no result");
        };
        lua::lua_settop(l, 0);
        let n = push_result(l, &results, 1);
        recycle(results);
        n
    }
}

/// Pushes the handler's return values of the first of `results` above
/// `keep` slots, or nil and its error: how many values the function
/// returns (the kept slots included).
///
/// # Safety
/// As refused, with `keep` values on the stack; the payloads' borrowed
/// strings alive.
pub(super) unsafe fn push_result(l: *mut lua_State, results: &[Payload], keep: c_int) -> c_int {
    // SAFETY: the caller's stack holds `keep` values and the payloads'
    // borrowed strings are alive (the contract); on an error the stack is
    // put back to `keep` before nil and the message.
    unsafe {
        let failed = |l, msg: &str| {
            lua::lua_settop(l, keep - 1);
            lua::lua_pushnil(l);
            lua::lua_pushlstring_(l, msg.as_ptr().cast(), msg.len());
            keep + 1
        };
        match results.first() {
            Some(p) if p.failed => {
                lua::lua_pushnil(l);
                match codec::push_values(l, &p.bytes, &p.spans) {
                    Ok(_) => keep + 1,
                    Err(e) => failed(l, &e.to_string()),
                }
            }
            Some(p) => match codec::push_values(l, &p.bytes, &p.spans) {
                Ok(n) => keep - 1 + n as c_int,
                Err(e) => failed(l, &e.to_string()),
            },
            None => failed(l, "no result"),
        }
    }
}

/// Replaces the stack with nil and `msg`.
///
/// # Safety
/// As refused.
pub(super) unsafe fn nil_and(l: *mut lua_State, msg: &str) -> c_int {
    // SAFETY: l is the running state of a function Lua called (the contract);
    // emptied, its stack has room for the two values; the string push may
    // raise, with nothing owned.
    unsafe {
        lua::lua_settop(l, 0);
        lua::lua_pushnil(l);
        lua::lua_pushlstring_(l, msg.as_ptr().cast(), msg.len());
    }
    2
}

/// `results = results()`: as result, a batch's results in task order,
/// each `{ true, values..., n = k }` or `{ false, err, n = 2 }`.
pub(super) unsafe extern "C-unwind" fn results(l: *mut lua_State) -> c_int {
    // SAFETY: l is the running state of a function Lua called, on the event
    // loop, with LUA_MINSTACK free slots; the payloads are read, some at a
    // time, before their entries are built, and each entry is built above the
    // results table and stored in it before the next.
    unsafe {
        let Some(results) = take(l) else {
            return nil_and(l, "no result");
        };
        lua::lua_settop(l, 0);
        if !stack::reserve(l, codec::NEST_SLOTS + 4) {
            return nil_and(l, &codec::stack_overflow().to_string());
        }
        lua::lua_createtable(l, results.len() as c_int, 0);
        let mut built = 0;
        while built < results.len() {
            let rest = &results[built..];
            let payloads = rest.iter().map(|p| (&p.bytes[..], &p.spans[..]));
            let entries = codec::read_entries(payloads);
            for (i, p) in rest[..entries.payloads()].iter().enumerate() {
                let read = entries.count(i);
                let k = read.unwrap_or(1);
                lua::lua_createtable(l, k as c_int + 1, 1);
                lua::lua_pushboolean(l, c_int::from(read.is_ok() && !p.failed));
                lua::lua_rawseti_(l, -2, 1);
                match read {
                    Ok(_) => entries.set(l, i),
                    Err(e) => {
                        let msg = e.to_string();
                        lua::lua_pushlstring_(l, msg.as_ptr().cast(), msg.len());
                        lua::lua_rawseti_(l, -2, 2);
                    }
                }
                lua::lua_pushvalue(l, N_KEY);
                lua::lua_pushnumber(l, (k + 1) as f64);
                lua::lua_rawset(l, -3);
                lua::lua_rawseti_(l, 1, (built + i) as c_int + 1);
            }
            built += entries.payloads();
        }
        recycle(results);
        1
    }
}

/// `release()`: the running coroutine stopped waiting (its push was
/// resumed with false, "timeout"): its running task is abandoned, its
/// tasks not started are skipped and its late results dropped; a
/// finished one is freed.
pub(super) unsafe extern "C-unwind" fn release(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; its arguments are not read.
    let Some(Ok((_, caller))) = (unsafe { caller_of(l) }) else {
        return 0;
    };
    let _ = guard::catch(|| {
        with_worker(|w| {
            let task = w.tasks.of(caller)?;
            crate::ngx::log::debug(format_args!("task {task:#x} released by its caller"));
            drop(w.tasks.release(task, Release::Timeout));
            Some(())
        })
    });
    0
}

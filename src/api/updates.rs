//! The C functions behind a pool's updates (docs/updates.md): `update`,
//! which makes the pool's next update in every worker, and
//! `update_state`, which counts the threads of every worker it reached
//! (the shim's wait polls it).

use super::functions::{bad_argument, int_arg, nil_and, pool_arg, BAD_CONTEXT};
use crate::codec::{self, Source};
use crate::conf::{self, PoolConf, Process};
use crate::ngx::lua::{may_suspend, request_of, NOT_YIELDABLE};
use crate::ngx::shim::Request;
use crate::ngx::{guard, http, log};
use crate::stats::Reached;
use crate::thread::handler::NATIVE_CODE;
use crate::vm::NO_UPDATE_CHUNK;
use crate::worker::{with_worker, WorkerError};
use mlua::ffi::{self as lua, lua_State};
use std::ffi::c_int;

/// Why `pool` cannot take an update with `code` and `n` arguments, if it
/// cannot.
fn refusal(pool: &PoolConf, code: bool, n: usize) -> Option<String> {
    if pool.updates.is_none() {
        return Some(WorkerError::UpdatesOff.to_string());
    }
    match &pool.process {
        Some(Process::Native(_)) if code => Some(NATIVE_CODE.into()),
        Some(Process::Native(spec)) => {
            (!spec.library.takes_updates()).then(|| spec.library.no_updates())
        }
        // new code alone needs no update chunk
        _ if pool.update.is_none() && (!code || n > 0) => Some(NO_UPDATE_CHUNK.into()),
        _ => None,
    }
}

/// `update(pool, code, wait, ...)`: makes the pool's next update, with
/// the values after `wait` as its arguments and, if `code` is a string,
/// that handler chunk. Its version, or nil and why not (the refusal of a
/// pool that cannot take it, an update too large for the pool's zone);
/// with `wait`, BAD_CONTEXT where the caller could not wait for it, before
/// anything is made.
///
/// # Safety
/// Called by Lua, on the event loop.
pub(super) unsafe extern "C-unwind" fn update(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked before anything is
    // owned; the code's bytes are on the stack across their use.
    unsafe {
        let pool = pool_arg(l, 1, c"update");
        let code = match lua::lua_type(l, 2) {
            lua::LUA_TNIL | lua::LUA_TNONE => None,
            lua::LUA_TSTRING => {
                let mut len = 0;
                let p = lua::lua_tolstring(l, 2, &mut len);
                Some(crate::ngx::shim::bytes(p.cast(), len))
            }
            _ => bad_argument(l, 2, c"update", c"code: a string or nil expected"),
        };
        if lua::lua_toboolean(l, 3) != 0 {
            let waits = Request::from_raw(request_of(l)).filter(Request::may_yield);
            if waits.is_none() {
                lua::lua_pushinteger(l, BAD_CONTEXT as lua::lua_Integer);
                return 1;
            }
            if !may_suspend(l) {
                return nil_and(l, NOT_YIELDABLE);
            }
        }
        let n = (lua::lua_gettop(l) - 3).max(0) as usize;
        let Some(p) = conf::running_pools().get(pool) else {
            return nil_and(l, "no such thread pool");
        };
        if let Some(why) = refusal(p, code.is_some(), n) {
            return nil_and(
                l,
                &format!("thread pool \"{}\" takes no such update: {why}", p.name),
            );
        }
        let (mut args, mut spans) = (Vec::new(), Vec::new());
        if let Err(e) = codec::write_values(
            l,
            Source::Stack(4),
            n,
            "argument",
            None,
            &mut args,
            &mut spans,
        ) {
            return nil_and(l, &e.to_string());
        }
        let me = http::worker_number();
        let made = guard::catch(|| {
            with_worker(|w| {
                let (zone, name) = w.updates(pool).map_err(|e| e.to_string())?;
                let version = zone.publish(code, &args, me).map_err(|e| e.to_string())?;
                log::message(
                    log::NGX_LOG_NOTICE,
                    format_args!(
                        "thread pool \"{name}\": update {version} made by worker {me}: {} bytes of arguments{}",
                        args.len(),
                        if code.is_some() { ", new code" } else { "" }
                    ),
                );
                Ok::<_, String>(version)
            })
        });
        match made {
            Ok(Some(Ok(version))) => {
                lua::lua_pushnumber(l, version as f64);
                1
            }
            Ok(Some(Err(e))) => nil_and(l, &e),
            Ok(None) => nil_and(l, "not in a worker process with running pools"),
            Err(panic) => nil_and(l, &ngx_threadpool_wire::panicked(panic)),
        }
    }
}

/// `update_state(pool, version)`: the threads of every worker at that
/// version or later, those that failed it, all of them, and the first
/// failure's error (or nil).
///
/// # Safety
/// Called by Lua, on the event loop.
pub(super) unsafe extern "C-unwind" fn update_state(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the arguments are checked first; four values
    // pushed, within LUA_MINSTACK.
    unsafe {
        let pool = pool_arg(l, 1, c"update_state");
        let version = int_arg(
            l,
            2,
            c"update_state",
            (1.0, 2f64.powi(53)),
            c"no such version",
        ) as u64;
        let mut reached = Reached::default();
        let mut error = None;
        if let (Some(table), Some(p)) = (
            conf::running().and_then(|c| c.status.as_ref()),
            conf::running_pools().get(pool),
        ) {
            for w in 0..table.workers {
                if let Some((e, slots)) = table.versions(w, pool) {
                    reached.add(&slots[..p.threads.min(slots.len())], version);
                    error = error.or_else(|| e.get(version).map(|(_, text)| text));
                }
            }
        }
        for n in [reached.applied, reached.failed, reached.threads] {
            lua::lua_pushnumber(l, n as f64);
        }
        match error {
            Some(e) => lua::lua_pushlstring_(l, e.as_ptr().cast(), e.len()),
            None => lua::lua_pushnil(l),
        }
    }
    4
}

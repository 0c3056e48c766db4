//! A worker's start: each pool's handler spec, what its threads' `ngx`
//! takes from the event loop's, the threads themselves, the notify
//! multiplexer and the accept gate. Runs once, in init_process.

use crate::conf::{self, MainConf};
use crate::ngx::{self, sys};
use crate::thread::handler;
use crate::{vm, worker};

/// What the pool threads' `ngx` takes from the event loop's.
///
/// # Safety
/// Event-loop thread of a worker, in init_process of `cycle`, whose `vm`
/// it is; the lua module is linked.
unsafe fn thread_ngx_env(cycle: *mut sys::ngx_cycle_t, vm: Option<ngx::lua::MainVm>) -> vm::NgxEnv {
    // SAFETY: the caller's contract: the worker's event loop in its
    // init_process, with the cycle configured and the main VM idle.
    let (lua_conf, resty_core) = unsafe {
        (
            ngx::lua_inject::LuaConf::of(cycle),
            vm.and_then(|vm| vm.resty_core()),
        )
    };
    let pcre_version = ngx::lua_inject::pcre_version();
    vm::NgxEnv {
        lua_conf,
        // SAFETY: the event loop's init_process (the contract), where the
        // worker's pid, slot and core conf are set.
        worker: unsafe { ngx::lua_inject::WorkerInfo::current() },
        regex: vm::RegexEnv {
            pcre: pcre_version.as_deref().and_then(vm::Pcre::of_version),
            // SAFETY: the configuration is read (init_process).
            match_limit: lua_conf.map_or(0, |c| unsafe { c.regex_match_limit() }),
            max_err_len: resty_core
                .as_ref()
                .map_or(vm::DEFAULT_REGEX_MAX_ERR_LEN, |r| r.regex_max_err_len),
        },
        resty_core_version: resty_core.map(|r| r.version),
    }
}

/// Starts the worker's pools as `conf` (the http main conf of `cycle`)
/// declares them, its notify multiplexer and its accept gate.
///
/// # Safety
/// Event-loop thread of a worker, in init_process of `cycle`; the lua
/// module is linked and its main VM idle.
pub unsafe fn init_process(
    cycle: *mut sys::ngx_cycle_t,
    conf: &'static MainConf,
) -> Result<(), String> {
    ngx::os::bound_retained_memory();
    // SAFETY: init_process runs on the event loop of the VM's cycle
    // before any request.
    let paths = conf.lua_vm.and_then(|vm| unsafe { vm.package_paths() });
    let log = ngx::log::Log::cycle();
    // SAFETY: the event loop's init_process of `cycle`, with the lua module
    // linked and its main VM idle (the contract), as thread_ngx_env needs.
    let ngx_env = unsafe { thread_ngx_env(cycle, conf.lua_vm) };
    // One spec per configured pool, in order: a pool's index in the
    // configuration is its id in the shim (api/functions.rs).
    let me = ngx::http::worker_number();
    let specs: Result<Vec<_>, String> = conf
        .pools
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let kind = match p.process.clone().ok_or("pool without handler")? {
                conf::Process::Lua(process, style) => handler::Kind::Lua(Box::new(vm::Spec {
                    init: p.init.clone(),
                    process,
                    style,
                    update: p.update.clone(),
                    package_path: paths.as_ref().map(|(path, _)| path.clone()),
                    package_cpath: paths.as_ref().map(|(_, cpath)| cpath.clone()),
                    ngx: ngx_env.clone(),
                })),
                conf::Process::Native(native) => handler::Kind::Native(native),
            };
            let spec = handler::Spec {
                name: p.name.clone(),
                log,
                settings: p.settings,
                kind,
            };
            Ok(worker::PoolSetup {
                spec,
                threads: p.threads,
                max_queue: p.max_queue,
                shadow: p.shadow.as_ref().map(|s| (s.pool, s.options)),
                updates: p.updates,
                versions: conf.status.as_ref().and_then(|t| t.versions(me, i)),
            })
        })
        .collect();
    let started = specs.and_then(|specs| {
        crate::handoff::notify::install(worker::drain, worker::awaiting)?;
        let shared = conf.status.as_ref().and_then(|t| t.row(me));
        worker::Worker::start(specs, shared).map_err(|e| e.to_string())
    });
    if let (Ok(()), Some(gate), Some((shared, slots))) = (
        &started,
        conf.gate,
        conf.status.as_ref().and_then(|t| t.gate()),
    ) {
        let threads = conf.pools.iter().map(|p| p.threads).sum();
        let marks = worker::gate::Marks::resolve(gate.high, gate.low, threads);
        let workers = ngx::http::running_workers();
        worker::gate::start(marks, shared, slots, me, workers, conf.nudge.as_ref());
    }
    started
}

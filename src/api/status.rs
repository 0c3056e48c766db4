//! The pools' counters of every worker in a shared memory zone of the
//! module's own, and `thread_pool_status`, a content handler that answers
//! them in Prometheus's text exposition format.
//!
//! ```nginx
//! location = /threadpool/metrics { thread_pool_status; }
//! ```

use crate::ngx::http;
use crate::ngx::sys;
use crate::stats::gate::{GateShared, GateSlot};
use crate::stats::{
    PoolStats, BUCKET_BOUNDS_US, COUNTER_NAMES, ESTIMATES_AT, ESTIMATE_NAMES, SHADOW_AT,
    SHADOW_NAMES, STATS_LEN, STREAM_AT, STREAM_NAMES,
};
use std::ffi::{c_char, c_void};
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

/// The setter of `thread_pool_status;` (location context).
///
/// # Safety
/// Called by nginx only.
pub unsafe extern "C" fn set_status(
    cf: *mut sys::ngx_conf_t,
    _cmd: *mut sys::ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls a location directive's setter inside a location.
    unsafe { http::set_location_handler(cf, Some(status_handler)) };
    std::ptr::null_mut()
}

unsafe extern "C" fn status_handler(r: *mut sys::ngx_http_request_t) -> sys::ngx_int_t {
    crate::ngx::guard::no_unwind(
        "thread_pool_status",
        sys::NGX_HTTP_INTERNAL_SERVER_ERROR as sys::ngx_int_t,
        || {
            // SAFETY: ngx_cycle is the running, configured cycle.
            let conf = unsafe { crate::conf::main_conf(sys::ngx_cycle) };
            let body = conf.map_or_else(String::new, |c| {
                let names: Vec<&str> = c.pools.iter().map(|p| p.name.as_str()).collect();
                let Some(table) = &c.status else {
                    return String::new();
                };
                let shadows: Vec<Option<&str>> = c
                    .pools
                    .iter()
                    .map(|p| p.shadow.as_ref().map(|s| c.pools[s.pool].name.as_str()))
                    .collect();
                let mut out = table.all().map_or_else(String::new, |all| {
                    let mut out = render(&names, all);
                    render_shadows(&mut out, &names, &shadows, all);
                    out
                });
                if let (Some(_), Some((shared, slots))) = (c.gate, table.gate()) {
                    render_gate(&mut out, shared, slots);
                }
                out
            });
            // SAFETY: nginx called this content handler for r.
            unsafe { http::send_text(r, b"text/plain; version=0.0.4", body.as_bytes()) }
        },
    )
}

/// (name, help, type) of each counter, in PoolStats::write's order.
const COUNTERS: [(&str, &str, &str); COUNTER_NAMES.len()] = [
    (
        "ngx_threadpool_threads",
        "Threads of the pool in the worker.",
        "gauge",
    ),
    (
        "ngx_threadpool_busy_threads",
        "Threads running a task.",
        "gauge",
    ),
    (
        "ngx_threadpool_queued_tasks",
        "Tasks waiting for a thread.",
        "gauge",
    ),
    (
        "ngx_threadpool_tasks_pushed_total",
        "Tasks queued.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_completed_total",
        "Tasks whose handler returned.",
        "counter",
    ),
    (
        "ngx_threadpool_task_errors_total",
        "Tasks whose handler failed.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_rejected_total",
        "Pushes refused: queue full.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_timed_out_total",
        "Tasks whose caller timed out.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_abandoned_total",
        "Tasks whose caller went away: its request ended or its light thread was killed.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_cancelled_total",
        "Tasks not run: their caller gave up before a thread took them.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_overloaded_total",
        "Pushes refused: the pool could not finish them before their deadline.",
        "counter",
    ),
    (
        "ngx_threadpool_tasks_expired_total",
        "Tasks not run: their deadline came too close while they waited.",
        "counter",
    ),
];

/// (name, help) of each estimate (gauges, in µs), in PoolStats::write's
/// order.
const ESTIMATES: [(&str, &str); ESTIMATE_NAMES.len()] = [
    (
        "ngx_threadpool_expected_wait_seconds",
        "Expected wait of a task pushed now, from the tasks ahead and the run estimate.",
    ),
    (
        "ngx_threadpool_run_estimate_seconds",
        "Recent run time of a task (a moving average).",
    ),
    (
        "ngx_threadpool_wait_limit_seconds",
        "Longest wait admitted while the queue stands (0: it does not).",
    ),
];

const HISTOGRAMS: [(&str, &str); 2] = [
    (
        "ngx_threadpool_queue_wait_seconds",
        "Time from push to a thread taking the task.",
    ),
    ("ngx_threadpool_run_seconds", "Time the handler ran."),
];

/// The exposition of every worker's row that a worker used (threads > 0).
fn render(names: &[&str], all: &[PoolStats]) -> String {
    let mut rows = Vec::new();
    for (i, stats) in all.iter().enumerate() {
        let mut v = Vec::with_capacity(STATS_LEN);
        stats.write(&mut v);
        if v[0] > 0 {
            rows.push((i / names.len(), names[i % names.len()], v));
        }
    }
    let mut out = String::new();
    for (k, (name, help, kind)) in COUNTERS.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (worker, pool, v) in &rows {
            let _ = writeln!(
                out,
                "{name}{{pool=\"{pool}\",worker=\"{worker}\"}} {}",
                v[k]
            );
        }
    }
    const STREAM_HELP: [(&str, &str); STREAM_NAMES.len()] = [
        (
            "ngx_threadpool_streams_total",
            "Streams pushed (push_stream).",
        ),
        (
            "ngx_threadpool_stream_chunks_out_total",
            "Chunks of streams that their readers took.",
        ),
        (
            "ngx_threadpool_stream_bytes_out_total",
            "Bytes (encoded) of the chunks readers took.",
        ),
        (
            "ngx_threadpool_stream_chunks_in_total",
            "Chunks that stream callers wrote to their handlers.",
        ),
        (
            "ngx_threadpool_stream_bytes_in_total",
            "Bytes (encoded) of the chunks callers wrote.",
        ),
        (
            "ngx_threadpool_stream_send_wait_seconds_total",
            "Time stream handlers' sends waited for their reader to take a chunk.",
        ),
    ];
    for (k, (name, help)) in STREAM_HELP.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (worker, pool, v) in &rows {
            let n = v[STREAM_AT + k];
            let labels = format!("pool=\"{pool}\",worker=\"{worker}\"");
            if k == STREAM_NAMES.len() - 1 {
                let _ = writeln!(out, "{name}{{{labels}}} {}", n as f64 / 1e6);
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {n}");
            }
        }
    }
    for (k, (name, help)) in ESTIMATES.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (worker, pool, v) in &rows {
            let seconds = v[ESTIMATES_AT + k] as f64 / 1e6;
            let _ = writeln!(
                out,
                "{name}{{pool=\"{pool}\",worker=\"{worker}\"}} {seconds}"
            );
        }
    }
    let per = BUCKET_BOUNDS_US.len() + 2;
    for (h, (name, help)) in HISTOGRAMS.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (worker, pool, v) in &rows {
            let at = COUNTERS.len() + h * per;
            let labels = format!("pool=\"{pool}\",worker=\"{worker}\"");
            let mut cumulative = 0;
            for (b, bound) in BUCKET_BOUNDS_US.iter().enumerate() {
                cumulative += v[at + b];
                let le = *bound as f64 / 1e6;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
            }
            cumulative += v[at + BUCKET_BOUNDS_US.len()];
            let sum = v[at + per - 1] as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
            let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        }
    }
    out
}

/// The shadow counters of each pool that has a shadow, labelled with both
/// pools, for every worker that used its row.
fn render_shadows(out: &mut String, names: &[&str], shadows: &[Option<&str>], all: &[PoolStats]) {
    const HELP: [&str; SHADOW_NAMES.len()] = [
        "Tasks run again on the shadow pool and their results compared.",
        "Compared tasks whose results differed.",
        "Sampled tasks not compared: the shadow's queue was full.",
    ];
    if shadows.iter().all(Option::is_none) {
        return;
    }
    let mut rows = Vec::new();
    for (i, stats) in all.iter().enumerate() {
        let (pool, shadow) = (i % names.len(), shadows[i % names.len()]);
        let mut v = Vec::with_capacity(STATS_LEN);
        stats.write(&mut v);
        if let (Some(shadow), true) = (shadow, v[0] > 0) {
            rows.push((i / names.len(), names[pool], shadow, v));
        }
    }
    for (k, (counter, help)) in SHADOW_NAMES.iter().zip(HELP).enumerate() {
        let name = format!("ngx_threadpool_shadow_{counter}_total");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (worker, pool, shadow, v) in &rows {
            let _ = writeln!(
                out,
                "{name}{{pool=\"{pool}\",shadow=\"{shadow}\",worker=\"{worker}\"}} {}",
                v[SHADOW_AT + k]
            );
        }
    }
}

/// (name, help, type, value) of each accept gate metric of a worker.
type GateMetric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&GateSlot) -> f64,
);

const GATE_METRICS: [GateMetric; 5] = [
    (
        "ngx_threadpool_accept_gate_paused",
        "1 while the worker does not accept on shared listening sockets.",
        "gauge",
        |s| s.paused.load(Relaxed) as f64,
    ),
    (
        "ngx_threadpool_accept_gate_pauses_total",
        "Times the worker stopped accepting.",
        "counter",
        |s| s.pauses.load(Relaxed) as f64,
    ),
    (
        "ngx_threadpool_accept_gate_paused_seconds_total",
        "Time the worker did not accept.",
        "counter",
        |s| s.paused_ms_now() as f64 / 1e3,
    ),
    (
        "ngx_threadpool_accept_gate_load",
        "Tasks outstanding plus connections accepted that have not pushed one.",
        "gauge",
        |s| s.load.load(Relaxed) as f64,
    ),
    (
        "ngx_threadpool_accepted_connections_total",
        "Connections accepted on http listening sockets.",
        "counter",
        |s| s.accepted.load(Relaxed) as f64,
    ),
];

/// The accept gate's metrics of every worker running it.
fn render_gate(out: &mut String, shared: &GateShared, slots: &[GateSlot]) {
    let name = "ngx_threadpool_accept_gate_paused_workers";
    let _ = writeln!(
        out,
        "# HELP {name} Workers not accepting on shared listening sockets.\n# TYPE {name} gauge\n{name} {}",
        shared.paused_workers.load(Relaxed)
    );
    for (name, help, kind, value) in GATE_METRICS {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (worker, slot) in slots.iter().enumerate() {
            if slot.active.load(Relaxed) != 0 {
                let _ = writeln!(out, "{name}{{worker=\"{worker}\"}} {}", value(slot));
            }
        }
    }
}

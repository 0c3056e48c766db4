//! The pools' counters of every worker in a shared memory zone of the
//! module's own, and `thread_pool_status`, a content handler that answers
//! them in Prometheus's text exposition format.
//!
//! ```nginx
//! location = /threadpool/metrics { thread_pool_status; }
//! ```

use crate::conf::PoolConf;
use crate::ngx::http;
use crate::ngx::sys;
use crate::stats::gate::{GateShared, GateSlot};
use crate::stats::{Labels, PoolStats, Reading, Stat, StatusTable, Unit, BUCKET_BOUNDS_US, STATS};
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
                render_versions(&mut out, &c.pools, table);
                out
            });
            // SAFETY: nginx called this content handler for r.
            unsafe { http::send_text(r, b"text/plain; version=0.0.4", body.as_bytes()) }
        },
    )
}

/// The series of every worker's row that a worker used (threads > 0), for
/// each number labelled with its pool, in the table's order
/// (stats/counters.rs).
fn render(names: &[&str], all: &[PoolStats]) -> String {
    let rows: Vec<(String, &PoolStats)> = used(all)
        .map(|(i, stats)| {
            let (worker, pool) = (i / names.len(), names[i % names.len()]);
            (format!("pool=\"{pool}\",worker=\"{worker}\""), stats)
        })
        .collect();
    let mut out = String::new();
    for stat in STATS.iter().filter(|s| s.labels == Labels::Pool) {
        family(&mut out, stat, &rows);
    }
    out
}

/// The numbers labelled with a shadow, of each pool that has one, for
/// every worker that used its row.
fn render_shadows(out: &mut String, names: &[&str], shadows: &[Option<&str>], all: &[PoolStats]) {
    if shadows.iter().all(Option::is_none) {
        return;
    }
    let rows: Vec<(String, &PoolStats)> = used(all)
        .filter_map(|(i, stats)| {
            let (worker, pool) = (i / names.len(), names[i % names.len()]);
            let shadow = shadows[i % names.len()]?;
            let labels = format!("pool=\"{pool}\",shadow=\"{shadow}\",worker=\"{worker}\"");
            Some((labels, stats))
        })
        .collect();
    for stat in STATS.iter().filter(|s| s.labels == Labels::Shadow) {
        family(out, stat, &rows);
    }
}

/// The rows of `all` that a worker used, with their index.
fn used(all: &[PoolStats]) -> impl Iterator<Item = (usize, &PoolStats)> {
    all.iter()
        .enumerate()
        .filter(|(_, s)| s.threads.load(Relaxed) > 0)
}

/// One number's HELP and TYPE, and its series of each row (its labels and
/// its pool's numbers).
fn family(out: &mut String, stat: &Stat, rows: &[(String, &PoolStats)]) {
    let (name, help, kind) = (stat.metric, stat.help, stat.kind.prometheus());
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, stats) in rows {
        let _ = match (stat.read)(stats) {
            Reading::Number(n) if stat.unit == Unit::Count => {
                writeln!(out, "{name}{{{labels}}} {n}")
            }
            Reading::Number(n) => writeln!(out, "{name}{{{labels}}} {}", stat.unit.shown(n)),
            Reading::Histogram { buckets, sum_us } => {
                let mut cumulative = 0;
                for (count, bound) in buckets.iter().zip(BUCKET_BOUNDS_US) {
                    cumulative += count;
                    let le = Unit::Micros.shown(bound);
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
                }
                cumulative += buckets[BUCKET_BOUNDS_US.len()];
                let sum = Unit::Micros.shown(sum_us);
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
                writeln!(out, "{name}_count{{{labels}}} {cumulative}")
            }
        };
    }
}

/// Each thread's update version, of every worker that used its row.
fn render_versions(out: &mut String, pools: &[PoolConf], table: &StatusTable) {
    let name = THREAD_VERSION_METRIC;
    let _ = writeln!(
        out,
        "# HELP {name} The update version a pool thread runs (0: the configuration's).\n# TYPE {name} gauge"
    );
    for (worker, row) in (0..table.workers).filter_map(|w| Some((w, table.row(w)?))) {
        for (i, p) in pools.iter().enumerate() {
            let used = row.get(i).is_some_and(|s| s.threads.load(Relaxed) > 0);
            let Some((_, slots)) = table.versions(worker, i).filter(|_| used) else {
                continue;
            };
            for (thread, slot) in slots.iter().take(p.threads).enumerate() {
                let _ = writeln!(
                    out,
                    "{name}{{pool=\"{}\",worker=\"{worker}\",thread=\"{thread}\"}} {}",
                    p.name,
                    slot.applied.load(Relaxed)
                );
            }
        }
    }
}

/// The family of each thread's update version (docs/metrics.md).
pub const THREAD_VERSION_METRIC: &str = "ngx_threadpool_thread_update_version";

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

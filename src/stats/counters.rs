//! A pool's numbers, declared once. Each entry of the table at the end is
//! a field of `PoolStats`, on the side that writes it, and, unless
//! internal, a number of `STATS`: its key in `tp.NAME:stats()`
//! (api/functions.rs) and its series in `thread_pool_status`
//! (api/status.rs), with the kind, unit and help both show. Adding a
//! number is adding an entry.

use super::histogram::{Histogram, Reading};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What Prometheus calls a number (`# TYPE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn prometheus(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// What a number counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Unit {
    /// Tasks, threads, chunks, bytes: shown as they are.
    Count,
    /// Microseconds, kept whole and shown as seconds.
    Micros,
}

impl Unit {
    /// `n` as `stats()` and Prometheus show it.
    pub fn shown(self, n: u64) -> f64 {
        match self {
            Unit::Count => n as f64,
            Unit::Micros => n as f64 / 1e6,
        }
    }
}

/// A series' labels besides `worker`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Labels {
    /// `pool`.
    Pool,
    /// `pool` and `shadow`: only pools with a shadow have the series.
    Shadow,
}

/// A number that `stats()` and `thread_pool_status` show.
pub struct Stat {
    /// Its key in `stats()`, and its field's name where it is stored.
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub labels: Labels,
    /// Its name in Prometheus.
    pub metric: &'static str,
    pub help: &'static str,
    pub read: fn(&PoolStats) -> Reading,
}

/// Keeps the counters on either side of it off each other's cache lines,
/// whatever the alignment of the memory they are in.
#[repr(C)]
#[derive(Default)]
struct Apart([u64; 8]);

/// `reset` of a counter (a Histogram has its own).
trait Reset {
    fn reset(&self);
}

impl Reset for AtomicU64 {
    fn reset(&self) {
        self.store(0, Relaxed);
    }
}

macro_rules! field_type {
    (Histogram) => {
        Histogram
    };
    ($kind:ident) => {
        AtomicU64
    };
}

macro_rules! read_field {
    (Histogram, $name:ident) => {
        |s| s.$name.read()
    };
    ($kind:ident, $name:ident) => {
        |s| Reading::Number(s.$name.load(Relaxed))
    };
}

/// Writes `PoolStats`, `PoolStats::reset` and `STATS` from the table
/// (the last rule). It sorts each entry's field onto its side's list
/// (`@place`), so that a side's fields lie together, and the exported
/// entries onto `STATS`'s, in the table's order (the status page's), then
/// writes them (`@emit`).
macro_rules! counters {
    (@sort $threads:tt $event_loop:tt $stats:tt) => {
        counters!(@emit $threads $event_loop $stats);
    };
    (@sort $threads:tt $event_loop:tt $stats:tt
        $(#[doc = $doc:literal])* $name:ident: internal, $side:ident; $($rest:tt)*) => {
        counters!(@place $side [$(#[doc = $doc])* $name: AtomicU64]
            $threads $event_loop $stats $($rest)*);
    };
    (@sort $threads:tt $event_loop:tt [$($stats:tt)*]
        $(#[doc = $doc:literal])* $name:ident: $kind:ident, $unit:ident, $labels:ident,
        computed($read:expr), $metric:literal, $help:literal; $($rest:tt)*) => {
        counters!(@sort $threads $event_loop [$($stats)* ($name $kind $unit $labels $metric $help
            (|s| {
                let read: fn(&PoolStats) -> u64 = $read;
                Reading::Number(read(s))
            }))] $($rest)*);
    };
    (@sort $threads:tt $event_loop:tt [$($stats:tt)*]
        $(#[doc = $doc:literal])* $name:ident: $kind:ident, $unit:ident, $labels:ident,
        $side:ident, $metric:literal, $help:literal; $($rest:tt)*) => {
        counters!(@place $side [#[doc = $help] $(#[doc = $doc])* $name: field_type!($kind)]
            $threads $event_loop
            [$($stats)* ($name $kind $unit $labels $metric $help (read_field!($kind, $name)))]
            $($rest)*);
    };
    (@place threads_side $field:tt [$($threads:tt)*] $event_loop:tt $stats:tt $($rest:tt)*) => {
        counters!(@sort [$($threads)* $field] $event_loop $stats $($rest)*);
    };
    (@place event_loop_side $field:tt $threads:tt [$($event_loop:tt)*] $stats:tt $($rest:tt)*) => {
        counters!(@sort $threads [$($event_loop)* $field] $stats $($rest)*);
    };
    (@emit
        [$([$(#[doc = $tdoc:literal])* $tname:ident: $tty:ty])*]
        [$([$(#[doc = $edoc:literal])* $ename:ident: $ety:ty])*]
        [$(($name:ident $kind:ident $unit:ident $labels:ident $metric:literal $help:literal $read:tt))*]
    ) => {
        /// The numbers of a pool. Those the pool threads write per task
        /// and those the event loop writes per push are kept apart: on
        /// shared cache lines, every push fetched back the line the
        /// threads had just written.
        #[repr(C)]
        #[derive(Default)]
        pub struct PoolStats {
            $($(#[doc = $tdoc])* pub $tname: $tty,)*
            _threads_side: Apart,
            $($(#[doc = $edoc])* pub $ename: $ety,)*
            _event_loop_side: Apart,
        }

        impl PoolStats {
            /// Every number back to 0 (a worker that starts in a slot of
            /// the shared table).
            pub fn reset(&self) {
                $(self.$tname.reset();)*
                $(self.$ename.reset();)*
            }
        }

        /// The numbers `stats()` and `thread_pool_status` show, in the
        /// table's order.
        pub const STATS: &[Stat] = &[$(Stat {
            name: stringify!($name),
            kind: Kind::$kind,
            unit: Unit::$unit,
            labels: Labels::$labels,
            metric: $metric,
            help: $help,
            read: $read,
        },)*];
    };
    ($($entries:tt)*) => {
        counters!(@sort [] [] [] $($entries)*);
    };
}

// Each entry: `name: Kind, Unit, Labels, where, "metric", "help";`, where
// is `threads_side` (written by the pool threads), `event_loop_side`
// (written by the event loop) or `computed(fn)` (read off other fields);
// or `name: internal, side;`, a field the pool keeps for itself. The help
// is the field's doc, before its own.
counters! {
    /// Set at the worker's start.
    threads: Gauge, Count, Pool, threads_side,
        "ngx_threadpool_threads", "Threads of the pool in the worker.";
    /// The tasks of a claim (handoff/job.rs).
    busy: Gauge, Count, Pool, threads_side,
        "ngx_threadpool_busy_threads", "Threads running a task.";
    queued: Gauge, Count, Pool, computed(PoolStats::queued),
        "ngx_threadpool_queued_tasks", "Tasks waiting for a thread.";
    /// Places ever taken in the queue (see `reserve`), by the event loop's
    /// pushes and by the threads of pools this one shadows.
    admitted: internal, event_loop_side;
    /// Tasks claimed by a thread (to run or to skip); `queued` is
    /// `admitted` minus this.
    taken: internal, threads_side;
    pushed: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_tasks_pushed_total", "Tasks queued.";
    completed: Counter, Count, Pool, threads_side,
        "ngx_threadpool_tasks_completed_total", "Tasks whose handler returned.";
    /// An error, out of memory.
    errors: Counter, Count, Pool, threads_side,
        "ngx_threadpool_task_errors_total", "Tasks whose handler failed.";
    rejected: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_tasks_rejected_total", "Pushes refused: queue full.";
    /// push_task's timeout.
    timed_out: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_tasks_timed_out_total", "Tasks whose caller timed out.";
    abandoned: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_tasks_abandoned_total",
        "Tasks whose caller went away: its request ended or its light thread was killed.";
    /// Timed out or went away.
    cancelled: Counter, Count, Pool, threads_side,
        "ngx_threadpool_tasks_cancelled_total",
        "Tasks not run: their caller gave up before a thread took them.";
    /// See `admits`.
    overloaded: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_tasks_overloaded_total",
        "Pushes refused: the pool could not finish them before their deadline.";
    /// See `late`.
    expired: Counter, Count, Pool, threads_side,
        "ngx_threadpool_tasks_expired_total",
        "Tasks not run: their deadline came too close while they waited.";
    /// The stream counters count a stream when its record is freed
    /// (worker/tasks.rs); bytes are encoded.
    streams: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_streams_total", "Streams pushed (push_stream).";
    stream_chunks_out: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_stream_chunks_out_total", "Chunks of streams that their readers took.";
    stream_bytes_out: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_stream_bytes_out_total", "Bytes (encoded) of the chunks readers took.";
    stream_chunks_in: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_stream_chunks_in_total",
        "Chunks that stream callers wrote to their handlers.";
    stream_bytes_in: Counter, Count, Pool, event_loop_side,
        "ngx_threadpool_stream_bytes_in_total", "Bytes (encoded) of the chunks callers wrote.";
    stream_send_wait: Counter, Micros, Pool, event_loop_side,
        "ngx_threadpool_stream_send_wait_seconds_total",
        "Time stream handlers' sends waited for their reader to take a chunk.";
    expected_wait: Gauge, Micros, Pool, computed(|s| s.expected_wait_us(1)),
        "ngx_threadpool_expected_wait_seconds",
        "Expected wait of a task pushed now, from the tasks ahead and the run estimate.";
    /// 0: none measured yet. Each task weighs 1/8 (see `measured`).
    run_estimate: Gauge, Micros, Pool, threads_side,
        "ngx_threadpool_run_estimate_seconds", "Recent run time of a task (a moving average).";
    wait_limit: Gauge, Micros, Pool,
        computed(|s| s.wait_limit_us(s.run_estimate.load(Relaxed)).unwrap_or(0)),
        "ngx_threadpool_wait_limit_seconds",
        "Longest wait admitted while the queue stands (0: it does not).";
    /// The queue's standing state, kept by the threads as they take tasks
    /// (see `took`): 1 while it stands.
    standing: internal, threads_side;
    /// While the waits of the tasks taken say otherwise than `standing`,
    /// when the state changes if they go on saying it (µs since the
    /// worker's epoch); 0 otherwise.
    flips_at_us: internal, threads_side;
    wait: Histogram, Micros, Pool, threads_side,
        "ngx_threadpool_queue_wait_seconds", "Time from push to a thread taking the task.";
    run: Histogram, Micros, Pool, threads_side,
        "ngx_threadpool_run_seconds", "Time the handler ran.";
    /// Live updates (thread/updates.rs); each thread's version is in the
    /// status table's versions (stats/versions.rs).
    update_version: Gauge, Count, Pool, threads_side,
        "ngx_threadpool_update_version", "The pool's latest update that the worker has read.";
    updates_applied: Counter, Count, Pool, threads_side,
        "ngx_threadpool_updates_applied_total", "Updates a thread of the pool applied.";
    updates_failed: Counter, Count, Pool, threads_side,
        "ngx_threadpool_updates_failed_total",
        "Updates a thread of the pool failed to apply, keeping its version.";
    update_seconds: Gauge, Micros, Pool, threads_side,
        "ngx_threadpool_update_seconds",
        "Time from the latest update's call to the last of the worker's threads moving to it.";
    /// With `thread_pool_shadow` (thread/shadow.rs, thread/compare.rs).
    shadow_compared: Counter, Count, Shadow, threads_side,
        "ngx_threadpool_shadow_compared_total",
        "Tasks run again on the shadow pool and their results compared.";
    shadow_mismatched: Counter, Count, Shadow, threads_side,
        "ngx_threadpool_shadow_mismatched_total", "Compared tasks whose results differed.";
    shadow_skipped: Counter, Count, Shadow, threads_side,
        "ngx_threadpool_shadow_skipped_total",
        "Sampled tasks not compared: the shadow's queue was full.";
}

impl PoolStats {
    pub fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub fn sub(counter: &AtomicU64) {
        counter.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::histogram::BUCKETS;
    use std::collections::BTreeSet;

    /// What Prometheus's naming asks of a metric, and what the renderers
    /// assume of an entry.
    #[test]
    fn each_number_is_named_once_as_prometheus_names_them() {
        let names: BTreeSet<_> = STATS.iter().map(|s| s.name).collect();
        let metrics: BTreeSet<_> = STATS.iter().map(|s| s.metric).collect();
        assert_eq!(names.len(), STATS.len(), "a name twice");
        assert_eq!(metrics.len(), STATS.len(), "a metric twice");
        for s in STATS {
            let m = s.metric;
            assert!(m.starts_with("ngx_threadpool_"), "{m}");
            assert_eq!(s.kind == Kind::Counter, m.ends_with("_total"), "{m}");
            assert_eq!(s.unit == Unit::Micros, m.contains("_seconds"), "{m}");
            let histogram = matches!((s.read)(&PoolStats::default()), Reading::Histogram { .. });
            assert_eq!(s.kind == Kind::Histogram, histogram, "{m}");
            assert!(!histogram || s.unit == Unit::Micros, "{m}");
        }
    }

    #[test]
    fn reset_zeroes_every_number() {
        let s = PoolStats::default();
        s.threads.store(3, Relaxed);
        s.admitted.store(4, Relaxed);
        s.stream_send_wait.store(5, Relaxed);
        s.run.observe(std::time::Duration::from_millis(1));
        s.reset();
        for stat in STATS {
            match (stat.read)(&s) {
                Reading::Number(n) => assert_eq!(n, 0, "{}", stat.name),
                Reading::Histogram { buckets, sum_us } => {
                    assert_eq!((buckets, sum_us), ([0; BUCKETS], 0), "{}", stat.name)
                }
            }
        }
    }

    /// docs/lua-api.md and docs/metrics.md name each number: the table is
    /// the one definition, the docs follow it.
    #[test]
    fn the_docs_name_every_number() {
        let doc = |name: &str| {
            std::fs::read_to_string(format!("{}/docs/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
        };
        let (lua_api, metrics) = (doc("lua-api.md"), doc("metrics.md"));
        for s in STATS {
            assert!(
                lua_api.contains(&format!("`{}`", s.name)),
                "docs/lua-api.md does not name stats()'s {}",
                s.name
            );
            // metrics.md may shorten a name to its part after ngx_threadpool
            let tail = s.metric.trim_start_matches("ngx_threadpool");
            assert!(
                metrics.contains(&format!("{tail}`")),
                "docs/metrics.md does not name {}",
                s.metric
            );
        }
    }
}

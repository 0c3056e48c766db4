//! A worker's side of its pools' updates (docs/updates.md): the update
//! thread, one per worker, which waits for updates (handoff/update.rs)
//! and hands each pool's new update to the pool's threads, waking those
//! that wait for a job with jobs without tasks (Work::wake), and what a
//! pool thread keeps of them. A pool thread applies the latest update
//! between two tasks (thread/run.rs), so that every task runs on one
//! version; the last of the worker's threads to apply it logs its outcome.

use crate::handoff::job::{Job, PoolId, Work};
use crate::handoff::update::{Update, UpdateZone, Wake};
use crate::ngx::log::{self, Log};
use crate::ngx::os;
use crate::stats::{PoolStats, ThreadVersion, UpdateError};
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// An update and how far it got in this worker.
pub struct Current {
    pub update: Update,
    /// The pool's threads in the worker.
    threads: usize,
    /// The worker's threads that have not moved to it or past it.
    pending: AtomicUsize,
    failed: AtomicUsize,
    /// The first failure's error.
    error: Mutex<Option<String>>,
}

/// A pool's latest update in this worker, as its update thread read it.
pub struct Latest {
    version: AtomicU64,
    current: Mutex<Option<Arc<Current>>>,
    threads: usize,
}

impl Latest {
    /// The latest update of a pool of `threads` threads.
    pub fn new(threads: usize) -> Arc<Latest> {
        Arc::new(Latest {
            version: AtomicU64::new(0),
            current: Mutex::new(None),
            threads,
        })
    }

    /// Reads `zone` and, if it holds a later update than the last read,
    /// hands it to the threads, and sets the pool's version gauge: the
    /// threads that have not moved to the latest update.
    pub fn refresh(&self, zone: &UpdateZone, stats: &PoolStats) -> usize {
        if zone.version() > self.version.load(Ordering::Relaxed) {
            self.read(zone, stats);
        }
        self.get().map_or(0, |c| c.pending.load(Ordering::Acquire))
    }

    /// Takes the update of `zone` as the latest.
    fn read(&self, zone: &UpdateZone, stats: &PoolStats) {
        let held = self.get().and_then(|c| c.update.code.clone());
        let Some(update) = zone.read(held.as_ref()) else {
            return;
        };
        let version = update.version;
        let current = Current {
            update,
            threads: self.threads,
            pending: AtomicUsize::new(self.threads),
            failed: AtomicUsize::new(0),
            error: Mutex::new(None),
        };
        *lock(&self.current) = Some(Arc::new(current));
        self.version.store(version, Ordering::Release);
        stats.update_version.store(version, Ordering::Relaxed);
    }

    /// The latest update, if any.
    fn get(&self) -> Option<Arc<Current>> {
        lock(&self.current).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a pool thread keeps of its pool's updates.
pub struct ThreadUpdates {
    pub latest: Arc<Latest>,
    /// Its versions in the status table, and its worker's pool's error.
    pub slot: Option<&'static ThreadVersion>,
    pub error: Option<&'static UpdateError>,
    /// The update its state is at; None: the configuration's.
    pub applied: Option<Arc<Current>>,
    /// The latest version it failed to apply.
    failed: u64,
}

/// The outcome of one thread's update, for its worker's line.
pub enum Moved {
    Applied,
    Failed(String),
}

impl ThreadUpdates {
    pub fn new(
        latest: Arc<Latest>,
        versions: Option<(&'static UpdateError, &'static ThreadVersion)>,
    ) -> ThreadUpdates {
        ThreadUpdates {
            latest,
            slot: versions.map(|(_, slot)| slot),
            error: versions.map(|(error, _)| error),
            applied: None,
            failed: 0,
        }
    }

    /// The version the thread's state is at.
    pub fn version(&self) -> u64 {
        self.applied.as_ref().map_or(0, |c| c.update.version)
    }

    /// The latest update, if the thread has neither applied nor failed it.
    pub fn newer(&self) -> Option<Arc<Current>> {
        let latest = self.latest.version.load(Ordering::Acquire);
        if latest <= self.version().max(self.failed) {
            return None;
        }
        self.latest.get()
    }

    /// Records that the thread moved to `current` or failed it, counted in
    /// `stats`; the last of the worker's threads logs the update's outcome
    /// for `pool` to `log`.
    pub fn record(
        &mut self,
        current: Arc<Current>,
        moved: Moved,
        pool: &str,
        stats: &PoolStats,
        log: Option<Log>,
    ) {
        let version = current.update.version;
        match moved {
            Moved::Applied => {
                PoolStats::add(&stats.updates_applied);
                if let Some(slot) = self.slot {
                    slot.applied.store(version, Ordering::Relaxed);
                }
                self.applied = Some(current.clone());
            }
            Moved::Failed(e) => {
                PoolStats::add(&stats.updates_failed);
                if let Some(slot) = self.slot {
                    slot.failed.store(version, Ordering::Relaxed);
                }
                if let Some(error) = self.error {
                    error.set(version, &e);
                }
                current.failed.fetch_add(1, Ordering::Relaxed);
                lock(&current.error).get_or_insert(e);
                self.failed = version;
            }
        }
        if current.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            outcome(&current, pool, stats, log);
        }
    }
}

/// The line of an update every thread of the worker moved to or failed,
/// and the time it took them.
fn outcome(current: &Current, pool: &str, stats: &PoolStats, log: Option<Log>) {
    let u = &current.update;
    let took_us = os::wall_clock_us().saturating_sub(u.called_at_us);
    stats.update_seconds.store(took_us, Ordering::Relaxed);
    let (version, source, threads) = (u.version, u.source, current.threads);
    let failed = current.failed.load(Ordering::Relaxed);
    let took = took_us as f64 / 1000.0;
    let line = |level, args| match log {
        Some(l) => l.message(level, args),
        None => eprintln!("{}{args}", log::PREFIX),
    };
    if failed == 0 {
        line(
            log::NGX_LOG_NOTICE,
            format_args!(
                "thread pool \"{pool}\": update {version} from worker {source} applied by {threads} threads, {took:.1} ms after the call"
            ),
        );
    } else {
        let error = lock(&current.error).clone().unwrap_or_default();
        line(
            log::NGX_LOG_ERR,
            format_args!(
                "thread pool \"{pool}\": update {version} from worker {source} failed in {failed} of {threads} threads, which keep their version: {error}"
            ),
        );
    }
}

/// What the update thread watches of one pool: its zone, where the
/// pool's threads find what it read there, and their jobs, where wake-ups
/// (Work::wake) reach those that wait for a job (a pool thread looks for
/// an update before each job).
pub struct Watched {
    pub zone: UpdateZone,
    pub latest: Arc<Latest>,
    pub stats: &'static PoolStats,
    pub pool: PoolId,
    pub jobs: Sender<Job>,
}

impl Watched {
    /// Reads the pool's zone; while some of its threads have not moved to
    /// the latest update, wakes as many (a busy one moves before its next
    /// job): whether some have not.
    fn refresh(&self) -> bool {
        let behind = self.latest.refresh(&self.zone, self.stats);
        // Wake-ups not taken yet count: a thread busy for long is not
        // sent one more each time.
        for _ in self.jobs.len()..behind {
            let _ = self.jobs.send(Work::wake(self.pool));
        }
        behind > 0
    }
}

/// The worker's update thread: stopped by `stop`.
pub struct Watcher {
    stopping: Arc<AtomicBool>,
    wake: Wake,
    handle: JoinHandle<()>,
}

/// How long the update thread waits before it reads the zones anyway (a
/// wake-up lost to a writer killed between its write and its wake).
const RECHECK: Duration = Duration::from_secs(1);

/// How long it waits, at first, before it wakes again the threads that
/// have not moved to an update; twice as long each time, up to
/// NUDGE_MAX. A wake-up may reach a thread that has moved already while
/// one that has not still waits for a job.
const NUDGE_MIN: Duration = Duration::from_millis(1);
const NUDGE_MAX: Duration = Duration::from_millis(100);

impl Watcher {
    /// Starts the worker's update thread, which waits on `wake` and hands
    /// each pool's updates to its threads.
    pub fn start(wake: Wake, pools: Vec<Watched>) -> std::io::Result<Watcher> {
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let handle = std::thread::Builder::new()
            .name("tp updates".into())
            .spawn(move || {
                os::block_async_signals();
                let Some(word) = wake.word() else {
                    return;
                };
                let mut nudge = NUDGE_MIN;
                loop {
                    let seen = word.load(Ordering::Acquire);
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let mut behind = false;
                    for p in &pools {
                        behind |= p.refresh();
                    }
                    let wait = if behind {
                        nudge = (nudge * 2).min(NUDGE_MAX);
                        nudge / 2
                    } else {
                        nudge = NUDGE_MIN;
                        RECHECK
                    };
                    os::futex_wait(word, seen, wait);
                }
            })?;
        Ok(Watcher {
            stopping,
            wake,
            handle,
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        self.stopping.store(true, Ordering::Release);
        // changed, so that a thread about to wait does not; this wakes the
        // other workers' update threads too, which find nothing new and
        // wait again
        self.wake.wake();
        let _ = self.handle.join();
    }
}

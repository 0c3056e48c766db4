//! The worker's state, on the event-loop thread: its pools (threads and job
//! channels), its task records and the completions coming back.
//!
//! Each pool has a crossbeam channel of jobs read by its threads
//! (thread/run.rs), unbounded: the bound, `max_queue`, is counted in the
//! pool's stats as tasks are pushed (`reserve`). Every thread posts
//! completions to the one completion channel of the worker and wakes the
//! event loop (handoff/notify.rs), which drains them into the task records
//! (tasks.rs).

mod error;
pub mod gate;
pub mod process;
pub mod tasks;

use crate::stats::PoolStats;
pub use error::{WorkerError, OVERLOADED};

use crate::handoff::job::{Job, PoolId, PushId, POSTED};
use crate::handoff::payload::Args;
use crate::handoff::stream::Stream;
use crate::handoff::update::UpdateZone;
use crate::ngx::log::{self, Log};
use crate::stats::{ThreadVersion, UpdateError};
use crate::thread::handler::Spec;
use crate::thread::run::{self as threads, PoolThread};
use crate::thread::shadow::{self, Shadow};
use crate::thread::updates::{Latest, ThreadUpdates, Watched, Watcher};
use crate::thread::watchdog;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tasks::{Caller, Release, Tasks};

struct Pool {
    name: String,
    /// The bound on queued tasks, counted by `stats` (`reserve`) rather than
    /// given to `bounded()`, which would preallocate and touch every slot
    /// (2.5 MiB per pool and worker for nginx's default max_queue of
    /// 65536) and count a batch as one. The event loop and the threads of
    /// pools this one shadows add to the count only under the bound
    /// (fetch_update), so the bound holds.
    max_queue: usize,
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    stats: &'static PoolStats,
    /// `stats.taken` as last read (see PoolStats::reserve).
    taken: u64,
    /// Where its updates are kept, and where its threads find them.
    updates: Option<UpdateZone>,
    latest: Arc<Latest>,
}

/// The worker's state; lives on the event-loop thread only.
pub struct Worker {
    pools: Vec<Pool>,
    completions: Receiver<Job>,
    /// Streams whose reader wanted a chunk and got one (stream.rs).
    ready: (Sender<PushId>, Receiver<PushId>),
    pub tasks: Tasks,
    /// The last anchor key handed out (see `anchor_key`).
    anchors: u64,
    /// Pushes made for a caller (not posted) whose completion has not come
    /// back, also when the caller has stopped waiting (see `awaiting`).
    awaited: usize,
    /// The threads of every pool.
    threads: usize,
    /// Set at exit: threads drop queued jobs instead of running them.
    stopping: Arc<AtomicBool>,
    watchdog: Option<Watchdog>,
    /// The update thread, if a pool takes updates.
    watcher: Option<Watcher>,
}

/// The watchdog of slow tasks: closing the sender stops it.
type Watchdog = (Sender<()>, JoinHandle<()>);

/// What Worker::start needs of a pool.
pub struct PoolSetup {
    pub spec: Spec,
    pub threads: usize,
    pub max_queue: usize,
    /// `thread_pool_shadow`: the index of the shadow pool and the
    /// options.
    pub shadow: Option<(usize, crate::conf::ShadowOptions)>,
    /// Where the pool's updates are kept (None: off).
    pub updates: Option<UpdateZone>,
    /// This worker's update error and thread versions of the pool, in the
    /// status table.
    pub versions: Option<(&'static UpdateError, &'static [ThreadVersion])>,
}

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Runs `f` on the worker state; None outside a worker (master, `nginx -t`)
/// or when re-entered.
pub fn with_worker<R>(f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
    WORKER.with(|w| w.try_borrow_mut().ok()?.as_mut().map(f))
}

impl Worker {
    /// Starts the threads of every pool, as `setups` describe them, and
    /// the watchdog if a pool has slow tasks watched. `shared` is this
    /// worker's row of the shared counters, one per pool, when the status
    /// table exists.
    pub fn start(
        setups: Vec<PoolSetup>,
        shared: Option<&'static [PoolStats]>,
    ) -> Result<(), WorkerError> {
        let (done_tx, done_rx) = unbounded();
        let stopping = Arc::new(AtomicBool::new(false));
        let mut pools = Vec::with_capacity(setups.len());
        let epoch = Instant::now();
        let mut watched = Vec::new();
        let log = setups.first().and_then(|s| s.spec.log);
        // Every pool's channel and counters first: a pool's threads may
        // send to its shadow's.
        let channels: Vec<_> = setups.iter().map(|_| unbounded::<Job>()).collect();
        let all_stats = pool_stats(&setups, shared);
        let shadows = shadows(&setups, &channels, &all_stats);
        let given = Given {
            stopping: &stopping,
            epoch,
            done: &done_tx,
        };
        for (i, (setup, shadow)) in setups.into_iter().zip(shadows).enumerate() {
            let pool = spawn_pool(
                setup,
                &channels[i],
                all_stats[i],
                shadow,
                &given,
                &mut watched,
            )?;
            pools.push(pool);
        }
        let watchdog = start_watchdog(watched, epoch, log)?;
        let watcher = start_watcher(&pools)?;
        let mut tasks = Tasks::default();
        tasks.stats = pools.iter().map(|p| p.stats).collect();
        tasks.large_results = vec![false; pools.len()];
        let threads = pools.iter().map(|p| p.threads.len()).sum();
        let worker = Worker {
            pools,
            completions: done_rx,
            ready: unbounded(),
            tasks,
            anchors: 0,
            awaited: 0,
            threads,
            stopping,
            watchdog,
            watcher,
        };
        WORKER.with(|w| *w.borrow_mut() = Some(worker));
        Ok(())
    }

    /// A new key under which a caller anchors the strings its arguments
    /// borrow (never 0, exact as a Lua number).
    pub fn anchor_key(&mut self) -> u64 {
        self.anchors += 1;
        self.anchors
    }

    /// Whether pool `pool` can be expected to finish `n` tasks pushed now
    /// within `timeout`, their deadline: Overloaded, counted, if not. A
    /// few loads and a comparison, before the push's arguments are even
    /// encoded, so that a refusal costs the event loop next to nothing.
    /// A deadline already passed (zero: an absolute one, push_task_until)
    /// is refused however idle the pool: no task can finish before it.
    pub fn admit(&self, pool: PoolId, n: usize, timeout: Duration) -> Result<(), WorkerError> {
        let stats = self.pools.get(pool).ok_or(WorkerError::NoSuchPool)?.stats;
        let timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        if timeout_us > 0 && stats.admits(n as u64, timeout_us) {
            return Ok(());
        }
        stats.overloaded.fetch_add(n as u64, Ordering::Relaxed);
        Err(WorkerError::Overloaded)
    }

    /// Queues the tasks of `args`, one per part, for pool `pool`, all or
    /// none: QueueFull if they do not all fit. With a `deadline` (the
    /// time from now), a thread starts none of them once it is too close
    /// (PoolStats::late). With a caller, it waits for
    /// them on the record whose id this returns (its semaphore is posted
    /// once all are done); without, they are posted tasks whose results
    /// nobody takes. With `stream`, the one task's handler sends chunks,
    /// at most that many unread (stream.rs).
    ///
    /// # Safety
    /// `caller.tasks` must be the pushing request's task list (see
    /// Tasks::start);
    /// the caller keeps the bytes of the arguments' spans alive until the
    /// anchor is reaped or the result taken (posted tasks borrow nothing).
    pub unsafe fn push(
        &mut self,
        pool: PoolId,
        caller: Option<Caller>,
        args: Args,
        anchor: u64,
        deadline: Option<Duration>,
        stream: Option<usize>,
    ) -> Result<PushId, WorkerError> {
        if caller.is_none() {
            // posted pushes come back only this way (see drain)
            self.drain();
        }
        let index = pool;
        let pool = self.pools.get_mut(pool).ok_or(WorkerError::NoSuchPool)?;
        let jobs = pool.jobs.as_ref().ok_or(WorkerError::Stopped)?;
        let n = args.count() as u64;
        if !pool
            .stats
            .reserve(n, pool.max_queue as u64, &mut pool.taken)
        {
            pool.stats.rejected.fetch_add(n, Ordering::Relaxed);
            return Err(WorkerError::QueueFull);
        }
        let (bytes, borrowed) = (args.bytes.len(), args.spans.len());
        let task = match caller {
            Some(caller) => {
                // SAFETY: caller.tasks is live until it is dropped, which
                // unlinks its records (the contract), as start needs.
                match unsafe { self.tasks.start(caller, index, anchor, stream.is_some()) } {
                    Ok(task) => task,
                    Err(e) => {
                        pool.stats.unreserve(n);
                        return Err(e);
                    }
                }
            }
            None => POSTED,
        };
        let mut work = self.tasks.work(task, index, args, deadline);
        if let (Some(bound), Some(w)) = (stream, Arc::get_mut(&mut work)) {
            w.stream = Some(Stream::new(task, bound, self.ready.0.clone()));
            PoolStats::add(&pool.stats.streams);
        }
        if task != POSTED {
            self.tasks.set_work(task, work.clone());
        }
        // As many threads as there are tasks share them (handoff/job.rs).
        for _ in 0..pool.threads.len().min(work.count()) {
            if jobs.send(work.clone()).is_err() {
                pool.stats.unreserve(n);
                if task != POSTED {
                    // Every thread is gone: abandon, then complete, which
                    // frees the record at once.
                    self.tasks.release(task, Release::NotWaiting);
                    self.tasks.complete(work);
                }
                return Err(WorkerError::Stopped);
            }
        }
        pool.stats.pushed.fetch_add(n, Ordering::Relaxed);
        if task != POSTED {
            // a posted task sends no completion to count it out
            gate::tasks_started(n as usize);
            self.awaited += 1;
        }
        log::debug(format_args!(
            "task {task:#x} queued for thread pool \"{}\": {n} tasks, {bytes} bytes, borrowed {borrowed}",
            pool.name,
        ));
        Ok(task)
    }

    /// The counters of pool `pool`.
    pub fn stats(&self, pool: PoolId) -> Option<&'static PoolStats> {
        Some(self.pools.get(pool)?.stats)
    }

    /// The update zone and name of pool `pool`.
    pub fn updates(&self, pool: PoolId) -> Result<(UpdateZone, &str), WorkerError> {
        let p = self.pools.get(pool).ok_or(WorkerError::NoSuchPool)?;
        Ok((p.updates.ok_or(WorkerError::UpdatesOff)?, &p.name))
    }

    /// Takes every completion posted so far (called on wake-up, and by
    /// post_task, whose pushes come back without one).
    pub fn drain(&mut self) {
        while let Ok(id) = self.ready.1.try_recv() {
            self.tasks.stream_ready(id);
        }
        while let Ok(work) = self.completions.try_recv() {
            if work.task == POSTED {
                self.recycle_posted(work);
                continue;
            }
            gate::tasks_finished(work.count());
            self.awaited = self.awaited.saturating_sub(1);
            // results nobody wants are dropped (and their pins let go of)
            drop(self.tasks.complete(work));
        }
    }

    /// Keeps the buffers of a posted push that came back for reuse: its
    /// arguments' and its results'.
    fn recycle_posted(&mut self, work: Job) {
        let results = self.tasks.reclaim(work);
        self.tasks.recycle(results);
    }
}

/// Takes every completion posted so far (the event loop's wake-up).
pub fn drain() {
    with_worker(|w| w.drain());
}

/// Whether the event loop should poll for completions before it sleeps
/// (handoff/notify.rs): callers wait for some, and no more pushes than threads,
/// so each can be running and its completion comes when its handler
/// returns. With more, completions come at the pace of the busy threads,
/// and a polling event loop would take a core they need.
pub fn awaiting() -> bool {
    with_worker(|w| w.awaited > 0 && w.awaited <= w.threads).unwrap_or(false)
}

/// Stops the worker's pools at process exit: queued jobs are dropped,
/// running ones finish, threads are joined. A task that never returns (a
/// runaway loop cannot be interrupted) is left behind after `grace`, so exit
/// never hangs; the process ends it.
pub fn stop(grace: Duration) {
    let Some(mut worker) = WORKER.with(|w| w.borrow_mut().take()) else {
        return;
    };
    worker.stopping.store(true, Ordering::SeqCst);
    worker.tasks.close_streams();
    gate::stop();
    if let Some((stop, handle)) = worker.watchdog.take() {
        drop(stop);
        let _ = handle.join();
    }
    if let Some(w) = worker.watcher.take() {
        w.stop();
    }
    for p in &mut worker.pools {
        p.jobs = None;
    }
    let deadline = Instant::now() + grace;
    for p in &mut worker.pools {
        for t in p.threads.drain(..) {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                log::message(
                    log::NGX_LOG_WARN,
                    format_args!(
                        "thread pool \"{}\": a task is still running at exit, leaving its thread",
                        p.name
                    ),
                );
            }
        }
    }
    for p in &worker.pools {
        log::message(
            log::NGX_LOG_NOTICE,
            format_args!("thread pool \"{}\": stopped", p.name),
        );
    }
    worker.tasks.clear();
}

/// Each pool's counters, reset, with its thread count: in this worker's
/// row of the shared table, or, without one (one process, no http block),
/// this worker's own, which live as long as the process.
fn pool_stats(
    setups: &[PoolSetup],
    shared: Option<&'static [PoolStats]>,
) -> Vec<&'static PoolStats> {
    setups
        .iter()
        .enumerate()
        .map(|(i, setup)| {
            let stats: &'static PoolStats = match shared.and_then(|row| row.get(i)) {
                Some(s) => s,
                None => Box::leak(Box::default()),
            };
            stats.reset();
            stats.threads.store(setup.threads as u64, Ordering::Relaxed);
            stats
        })
        .collect()
}

/// Each pool's sampler of tasks for its shadow pool, if it has one.
fn shadows(
    setups: &[PoolSetup],
    channels: &[(Sender<Job>, Receiver<Job>)],
    all_stats: &[&'static PoolStats],
) -> Vec<Option<Arc<Shadow>>> {
    setups
        .iter()
        .enumerate()
        .map(|(i, setup)| {
            let (target, options) = setup.shadow?;
            let target = shadow::Target {
                name: setups.get(target)?.spec.name.clone(),
                index: target,
                jobs: channels.get(target)?.0.clone(),
                stats: all_stats.get(target)?,
                max_queue: setups.get(target)?.max_queue,
            };
            let pool = setup.spec.name.clone();
            Some(Arc::new(Shadow::new(pool, all_stats[i], options, target)))
        })
        .collect()
}

/// What the worker gives every pool thread alike.
struct Given<'a> {
    stopping: &'a Arc<AtomicBool>,
    /// The time the watchdog and the threads count from.
    epoch: Instant,
    /// Where the threads send finished pushes back.
    done: &'a Sender<Job>,
}

/// Starts the threads of a pool, which read `channel`'s jobs; those the
/// watchdog watches (`thread_pool_slow_task`) are added to `watched`.
fn spawn_pool(
    setup: PoolSetup,
    channel: &(Sender<Job>, Receiver<Job>),
    stats: &'static PoolStats,
    shadow: Option<Arc<Shadow>>,
    given: &Given,
    watched: &mut Vec<watchdog::Watched>,
) -> Result<Pool, WorkerError> {
    let PoolSetup {
        spec,
        threads,
        max_queue,
        shadow: _,
        updates,
        versions,
    } = setup;
    let (tx, rx) = channel.clone();
    let mut handles = Vec::with_capacity(threads);
    let latest = Latest::new(threads);
    let mut thread_updates = pool_updates(updates.as_ref(), latest.clone(), stats, versions);
    for i in 0..threads {
        let running = Arc::new(watchdog::Running::default());
        if let Some(threshold) = spec.settings.slow_task {
            watched.push(watchdog::Watched {
                pool: spec.name.clone(),
                thread: i,
                threshold,
                running: running.clone(),
            });
        }
        let setup = threads::ThreadSetup {
            index: i,
            threads,
            stopping: given.stopping.clone(),
            stats,
            watch: threads::Watch {
                running,
                epoch: given.epoch,
            },
            shadow: shadow.clone(),
            updates: thread_updates.next().flatten(),
        };
        let (thread_spec, rx, done) = (spec.clone(), rx.clone(), given.done.clone());
        let handle = std::thread::Builder::new()
            .name(format!("tp {}", spec.name))
            .stack_size(spec.settings.stack_size)
            .spawn(move || PoolThread::main(thread_spec, rx, done, setup))
            .map_err(|err| WorkerError::ThreadSpawn {
                pool: spec.name.clone(),
                err,
            })?;
        handles.push(handle);
    }
    log::message(
        log::NGX_LOG_NOTICE,
        format_args!(
            "thread pool \"{}\": {threads} threads, queue bound {max_queue}, {}",
            spec.name, spec.settings.scheduling
        ),
    );
    Ok(Pool {
        name: spec.name,
        max_queue,
        jobs: Some(tx),
        threads: handles,
        stats,
        taken: 0,
        updates,
        latest,
    })
}

/// A pool's latest update as its update `zone` holds it now, so that
/// the threads start at it, and what each of its threads keeps of its
/// updates (None without a zone: `thread_pool_update_size off`).
fn pool_updates(
    zone: Option<&UpdateZone>,
    latest: Arc<Latest>,
    stats: &'static PoolStats,
    versions: Option<(&'static UpdateError, &'static [ThreadVersion])>,
) -> impl Iterator<Item = Option<ThreadUpdates>> {
    if let Some(zone) = zone {
        latest.refresh(zone, stats);
    }
    let on = zone.is_some();
    (0..).map(move |i| {
        let slot = versions.and_then(|(error, slots)| Some((error, slots.get(i)?)));
        on.then(|| ThreadUpdates::new(latest.clone(), slot))
    })
}

/// The update thread, if a pool takes updates.
fn start_watcher(pools: &[Pool]) -> Result<Option<Watcher>, WorkerError> {
    let watched: Vec<Watched> = pools
        .iter()
        .enumerate()
        .filter_map(|(pool, p)| {
            Some(Watched {
                zone: p.updates?,
                latest: p.latest.clone(),
                stats: p.stats,
                pool,
                jobs: p.jobs.clone()?,
            })
        })
        .collect();
    let Some(wake) = watched.first().map(|w| w.zone.wake) else {
        return Ok(None);
    };
    Watcher::start(wake, watched)
        .map(Some)
        .map_err(|err| WorkerError::ThreadSpawn {
            pool: "(updates)".into(),
            err,
        })
}

/// The watchdog of slow tasks, if any thread is watched.
fn start_watchdog(
    watched: Vec<watchdog::Watched>,
    epoch: Instant,
    log: Option<Log>,
) -> Result<Option<Watchdog>, WorkerError> {
    if watched.is_empty() {
        return Ok(None);
    }
    let (stop_tx, stop_rx) = unbounded();
    let handle = std::thread::Builder::new()
        .name("tp watchdog".into())
        .spawn(move || {
            crate::ngx::os::block_async_signals();
            watchdog::watch(watched, epoch, log, stop_rx)
        })
        .map_err(|err| WorkerError::ThreadSpawn {
            pool: "(watchdog)".into(),
            err,
        })?;
    Ok(Some((stop_tx, handle)))
}

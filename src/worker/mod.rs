//! The worker's state, on the event-loop thread: its pools (threads and job
//! channels), its task records and the completions coming back.
//!
//! Each pool has a crossbeam channel of jobs, bounded at `max_queue`, read
//! by its threads (threads.rs). Every thread posts completions to the one
//! completion channel of the worker and wakes the event loop
//! (ngx/notify.rs), which drains them into the task records (tasks.rs).

mod error;
pub mod gate;
pub mod payload;
pub mod stats;
pub mod tasks;
mod threads;
mod watchdog;

pub use error::WorkerError;
use stats::PoolStats;

use crate::codec::Span;
use crate::ngx::log;
use crate::ngx::os::Scheduling;
use crate::vm::Spec;
use crossbeam_channel::{unbounded, Receiver, Sender};
use payload::Payload;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tasks::{Release, RequestTasks, TaskId, Tasks, POSTED};
use threads::{thread_main, Completion, Job, Remaining, THREAD_STACK_SIZE};

struct Pool {
    name: String,
    /// The bound on queued jobs. Checked before each send rather than given
    /// to `bounded()`, which would preallocate and touch every slot: 2.5 MiB
    /// per pool and worker for nginx's default max_queue of 65536. Only the
    /// event loop sends, so the check is exact.
    max_queue: usize,
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    stats: &'static PoolStats,
}

/// The worker's state; lives on the event-loop thread only.
pub struct Worker {
    pools: Vec<Pool>,
    completions: Receiver<Completion>,
    pub tasks: Tasks,
    /// The payload of the last result handed to the shim: it stays here
    /// (and the strings it borrows stay pinned) until the next result, so
    /// the shim decodes it in place.
    pub last_result: Payload,
    /// Set at exit: threads drop queued jobs instead of running them.
    stopping: Arc<AtomicBool>,
    /// The watchdog of slow tasks: closing the sender stops it.
    watchdog: Option<(Sender<()>, JoinHandle<()>)>,
}

/// What Worker::start needs of a pool.
pub struct PoolSetup {
    pub spec: Spec,
    pub threads: usize,
    pub max_queue: usize,
    /// Tasks running longer than this get a warn line (None: never).
    pub slow_task: Option<Duration>,
    pub scheduling: Scheduling,
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
    /// Starts the threads of every pool; `specs` pairs each pool's spec
    /// with its (threads, max_queue). `shared` is this worker's row of the
    /// shared counters, one per pool, when the status table exists.
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
        for (i, setup) in setups.into_iter().enumerate() {
            let PoolSetup {
                spec,
                threads,
                max_queue,
                slow_task,
                scheduling,
            } = setup;
            let (tx, rx) = unbounded::<Job>();
            // Without the shared table (one process, no http block), this
            // worker's own; it lives as long as the process.
            let stats: &'static PoolStats = match shared.and_then(|row| row.get(i)) {
                Some(s) => s,
                None => Box::leak(Box::default()),
            };
            stats.reset();
            stats.threads.store(threads as u64, Ordering::Relaxed);
            let mut handles = Vec::with_capacity(threads);
            for i in 0..threads {
                let running = Arc::new(watchdog::Running::default());
                if let Some(threshold) = slow_task {
                    watched.push(watchdog::Watched {
                        pool: spec.pool.clone(),
                        thread: i,
                        threshold,
                        running: running.clone(),
                    });
                }
                let setup = threads::ThreadSetup {
                    index: i,
                    stopping: stopping.clone(),
                    stats,
                    watch: threads::Watch { running, epoch },
                    scheduling,
                };
                let (thread_spec, rx, done) = (spec.clone(), rx.clone(), done_tx.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("tp {}", spec.pool))
                    .stack_size(THREAD_STACK_SIZE)
                    .spawn(move || thread_main(thread_spec, rx, done, setup))
                    .map_err(|err| WorkerError::ThreadSpawn {
                        pool: spec.pool.clone(),
                        err,
                    })?;
                handles.push(handle);
            }
            log::message(
                log::NGX_LOG_NOTICE,
                format_args!(
                    "thread pool \"{}\": {threads} threads, queue bound {max_queue}, {scheduling}",
                    spec.pool
                ),
            );
            pools.push(Pool {
                name: spec.pool,
                max_queue,
                jobs: Some(tx),
                threads: handles,
                stats,
            });
        }
        let watchdog = if watched.is_empty() {
            None
        } else {
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
            Some((stop_tx, handle))
        };
        let mut tasks = Tasks::default();
        tasks.stats = pools.iter().map(|p| p.stats).collect();
        let worker = Worker {
            pools,
            completions: done_rx,
            tasks,
            last_result: Payload::default(),
            stopping,
            watchdog,
        };
        WORKER.with(|w| *w.borrow_mut() = Some(worker));
        Ok(())
    }

    /// Queues a task for pool `pool` with the encoded arguments `args`.
    ///
    /// # Safety
    /// `owner` must be the pushing request's task list (see Tasks::start);
    /// the caller keeps the bytes of the arguments' spans alive until the
    /// task is reaped or its result taken.
    pub unsafe fn push(
        &mut self,
        pool: usize,
        owner: *mut RequestTasks,
        args: Args,
    ) -> Result<TaskId, WorkerError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue(pool, Some(owner), args, None) }
    }

    /// Queues one task per payload for pool `pool`, all or none: QueueFull
    /// if they do not all fit. The first task's semaphore is posted once
    /// every one of them is done.
    ///
    /// # Safety
    /// As push.
    pub unsafe fn push_batch<'a>(
        &mut self,
        pool: usize,
        owner: *mut RequestTasks,
        payloads: impl ExactSizeIterator<Item = Args<'a>>,
    ) -> Result<Vec<TaskId>, WorkerError> {
        let p = self.pools.get(pool).ok_or(WorkerError::NoSuchPool)?;
        let queued = p.jobs.as_ref().ok_or(WorkerError::Stopped)?.len();
        if queued + payloads.len() > p.max_queue {
            p.stats
                .rejected
                .fetch_add(payloads.len() as u64, Ordering::Relaxed);
            return Err(WorkerError::QueueFull);
        }
        let mut ids = Vec::with_capacity(payloads.len());
        let left: Remaining = Arc::new(AtomicUsize::new(payloads.len()));
        for args in payloads {
            // SAFETY: forwarded from the caller.
            match unsafe { self.enqueue(pool, Some(owner), args, Some(left.clone())) } {
                Ok(id) => ids.push(id),
                Err(e) => {
                    for id in ids {
                        self.tasks.release(id, Release::NotWaiting);
                    }
                    return Err(e);
                }
            }
        }
        self.tasks.group(&ids);
        Ok(ids)
    }

    /// Queues a task whose result nobody takes (post_task): its arguments
    /// borrow nothing, as nobody would hear when they are free.
    pub fn post(&mut self, pool: usize, args: &[u8]) -> Result<(), WorkerError> {
        let args = Args {
            bytes: args,
            spans: &[],
        };
        // SAFETY: a posted task has no record, hence no owner, and no spans.
        unsafe { self.enqueue(pool, None, args, None) }.map(|_| ())
    }

    /// # Safety
    /// As push for `Some(owner)`.
    unsafe fn enqueue(
        &mut self,
        pool: usize,
        owner: Option<*mut RequestTasks>,
        args: Args,
        batch: Option<Remaining>,
    ) -> Result<TaskId, WorkerError> {
        let index = pool;
        let pool = self.pools.get(pool).ok_or(WorkerError::NoSuchPool)?;
        let jobs = pool.jobs.as_ref().ok_or(WorkerError::Stopped)?;
        if jobs.len() >= pool.max_queue {
            PoolStats::add(&pool.stats.rejected);
            return Err(WorkerError::QueueFull);
        }
        let mut bytes = self.tasks.buffer();
        // The size comes from the caller's values: fail, do not abort.
        if bytes.try_reserve(args.bytes.len()).is_err() {
            return Err(WorkerError::NoMemory);
        }
        bytes.extend_from_slice(args.bytes);
        let borrowed = !args.spans.is_empty();
        let task = match owner {
            // SAFETY: forwarded from the caller.
            Some(owner) => unsafe { self.tasks.start(owner, index, borrowed) }?,
            None => POSTED,
        };
        let payload = Payload {
            bytes,
            spans: args.spans.to_vec(),
            pinned: None,
        };
        PoolStats::add(&pool.stats.queued);
        let job = Job {
            task,
            payload,
            queued_at: Instant::now(),
            batch,
        };
        if let Err(e) = jobs.send(job) {
            PoolStats::sub(&pool.stats.queued);
            if task != POSTED {
                // Every thread is gone: abandon, then complete, which frees
                // the record at once.
                self.tasks.release(task, Release::NotWaiting);
                if let Some(buf) = self.tasks.complete(task, e.into_inner().payload, true) {
                    self.tasks.recycle(buf);
                }
            }
            return Err(WorkerError::Stopped);
        }
        PoolStats::add(&pool.stats.pushed);
        if task != POSTED {
            // a posted task sends no completion to count it out
            gate::task_started();
        }
        log::debug(format_args!(
            "task {task:#x} queued for thread pool \"{}\", {} bytes, borrowed {}",
            pool.name,
            args.bytes.len(),
            args.spans.len()
        ));
        Ok(task)
    }

    /// The counters of pool `pool`, in PoolStats::write's order.
    pub fn stats(&self, pool: usize) -> Option<Vec<u64>> {
        let mut out = Vec::with_capacity(stats::STATS_LEN);
        self.pools.get(pool)?.stats.write(&mut out);
        Some(out)
    }

    /// Takes every completion posted so far (called on wake-up).
    pub fn drain(&mut self) {
        while let Ok(c) = self.completions.try_recv() {
            gate::task_finished();
            if let Some(buf) = self.tasks.complete(c.task, c.payload, c.failed) {
                self.tasks.recycle(buf);
            }
        }
    }
}

/// A task's encoded arguments as the shim hands them over: the payload
/// and the strings it borrows.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    pub bytes: &'a [u8],
    pub spans: &'a [Span],
}

/// Takes every completion posted so far (the event loop's wake-up).
pub fn drain() {
    with_worker(|w| w.drain());
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
    gate::stop();
    if let Some((stop, handle)) = worker.watchdog.take() {
        drop(stop);
        let _ = handle.join();
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

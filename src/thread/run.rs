//! A pool thread: its handler (thread/handler.rs, of whichever kind), its loop
//! over the pool's job channel, and how it goes idle.

use super::shadow::Shadow;
use super::stack::Stack;
use super::watchdog::Running;
use crate::codec;
use crate::handoff::job::POSTED;
use crate::handoff::job::{Expectation, Job};
use crate::handoff::notify;
use crate::handoff::outcome::{self, Outcome, PinKey, Ran, OVERLOADED};
use crate::handoff::payload::LARGE;
use crate::handoff::payload::{Payload, Pinned};
use crate::handoff::spin::Spin;
use crate::handoff::stream::Stream;
use crate::ngx::os;
use crate::ngx::{guard, log};
use crate::stats::{PoolStats, Tally};
use crate::thread::handler::{Handler, Spec};
use crate::thread::updates::{Current, Moved, ThreadUpdates};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a thread is given besides its pool's spec and channels.
pub struct ThreadSetup {
    pub index: usize,
    /// The pool's threads, which share the tasks of a batch.
    pub threads: usize,
    /// Set at exit: drop queued jobs instead of running them.
    pub stopping: Arc<AtomicBool>,
    pub stats: &'static PoolStats,
    pub watch: Watch,
    /// Where a sample of this pool's tasks runs again (shadow.rs).
    pub shadow: Option<Arc<Shadow>>,
    /// The pool's updates (None: `thread_pool_update_size off`).
    pub updates: Option<ThreadUpdates>,
}

/// What a thread tells the watchdog of slow tasks.
pub struct Watch {
    pub running: Arc<Running>,
    pub epoch: Instant,
}

/// A pool thread: what it was given, its handler, and what it keeps from
/// one job to the next. Its fields drop in the order declared, the order
/// in which a function's locals would (the last made first): what the
/// thread made, its handler last, then what it was given.
pub(crate) struct PoolThread {
    /// A claim's results, result buffers and counts (kept for reuse).
    results: Vec<(usize, Payload)>,
    buffers: Vec<Vec<u8>>,
    tally: Tally,
    /// Failures of posted tasks since the last line about them, and when.
    posted_failures: u64,
    last_logged: Option<Instant>,
    /// Payload bytes handled since the thread last gave memory back.
    handled: usize,
    /// Its stack, whose pages a deep task touched go back after it.
    stack: Option<Stack>,
    spin: Spin,
    /// Where the pins of results that the event loop let go of come back.
    unpin_tx: Sender<PinKey>,
    unpin_rx: Receiver<PinKey>,
    /// Handlers rebuilt while the event loop still read result strings of
    /// theirs: kept until it has let go of them. Room for one is taken at
    /// the start, while memory is not short (see `close`).
    retired: Vec<Handler>,
    /// A state that ran out of memory and could not be built again (memory
    /// still short): built again before the next job.
    rebuild: bool,
    handler: Result<Handler, String>,
    updates: Option<ThreadUpdates>,
    shadow: Option<Arc<Shadow>>,
    watch: Watch,
    stats: &'static PoolStats,
    stopping: Arc<AtomicBool>,
    threads: usize,
    index: usize,
    done: Sender<Job>,
    jobs: Receiver<Job>,
    spec: Spec,
}

impl PoolThread {
    /// The thread's body: with its signals blocked, its scheduling set and
    /// its handler built, it serves the pool's jobs until their channel
    /// closes.
    pub(crate) fn main(spec: Spec, jobs: Receiver<Job>, done: Sender<Job>, setup: ThreadSetup) {
        let ThreadSetup {
            index,
            threads,
            stopping,
            stats,
            watch,
            shadow,
            updates,
        } = setup;
        os::block_async_signals();
        let (unpin_tx, unpin_rx) = unbounded();
        let mut thread = PoolThread {
            results: Vec::new(),
            buffers: Vec::new(),
            tally: Tally::default(),
            posted_failures: 0,
            last_logged: None,
            handled: 0,
            stack: Stack::own(),
            spin: Spin::new(SPIN),
            unpin_tx,
            unpin_rx,
            retired: Vec::with_capacity(1),
            rebuild: false,
            // built below, once the scheduling is set
            handler: Err(String::new()),
            updates,
            shadow,
            watch,
            stats,
            stopping,
            threads,
            index,
            done,
            jobs,
            spec,
        };
        thread.set_scheduling();
        thread.start();
        thread.serve();
    }

    /// Builds the handler at the pool's latest update if there is one
    /// (one its worker started after), at the configuration's otherwise,
    /// or if the latest fails.
    fn start(&mut self) {
        match self.updates.as_ref().and_then(ThreadUpdates::newer) {
            Some(current) => {
                let moved = match self.build_at(&current) {
                    Ok(h) => {
                        self.handler = Ok(h);
                        Moved::Applied
                    }
                    Err(e) => {
                        self.handler = self.build(None);
                        Moved::Failed(e)
                    }
                };
                self.record(current, moved);
            }
            None => self.handler = self.build(None),
        }
    }

    /// Moves the handler to the pool's latest update, if it has neither
    /// applied nor failed it: between two tasks, so that each runs on one
    /// version. A failure leaves the state as it was.
    fn catch_up(&mut self) {
        let Some(current) = self.updates.as_ref().and_then(ThreadUpdates::newer) else {
            return;
        };
        let held = self.updates.as_ref().and_then(|u| u.applied.as_ref());
        let code = |c: Option<&Current>| c.and_then(|c| c.update.code.as_ref()).map(|c| c.version);
        let moved = if code(Some(&current)) != code(held.map(Arc::as_ref)) {
            // new code: a new state, the old one kept until it is built
            match self.build_at(&current) {
                Ok(h) => {
                    self.replace(h);
                    Moved::Applied
                }
                Err(e) => Moved::Failed(e),
            }
        } else {
            match &self.handler {
                Ok(h) => match h.update(current.update.version, &current.update.args) {
                    Ok(()) => Moved::Applied,
                    Err(e) => Moved::Failed(e),
                },
                Err(e) => Moved::Failed(e.clone()),
            }
        };
        self.record(current, moved);
    }

    /// A new handler at `current`: built with its code, then given its
    /// arguments if the handler takes updates.
    fn build_at(&self, current: &Current) -> Result<Handler, String> {
        let u = &current.update;
        let h = guard::catch(|| Handler::build(&self.spec, self.index, u.code.as_ref()))
            .and_then(|r| r)?;
        if u.code.is_none() || h.takes_updates() {
            guard::catch(|| h.update(u.version, &u.args)).and_then(|r| r)?;
        }
        Ok(h)
    }

    /// Puts `new` in the old handler's place; the old one stays while the
    /// event loop reads strings of it (see `close`).
    fn replace(&mut self, new: Handler) {
        match std::mem::replace(&mut self.handler, Ok(new)) {
            Ok(old) if old.has_pins() => self.retire(old),
            old => drop(old),
        }
    }

    /// Keeps `old`, whose result strings the event loop still reads, until
    /// it has let go of them; were there no room left to keep it, it is
    /// leaked, never freed under the event loop's reads.
    fn retire(&mut self, old: Handler) {
        if self.retired.try_reserve(1).is_ok() {
            self.retired.push(old);
        } else {
            std::mem::forget(old);
        }
    }

    /// Counts and logs that this thread moved to `current` or failed it.
    fn record(&mut self, current: Arc<Current>, moved: Moved) {
        let version = current.update.version;
        if let Moved::Failed(e) = &moved {
            self.debug(format_args!(
                "thread pool \"{}\" thread #{}: update {version} failed: {e}",
                self.spec.name, self.index
            ));
        }
        if let Some(u) = self.updates.as_mut() {
            u.record(current, moved, &self.spec.name, self.stats, self.spec.log);
        }
    }

    /// Waits for jobs and runs them until the channel closes; an idle
    /// thread gives memory back.
    fn serve(&mut self) {
        loop {
            self.unpin();
            match next_job(&self.jobs, self.handled >= LARGE, &mut self.spin) {
                Next::Job(job) => self.take(job),
                Next::Idle => self.idle(),
                Next::Closed => break,
            }
        }
    }

    /// Runs the tasks of `job` that this thread claims, claim after claim,
    /// and sends the push back if this thread finished its last task;
    /// first, the pool's latest update if this thread has not applied it
    /// (a job without tasks is only that: Work::wake).
    fn take(&mut self, job: Job) {
        if self.stopping.load(Ordering::Relaxed) {
            return;
        }
        if self.rebuild {
            self.build_again();
        }
        self.catch_up();
        // One clock read per task: the end of a task is when the next one
        // of the job starts (a claim and a flag apart), and the job's
        // first starts when the job is taken.
        let mut now = Instant::now();
        while let Some(claim) = job.claim(self.threads) {
            self.claim(&job, claim, &mut now);
            if job.expected.is_some() {
                // a shadow task: nobody takes it back, it ends here (and
                // the next claim starts with no results of its)
                self.results.clear();
                continue;
            }
            if job.finish(&mut self.results) {
                self.send_back(job);
                return;
            }
        }
    }

    /// Runs the tasks of one claim of `job` into `results`, then adds
    /// their counts to the pool's.
    fn claim(&mut self, job: &Job, claim: Range<usize>, now: &mut Instant) {
        let stats = self.stats;
        stats.taken.fetch_add(claim.len() as u64, Ordering::Relaxed);
        stats.took(
            now.saturating_duration_since(job.queued_at),
            now.saturating_duration_since(self.watch.epoch),
        );
        PoolStats::add(&stats.busy);
        // out of `self` for the loop, which lends `self` to each task
        let mut buffers = std::mem::take(&mut self.buffers);
        job.result_buffers(claim.clone(), &mut buffers);
        for (i, bytes) in claim.zip(buffers.drain(..)) {
            if let Some(result) = self.task(job, i, bytes, now) {
                self.results.push((i, result));
            }
        }
        self.buffers = buffers;
        // The claim's counts are the pool's before its tasks count as
        // finished (Work::left).
        self.tally.flush(stats);
        PoolStats::sub(&stats.busy);
    }

    /// Task `i` of `job`, its result written into `bytes`: skipped or run,
    /// then compared, offered to the shadow pool or, posted, logged. Its
    /// result; none for a shadow task, which ends here.
    fn task(&mut self, job: &Job, i: usize, bytes: Vec<u8>, now: &mut Instant) -> Option<Payload> {
        self.handled += job.args.part(i).len() + job.args.borrowed_per_task();
        if let Some((why, failed)) = self.skip(job, *now) {
            return Some(self.skipped(job, i, bytes, why, failed));
        }
        let result = self.run(job, i, bytes, now);
        self.handled += result.bytes.len() + result.spans.iter().map(|s| s.len).sum::<usize>();
        if let Some(expected) = &job.expected {
            self.compare(job, expected.as_ref(), &result);
            return None;
        }
        self.offer(job, i, &result);
        Some(if job.task == POSTED {
            self.posted(result)
        } else {
            result
        })
    }

    /// Why the tasks of `job` are not to run, if they are not (counted):
    /// their caller gave up, or they are late. A late task, started, would
    /// end after its caller stopped waiting: the thread serves the tasks
    /// behind it instead, and the caller, if it still waits, hears why at
    /// once (true: the task fails).
    fn skip(&mut self, job: &Job, now: Instant) -> Option<(&'static str, bool)> {
        if job.cancelled().is_cancelled() {
            self.tally.cancelled += 1;
            Some(("its caller gave up", false))
        } else if job
            .deadline
            .is_some_and(|deadline| self.stats.late(job.queued_at, deadline, now))
        {
            self.tally.expired += 1;
            Some(("its deadline is too close", true))
        } else {
            None
        }
    }

    /// The result of task `i` skipped for `why`: empty, or the overload
    /// error if it `failed`.
    fn skipped(&self, job: &Job, i: usize, mut bytes: Vec<u8>, why: &str, failed: bool) -> Payload {
        self.debug(format_args!("task {:#x}.{i} skipped: {why}", job.task));
        if failed {
            outcome::fail(&mut bytes, OVERLOADED);
        }
        Payload {
            bytes,
            failed,
            ..Payload::default()
        }
    }

    /// Runs task `i` of `job`, watched and counted; `now` becomes the
    /// time it ended, or the time a state that ran out of memory was built
    /// again after it.
    fn run(&mut self, job: &Job, i: usize, bytes: Vec<u8>, now: &mut Instant) -> Payload {
        let started = *now;
        self.begin(job, i, started);
        let mut result = Payload {
            bytes,
            ..Payload::default()
        };
        let Ran {
            outcome,
            pin,
            drained,
        } = self.call(job, i, &mut result);
        if outcome == Outcome::OutOfMemory {
            // Its state holds the memory that everything from here on may
            // need (a log line, the completion, the new state): it goes
            // first.
            self.close();
        }
        if let (n @ 1.., Some(first)) = drained {
            let (pool, index) = (&self.spec.name, self.index);
            self.report(
                log::NGX_LOG_WARN,
                format_args!(
                    "thread pool \"{pool}\" thread #{index}: {n} finalizers failed after a task: {first}"
                ),
            );
        }
        result.failed = outcome != Outcome::Done;
        result.pinned = pin.map(|key| Pinned::new(key, self.unpin_tx.clone()));
        *now = self.end(job, i, started, &outcome, &result);
        if let Some(stack) = &self.stack {
            stack.after_task(*now - started);
        }
        if outcome == Outcome::OutOfMemory {
            self.out_of_memory();
            // the rebuild is the next task's wait, not its run
            *now = Instant::now();
        }
        result
    }

    /// What starts task `i` of `job` at `started`: its wait counted, the
    /// watchdog told, a sampled stream recorded.
    fn begin(&mut self, job: &Job, i: usize, started: Instant) {
        self.tally
            .waited(started.saturating_duration_since(job.queued_at));
        self.watch
            .running
            .start(started.duration_since(self.watch.epoch), job.task);
        self.debug(format_args!(
            "task {:#x}.{i} started in thread pool \"{}\" thread #{}",
            job.task, self.spec.name, self.index
        ));
        // A sampled stream keeps copies of what crosses it, for its shadow
        // to get the same input and compare its chunks.
        if let (Some(stream), Some(shadow), None) = (&job.stream, &self.shadow, &job.expected) {
            if shadow.sample_stream() {
                stream.record();
            }
        }
    }

    /// Runs the handler on task `i` of `job`, into `result`; without a
    /// handler, or if it panics, the task fails with why.
    fn call(&self, job: &Job, i: usize, result: &mut Payload) -> Ran {
        let (args, spans) = (job.args.part(i), &job.args.spans[..]);
        match &self.handler {
            Ok(h) => guard::catch(|| {
                // SAFETY: whoever pushed keeps the spans' strings alive
                // until the completion reaches the event loop, after this.
                crate::handoff::stream::serving(job.stream.as_ref(), || unsafe {
                    h.run(
                        args,
                        spans,
                        &mut result.bytes,
                        &mut result.spans,
                        job.cancelled(),
                    )
                })
            })
            .unwrap_or_else(|panic| {
                outcome::fail(&mut result.bytes, &panic);
                result.spans.clear();
                Ran::from(Outcome::Failed)
            }),
            Err(msg) => {
                outcome::fail(&mut result.bytes, msg);
                Ran::from(Outcome::Failed)
            }
        }
    }

    /// What ends task `i` of `job`, which ran from `started`: the watchdog
    /// told, the run counted. The time it ended.
    fn end(
        &mut self,
        job: &Job,
        i: usize,
        started: Instant,
        outcome: &Outcome,
        result: &Payload,
    ) -> Instant {
        self.watch.running.finish();
        let now = Instant::now();
        self.tally.ran(now - started);
        if result.failed {
            self.tally.errors += 1;
        } else {
            self.tally.completed += 1;
        }
        self.debug(format_args!(
            "task {:#x}.{i} finished in thread pool \"{}\": {outcome:?}, {} bytes",
            job.task,
            self.spec.name,
            result.bytes.len()
        ));
        now
    }

    /// Closes the handler of a thread whose state ran out of memory, first
    /// thing, so that its memory comes back before anything else
    /// allocates. If the event loop still reads strings of it, it stays in
    /// `retired` until they are let go of, with its garbage collected;
    /// were there no room left to keep it, it is leaked, never freed under
    /// the event loop's reads.
    fn close(&mut self) {
        match std::mem::replace(&mut self.handler, Err(String::new())) {
            Ok(old) if old.has_pins() => {
                self.collect(&old);
                self.retire(old);
            }
            closed => drop(closed),
        }
    }

    /// Says that the state ran out of memory and builds a new one (`close`
    /// let go of the old).
    fn out_of_memory(&mut self) {
        let (pool, index) = (&self.spec.name, self.index);
        self.report(
            log::NGX_LOG_WARN,
            format_args!(
                "thread pool \"{pool}\" thread #{index}: {}; rebuilding its Lua state",
                codec::NOT_ENOUGH_MEMORY
            ),
        );
        self.build_again();
    }

    /// Builds the handler again, at the update it was at; `rebuild`
    /// stays set while that fails.
    fn build_again(&mut self) {
        let applied = self.updates.as_ref().and_then(|u| u.applied.clone());
        self.handler = match applied {
            Some(current) => self.build_at(&current).map_err(|e| self.unusable(e)),
            None => self.build(None),
        };
        self.rebuild = self.handler.is_err();
    }

    /// A shadow task's result compared with the one its sampled task gave,
    /// `expected` (a line logged if they differ).
    fn compare(&self, job: &Job, expected: &dyn Expectation, result: &Payload) {
        let chunks = job.stream.as_ref().map(Stream::take_chunks);
        let chunks = chunks.as_deref().unwrap_or_default();
        // SAFETY: a shadow task's arguments are those Expected::task made
        // with expected (shadow.rs keeps them together).
        if let Some(line) = unsafe { expected.check(&job.args, result, chunks) } {
            self.report(log::NGX_LOG_WARN, format_args!("{line}"));
        }
    }

    /// Offers task `i` of `job` and its result to this pool's shadow, which
    /// samples.
    fn offer(&self, job: &Job, i: usize, result: &Payload) {
        match (&self.shadow, &job.stream) {
            // SAFETY: the task is not finished: the arguments' strings and
            // the result's pin are alive.
            (Some(shadow), None) => unsafe { shadow.offer(job, i, result) },
            // a stream its caller let go of sent only part of its chunks:
            // nothing to compare
            (Some(shadow), Some(stream)) if !job.cancelled().is_cancelled() => {
                if let Some(recorded) = stream.take_recorded() {
                    // SAFETY: the stream's task is not finished: its
                    // completion has not gone, so the arguments' strings
                    // and the result's pin are alive.
                    unsafe { shadow.offer_stream(job, result, recorded) };
                }
            }
            _ => {}
        }
    }

    /// A posted task's result: nobody reads it, only its buffer goes back.
    /// A failure is logged (at most once a second per thread, with how
    /// many were left unlogged).
    fn posted(&mut self, result: Payload) -> Payload {
        if result.failed {
            self.posted_failures += 1;
            if self
                .last_logged
                .is_none_or(|t: Instant| t.elapsed() >= POSTED_LOG_EVERY)
            {
                let (pool, index) = (&self.spec.name, self.index);
                self.report(
                    log::NGX_LOG_WARN,
                    format_args!(
                        "thread pool \"{pool}\" thread #{index}: posted task failed: {} ({} failed since the last line)",
                        codec::error_text(&result.bytes),
                        self.posted_failures
                    ),
                );
                self.posted_failures = 0;
                self.last_logged = Some(Instant::now());
            }
        }
        Payload {
            bytes: result.bytes,
            ..Payload::default()
        }
    }

    /// Sends a push whose every task is done back to the event loop.
    fn send_back(&self, job: Job) {
        if job.task == POSTED {
            // Nobody waits: the push goes back to the event loop without a
            // wake-up, for its buffers to be freed or reused there
            // (Worker::drain): freed here, the event loop's allocations
            // made its malloc slow (the arena's chunks came back through
            // this thread).
            let _ = self.done.send(job);
        } else {
            // Sent, not cloned: the event loop, the last to hold the push,
            // keeps its buffers for reuse (handoff/job.rs).
            complete(&self.done, job);
        }
    }

    /// No job came for IDLE after large payloads: garbage collected, and
    /// free memory given back to the system.
    fn idle(&mut self) {
        self.unpin();
        if let Ok(h) = &self.handler {
            self.collect(h);
        }
        os::give_back_free_memory();
        self.handled = 0;
    }

    /// Lets go of the result strings the event loop is done with: the
    /// handler's, or a retired handler's, which closes once it holds none.
    fn unpin(&mut self) {
        for key in self.unpin_rx.try_iter() {
            if !self.handler.as_ref().is_ok_and(|h| h.unpin(key)) {
                for old in self.retired.iter() {
                    old.unpin(key);
                }
                self.retired.retain(Handler::has_pins);
            }
        }
    }

    /// A new handler with the configuration's code, or why there is none
    /// (logged).
    fn build(&self, code: Option<&crate::handoff::update::Code>) -> Result<Handler, String> {
        guard::catch(|| Handler::build(&self.spec, self.index, code))
            .and_then(|r| r)
            .map_err(|e| self.unusable(e))
    }

    /// Logs why the thread has no handler: the error its tasks get.
    fn unusable(&self, e: String) -> String {
        let (pool, index) = (&self.spec.name, self.index);
        self.report(
            log::NGX_LOG_ERR,
            format_args!("thread pool \"{pool}\" thread #{index}: {e}"),
        );
        format!("thread pool \"{pool}\" is not usable: {e}")
    }

    /// The pool's scheduling for this thread (a warning if refused).
    fn set_scheduling(&self) {
        let scheduling = self.spec.settings.scheduling;
        if let Err(e) = os::set_scheduling(scheduling) {
            let (pool, index) = (&self.spec.name, self.index);
            self.report(
                log::NGX_LOG_WARN,
                format_args!(
                    "thread pool \"{pool}\" thread #{index}: cannot set scheduling {scheduling}: {e}"
                ),
            );
        }
    }

    /// The handler's garbage collected between tasks (a warning if it fails).
    fn collect(&self, handler: &Handler) {
        if let Err(e) = handler.collect() {
            let pool = &self.spec.name;
            self.report(
                log::NGX_LOG_WARN,
                format_args!("thread pool \"{pool}\": error between tasks: {e}"),
            );
        }
    }

    /// Logs a line: nginx's own thread pools log from their threads the
    /// same way.
    fn report(&self, level: u32, args: std::fmt::Arguments) {
        match self.spec.log {
            Some(l) => l.message(level, args),
            None => eprintln!("{}{args}", log::PREFIX),
        }
    }

    /// Logs a debug line, where the log takes them.
    fn debug(&self, args: std::fmt::Arguments) {
        if let Some(l) = self.spec.log {
            l.debug(args);
        }
    }
}

/// Sends a push whose every task is done back to the event loop and wakes
/// it.
fn complete(done: &Sender<Job>, job: Job) {
    // A closed channel: the worker is exiting and drops everything.
    if done.send(job).is_ok() {
        notify::wake();
    }
}

/// How often a thread logs the failures of posted tasks.
const POSTED_LOG_EVERY: Duration = Duration::from_secs(1);

/// The longest a thread that ran out of jobs polls before it parks. When
/// tasks come back to back (one caller pushing in a loop), the next one
/// arrives within microseconds: polling saves the futex wake-up on both
/// sides, which `make bench` measured at 1.6x the round trips per second at
/// concurrency 1.
const SPIN: Duration = Duration::from_micros(50);

/// How long a thread that handled large payloads waits for the next job
/// before it gives their memory back: long enough that a steady stream of
/// large tasks keeps reusing it (fresh pages cost more than the copies).
const IDLE: Duration = Duration::from_secs(1);

/// What a thread waiting for work gets.
enum Next {
    Job(Job),
    /// No job for IDLE (asked for only after large payloads).
    Idle,
    Closed,
}

/// The next job; with `idle_after`, Idle once no job came for IDLE.
fn next_job(jobs: &Receiver<Job>, idle_after: bool, spin: &mut Spin) -> Next {
    // A job found waiting says nothing about the gaps between jobs: not
    // observed.
    if let Ok(job) = jobs.try_recv() {
        return Next::Job(job);
    }
    let start = Instant::now();
    let budget = spin.budget();
    loop {
        match jobs.try_recv() {
            Ok(job) => {
                spin.observe(start.elapsed());
                return Next::Job(job);
            }
            Err(TryRecvError::Disconnected) => return Next::Closed,
            Err(TryRecvError::Empty) if start.elapsed() < budget => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => break,
        }
    }
    let next = if idle_after {
        match jobs.recv_timeout(IDLE) {
            Ok(job) => Next::Job(job),
            Err(RecvTimeoutError::Disconnected) => Next::Closed,
            Err(RecvTimeoutError::Timeout) => Next::Idle,
        }
    } else {
        jobs.recv().map_or(Next::Closed, Next::Job)
    };
    spin.observe(start.elapsed());
    next
}

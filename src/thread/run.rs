//! A pool thread: its handler (thread/handler.rs, of whichever kind), its loop
//! over the pool's job channel, and how it goes idle.

use super::shadow::Shadow;
use super::watchdog::Running;
use crate::codec;
use crate::handoff::job::Job;
use crate::handoff::job::POSTED;
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
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A pool thread's stack: the event loop's under Linux's default `ulimit -s`
/// (Rust's default, 2 MiB, is less), so that code recursing on the C stack,
/// like PCRE matching without JIT, gets as deep as in the event loop.
pub(crate) const THREAD_STACK_SIZE: usize = 8 << 20;

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
}

/// What a thread tells the watchdog of slow tasks.
pub struct Watch {
    pub running: Arc<Running>,
    pub epoch: Instant,
}

pub(crate) fn thread_main(spec: Spec, jobs: Receiver<Job>, done: Sender<Job>, setup: ThreadSetup) {
    let ThreadSetup {
        index,
        threads,
        stopping,
        stats,
        watch,
        shadow,
    } = setup;
    let scheduling = spec.settings.scheduling;
    os::block_async_signals();
    let pool = &spec.pool;
    // nginx's own thread pools log from their threads the same way.
    let report = |level, args: std::fmt::Arguments| match spec.log {
        Some(l) => l.message(level, args),
        None => eprintln!("{}{args}", log::PREFIX),
    };
    let debug = |args: std::fmt::Arguments| {
        if let Some(l) = spec.log {
            l.debug(args);
        }
    };
    let build = || {
        guard::catch(|| Handler::build(&spec, index))
            .and_then(|r| r)
            .map_err(|e| {
                report(
                    log::NGX_LOG_ERR,
                    format_args!("thread pool \"{pool}\" thread #{index}: {e}"),
                );
                format!("thread pool \"{pool}\" is not usable: {e}")
            })
    };
    if let Err(e) = os::set_scheduling(scheduling) {
        report(
            log::NGX_LOG_WARN,
            format_args!(
                "thread pool \"{pool}\" thread #{index}: cannot set scheduling {scheduling}: {e}"
            ),
        );
    }
    let collect = |handler: &Handler| {
        if let Err(e) = handler.collect() {
            report(
                log::NGX_LOG_WARN,
                format_args!("thread pool \"{pool}\": error between tasks: {e}"),
            );
        }
    };
    let mut handler = build();
    // A state that ran out of memory and could not be built again (memory
    // still short): built again before the next job.
    let mut rebuild = false;
    // Handlers rebuilt while the event loop still read result strings of
    // theirs: kept until it has let go of them. Room for one is taken
    // now, while memory is not short (see `close`).
    let mut retired: Vec<Handler> = Vec::with_capacity(1);
    let (unpin_tx, unpin_rx) = unbounded::<PinKey>();
    let unpin = |handler: &Result<Handler, String>, retired: &mut Vec<Handler>| {
        for key in unpin_rx.try_iter() {
            if !handler.as_ref().is_ok_and(|h| h.unpin(key)) {
                for old in retired.iter() {
                    old.unpin(key);
                }
                retired.retain(Handler::has_pins);
            }
        }
    };
    let mut spin = Spin::new(SPIN);
    // Payload bytes handled since the thread last gave memory back.
    let mut handled = 0;
    // A claim's result buffers, results and counts (kept for reuse).
    let mut buffers = Vec::new();
    let mut results = Vec::new();
    let mut tally = Tally::default();
    // Failures of posted tasks since the last line about them, and when.
    let mut posted_failures = 0u64;
    let mut last_logged: Option<Instant> = None;
    loop {
        unpin(&handler, &mut retired);
        let job = match next_job(&jobs, handled >= LARGE, &mut spin) {
            Next::Job(job) => job,
            Next::Idle => {
                unpin(&handler, &mut retired);
                if let Ok(h) = &handler {
                    collect(h);
                }
                os::give_back_free_memory();
                handled = 0;
                continue;
            }
            Next::Closed => break,
        };
        if stopping.load(Ordering::Relaxed) {
            continue;
        }
        if rebuild {
            handler = build();
            rebuild = handler.is_err();
        }
        // One clock read per task: the end of a task is when the next one
        // of the job starts (a claim and a flag apart), and the job's
        // first starts when the job is taken.
        let mut now = Instant::now();
        while let Some(claim) = job.claim(threads) {
            stats.taken.fetch_add(claim.len() as u64, Ordering::Relaxed);
            stats.took(
                now.saturating_duration_since(job.queued_at),
                now.saturating_duration_since(watch.epoch),
            );
            PoolStats::add(&stats.busy);
            job.result_buffers(claim.clone(), &mut buffers);
            for (i, bytes) in claim.zip(buffers.drain(..)) {
                let (args, spans) = (job.args.part(i), &job.args.spans[..]);
                handled += args.len() + job.args.borrowed_per_task();
                // A late task, started, would end after its caller stopped
                // waiting: the thread serves the tasks behind it instead,
                // and the caller, if it still waits, hears why at once.
                let late = || {
                    job.deadline
                        .is_some_and(|deadline| stats.late(job.queued_at, deadline, now))
                };
                let skipped = if job.cancelled().is_cancelled() {
                    tally.cancelled += 1;
                    Some(("its caller gave up", false))
                } else if late() {
                    tally.expired += 1;
                    Some(("its deadline is too close", true))
                } else {
                    None
                };
                if let Some((why, failed)) = skipped {
                    debug(format_args!("task {:#x}.{i} skipped: {why}", job.task));
                    let mut bytes = bytes;
                    if failed {
                        outcome::fail(&mut bytes, OVERLOADED);
                    }
                    results.push((
                        i,
                        Payload {
                            bytes,
                            failed,
                            ..Payload::default()
                        },
                    ));
                    continue;
                }
                tally.waited(now.saturating_duration_since(job.queued_at));
                let started = now;
                watch
                    .running
                    .start(started.duration_since(watch.epoch), job.task);
                debug(format_args!(
                    "task {:#x}.{i} started in thread pool \"{pool}\" thread #{index}",
                    job.task
                ));
                // A sampled stream keeps copies of what crosses it, for its
                // shadow to get the same input and compare its chunks.
                if let (Some(stream), Some(shadow), None) = (&job.stream, &shadow, &job.expected) {
                    if shadow.sample_stream() {
                        stream.record();
                    }
                }
                let mut result = Payload {
                    bytes,
                    ..Payload::default()
                };
                let outcome = match &handler {
                    Ok(h) => guard::catch(|| {
                        // SAFETY: whoever pushed keeps the spans' strings
                        // alive until the completion reaches the event
                        // loop, after this.
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
                };
                let Ran {
                    outcome,
                    pin,
                    drained,
                } = outcome;
                if outcome == Outcome::OutOfMemory {
                    // Its state holds the memory that everything from here
                    // on may need (a log line, the completion, the new
                    // state): it goes first.
                    close(
                        std::mem::replace(&mut handler, Err(String::new())),
                        &mut retired,
                        collect,
                    );
                }
                if let (n @ 1.., Some(first)) = drained {
                    report(
                        log::NGX_LOG_WARN,
                        format_args!(
                            "thread pool \"{pool}\" thread #{index}: {n} finalizers failed after a task: {first}"
                        ),
                    );
                }
                result.failed = outcome != Outcome::Done;
                result.pinned = pin.map(|key| Pinned::new(key, unpin_tx.clone()));
                watch.running.finish();
                now = Instant::now();
                tally.ran(now - started);
                if result.failed {
                    tally.errors += 1;
                } else {
                    tally.completed += 1;
                }
                debug(format_args!(
                    "task {:#x}.{i} finished in thread pool \"{pool}\": {outcome:?}, {} bytes",
                    job.task,
                    result.bytes.len()
                ));
                if outcome == Outcome::OutOfMemory {
                    report(
                        log::NGX_LOG_WARN,
                        format_args!(
                            "thread pool \"{pool}\" thread #{index}: {}; rebuilding its Lua state",
                            codec::NOT_ENOUGH_MEMORY
                        ),
                    );
                    handler = build();
                    rebuild = handler.is_err();
                    // the rebuild is the next task's wait, not its run
                    now = Instant::now();
                }
                handled += result.bytes.len() + result.spans.iter().map(|s| s.len).sum::<usize>();
                if let Some(expected) = &job.expected {
                    let chunks = job.stream.as_ref().map(Stream::take_chunks);
                    let chunks = chunks.as_deref().unwrap_or_default();
                    // SAFETY: a shadow task's arguments are those Expected::task
                    // made with expected (shadow.rs keeps them together).
                    if let Some(line) = unsafe { expected.check(&job.args, &result, chunks) } {
                        report(log::NGX_LOG_WARN, format_args!("{line}"));
                    }
                    continue;
                }
                match (&shadow, &job.stream) {
                    // SAFETY: the task is not finished: the arguments'
                    // strings and the result's pin are alive.
                    (Some(shadow), None) => unsafe { shadow.offer(&job, i, &result) },
                    // a stream its caller let go of sent only part of its
                    // chunks: nothing to compare
                    (Some(shadow), Some(stream)) if !job.cancelled().is_cancelled() => {
                        if let Some(recorded) = stream.take_recorded() {
                            // SAFETY: the stream's task is not finished: its
                            // completion has not gone, so the arguments'
                            // strings and the result's pin are alive.
                            unsafe { shadow.offer_stream(&job, &result, recorded) };
                        }
                    }
                    _ => {}
                }
                if job.task == POSTED {
                    // Nobody takes the result; a failure is logged (at most
                    // once a second per thread, with how many were left
                    // unlogged).
                    if result.failed {
                        posted_failures += 1;
                        if last_logged.is_none_or(|t: Instant| t.elapsed() >= POSTED_LOG_EVERY) {
                            report(
                                log::NGX_LOG_WARN,
                                format_args!(
                                    "thread pool \"{pool}\" thread #{index}: posted task failed: {} ({} failed since the last line)",
                                    codec::error_text(&result.bytes),
                                    posted_failures
                                ),
                            );
                            posted_failures = 0;
                            last_logged = Some(Instant::now());
                        }
                    }
                    // Nobody reads the result: only its buffer goes back.
                    result = Payload {
                        bytes: result.bytes,
                        ..Payload::default()
                    };
                }
                results.push((i, result));
            }
            // The claim's counts are the pool's before its tasks count as
            // finished (Work::left).
            tally.flush(stats);
            PoolStats::sub(&stats.busy);
            if job.expected.is_some() {
                // a shadow task: nobody takes it back, it ends here (and
                // the next claim starts with no results of its)
                results.clear();
                continue;
            }
            if job.finish(&mut results) {
                if job.task == POSTED {
                    // Nobody waits: the push goes back to the event loop
                    // without a wake-up, for its buffers to be freed or
                    // reused there (Worker::drain): freed here, the event
                    // loop's allocations made its malloc slow (the arena's
                    // chunks came back through this thread).
                    let _ = done.send(job);
                } else {
                    // Sent, not cloned: the event loop, the last to hold
                    // the push, keeps its buffers for reuse (handoff/job.rs).
                    complete(&done, job);
                }
                break;
            }
        }
    }
}

/// Closes the handler of a thread whose state ran out of memory, first
/// thing, so that its memory comes back before anything else allocates. If
/// the event loop still reads strings of it, it stays in `retired` until
/// they are let go of, with its garbage collected; were there no room left
/// to keep it, it is leaked, never freed under the event loop's reads.
fn close(handler: Result<Handler, String>, retired: &mut Vec<Handler>, collect: impl Fn(&Handler)) {
    match handler {
        Ok(old) if old.has_pins() => {
            collect(&old);
            if retired.try_reserve(1).is_ok() {
                retired.push(old);
            } else {
                std::mem::forget(old);
            }
        }
        closed => drop(closed),
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

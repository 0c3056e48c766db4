//! Per-worker pools: threads, their job channels, and the worker's state on
//! the event loop.
//!
//! Each pool has a crossbeam channel of jobs, bounded at `max_queue`
//! read by its threads. Every thread posts completions to the one
//! completion channel of the worker and wakes the event loop (notify.rs).

use crate::notify;
use crate::task::{RequestTasks, TaskId, Tasks};
use crate::vm::{self, Outcome, Spec, ThreadVm};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A pool thread's stack: the event loop's under Linux's default `ulimit -s`
/// (Rust's default, 2 MiB, is less), so that code recursing on the C stack,
/// like PCRE matching without JIT, gets as deep as in the event loop.
const THREAD_STACK_SIZE: usize = 8 << 20;

/// A task on its way to a pool thread.
pub struct Job {
    pub task: TaskId,
    pub payload: Vec<u8>,
}

/// A finished task on its way back: the payload now holds the results.
pub struct Completion {
    pub task: TaskId,
    pub payload: Vec<u8>,
    pub failed: bool,
}

struct Pool {
    name: String,
    /// The bound on queued jobs. Checked before each send rather than given
    /// to `bounded()`, which would preallocate and touch every slot: 2.5 MiB
    /// per pool and worker for nginx's default max_queue of 65536. Only the
    /// event loop sends, so the check is exact.
    max_queue: usize,
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

/// The worker's state; lives on the event-loop thread only.
pub struct Worker {
    pools: Vec<Pool>,
    completions: Receiver<Completion>,
    pub tasks: Tasks,
    /// The payload of the last result handed to the shim: it stays here
    /// until the next result, so the shim decodes it in place.
    pub last_result: Vec<u8>,
    /// Set at exit: threads drop queued jobs instead of running them.
    stopping: Arc<AtomicBool>,
}

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Runs `f` on the worker state; None outside a worker (master, `nginx -t`)
/// or when re-entered.
pub fn with_worker<R>(f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
    WORKER.with(|w| w.try_borrow_mut().ok()?.as_mut().map(f))
}

/// Why a push did not queue the task.
pub enum PushError {
    Full,
    Other(String),
}

impl Worker {
    /// Starts the threads of every pool; `specs` pairs each pool's spec
    /// with its (threads, max_queue).
    pub fn start(specs: Vec<(Spec, usize, usize)>) -> Result<(), String> {
        let (done_tx, done_rx) = unbounded();
        let stopping = Arc::new(AtomicBool::new(false));
        let mut pools = Vec::with_capacity(specs.len());
        for (spec, threads, max_queue) in specs {
            let (tx, rx) = unbounded::<Job>();
            let mut handles = Vec::with_capacity(threads);
            for i in 0..threads {
                let (thread_spec, rx, done, stopping) =
                    (spec.clone(), rx.clone(), done_tx.clone(), stopping.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("tp {}", spec.pool))
                    .stack_size(THREAD_STACK_SIZE)
                    .spawn(move || thread_main(thread_spec, i, rx, done, stopping))
                    .map_err(|e| {
                        format!("thread pool \"{}\": cannot start a thread: {e}", spec.pool)
                    })?;
                handles.push(handle);
            }
            pools.push(Pool {
                name: spec.pool,
                max_queue,
                jobs: Some(tx),
                threads: handles,
            });
        }
        let worker = Worker {
            pools,
            completions: done_rx,
            tasks: Tasks::default(),
            last_result: Vec::new(),
            stopping,
        };
        WORKER.with(|w| *w.borrow_mut() = Some(worker));
        Ok(())
    }

    /// Queues a task for pool `pool` with the encoded arguments `args`.
    ///
    /// # Safety
    /// `owner` must be the pushing request's task list (see Tasks::start).
    pub unsafe fn push(
        &mut self,
        pool: usize,
        owner: *mut RequestTasks,
        args: &[u8],
    ) -> Result<TaskId, PushError> {
        let pool = self
            .pools
            .get(pool)
            .ok_or_else(|| PushError::Other("no such thread pool".into()))?;
        let jobs = pool
            .jobs
            .as_ref()
            .ok_or_else(|| PushError::Other("thread pool is stopped".into()))?;
        if jobs.len() >= pool.max_queue {
            return Err(PushError::Full);
        }
        // SAFETY: forwarded from the caller.
        let task = unsafe { self.tasks.start(owner) }.map_err(PushError::Other)?;
        let mut payload = self.tasks.buffer();
        payload.extend_from_slice(args);
        if let Err(e) = jobs.send(Job { task, payload }) {
            // Every thread is gone: abandon, then complete, which frees the
            // record at once.
            self.tasks.release(task);
            if let Some(buf) = self.tasks.complete(task, e.into_inner().payload, true) {
                self.tasks.recycle(buf);
            }
            return Err(PushError::Other("thread pool is stopped".into()));
        }
        Ok(task)
    }

    /// Takes every completion posted so far (called on wake-up).
    pub fn drain(&mut self) {
        while let Ok(c) = self.completions.try_recv() {
            if let Some(buf) = self.tasks.complete(c.task, c.payload, c.failed) {
                self.tasks.recycle(buf);
            }
        }
    }
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
                crate::ngx::log::cycle_error(&format!(
                    "thread pool \"{}\": a task is still running at exit, leaving its thread",
                    p.name
                ));
            }
        }
    }
    worker.tasks.clear();
}

fn thread_main(
    spec: Spec,
    index: usize,
    jobs: Receiver<Job>,
    done: Sender<Completion>,
    stopping: Arc<AtomicBool>,
) {
    crate::ngx::os::block_async_signals();
    crate::ngx::os::lower_priority(PRIORITY_DROP);
    let log = spec.log;
    let report = |level, msg: &str| match log {
        Some(l) => l.write(level, msg.as_bytes()),
        None => eprintln!("{msg}"),
    };
    let build = || {
        crate::ngx::guard::catch(|| ThreadVm::new(&spec))
            .and_then(|r| r)
            .map_err(|e| {
                report(
                    crate::ngx::log::NGX_LOG_ERR,
                    &format!("thread pool \"{}\" thread #{index}: {e}", spec.pool),
                );
                format!("thread pool \"{}\" is not usable: {e}", spec.pool)
            })
    };
    let mut vm = build();
    // Payload bytes handled since the thread last gave memory back.
    let mut handled = 0;
    let give_back = |vm: &Result<ThreadVm, String>, handled: &mut usize| {
        if *handled >= crate::task::LARGE {
            if let Ok(vm) = vm {
                vm.collect_garbage();
            }
            crate::ngx::os::give_back_free_memory();
        }
        *handled = 0;
    };
    while let Some(mut job) = next_job(&jobs, || give_back(&vm, &mut handled)) {
        handled += job.payload.len();
        if stopping.load(Ordering::Relaxed) {
            continue;
        }
        let outcome = match &vm {
            Ok(vm) => {
                crate::ngx::guard::catch(|| vm.run(&mut job.payload)).unwrap_or_else(|panic| {
                    vm::fail(&mut job.payload, &panic);
                    Outcome::Failed
                })
            }
            Err(msg) => {
                vm::fail(&mut job.payload, msg);
                Outcome::Failed
            }
        };
        if let Outcome::Broken(why) = &outcome {
            report(
                crate::ngx::log::NGX_LOG_WARN,
                &format!(
                    "thread pool \"{}\" thread #{index}: {why}; rebuilding its Lua state",
                    spec.pool
                ),
            );
            // The old state goes first: its memory is what the new one needs.
            drop(vm);
            vm = build();
        }
        handled += job.payload.len();
        if done
            .send(Completion {
                task: job.task,
                payload: job.payload,
                failed: outcome != Outcome::Done,
            })
            .is_err()
        {
            break;
        }
        notify::wake();
    }
}

/// How much lower than the event loop pool threads run (nice). On a loaded
/// machine the event loop then gets the CPU first when it has work: a
/// static request waits less behind CPU-heavy tasks, which still get the
/// rest of the CPU.
const PRIORITY_DROP: i32 = 5;

/// How long a thread that ran out of jobs polls before it parks. When tasks
/// come back to back (one caller pushing in a loop), the next one arrives
/// within microseconds: polling saves the futex wake-up on both sides, which
/// `make bench` measured at 1.6x the round trips per second at concurrency 1.
const SPIN: Duration = Duration::from_micros(50);

/// The next job; `idle` runs once before the thread parks.
fn next_job(jobs: &Receiver<Job>, idle: impl FnOnce()) -> Option<Job> {
    let start = Instant::now();
    loop {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) if start.elapsed() < SPIN => {
                std::hint::spin_loop()
            }
            Err(crossbeam_channel::TryRecvError::Empty) => {
                idle();
                return jobs.recv().ok();
            }
        }
    }
}

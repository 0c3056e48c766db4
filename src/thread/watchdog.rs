//! Tasks that run too long: each pool thread says which task it runs and
//! since when (two relaxed stores per task), and one watchdog thread per
//! worker looks at them a few times a second and logs a warn line, once
//! per task, for those older than their pool's threshold.

use crate::ngx::log::{self, Log};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one pool thread runs now.
#[derive(Default)]
pub struct Running {
    /// The task's handle; 0 when idle.
    task: AtomicU64,
    /// When it started, in µs since the worker's epoch.
    since_us: AtomicU64,
}

impl Running {
    /// Task `task` started `since` after the worker's epoch.
    pub fn start(&self, since: Duration, task: u64) {
        self.since_us.store(since.as_micros() as u64, Relaxed);
        self.task.store(task, Relaxed);
    }

    pub fn finish(&self) {
        self.task.store(0, Relaxed);
    }
}

/// A pool thread to watch.
pub struct Watched {
    pub pool: String,
    pub thread: usize,
    pub threshold: Duration,
    pub running: Arc<Running>,
}

/// The watchdog's loop; ends when `stop` is closed.
pub fn watch(watched: Vec<Watched>, epoch: Instant, log: Option<Log>, stop: Receiver<()>) {
    let Some(shortest) = watched.iter().map(|w| w.threshold).min() else {
        return;
    };
    let period = (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut warned = vec![0u64; watched.len()];
    loop {
        match stop.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let now = epoch.elapsed();
        for (w, last) in watched.iter().zip(warned.iter_mut()) {
            let task = w.running.task.load(Relaxed);
            if task == 0 || task == *last {
                continue;
            }
            let age = now.saturating_sub(Duration::from_micros(w.running.since_us.load(Relaxed)));
            if age >= w.threshold && w.running.task.load(Relaxed) == task {
                *last = task;
                let args = format_args!(
                    "thread pool \"{}\" thread #{}: task {task:#x} has been running for {:.1} s",
                    w.pool,
                    w.thread,
                    age.as_secs_f64()
                );
                match log {
                    Some(l) => l.message(log::NGX_LOG_WARN, args),
                    None => eprintln!("{}{args}", log::PREFIX),
                }
            }
        }
    }
}

//! A pool's queue of jobs and its idle threads: a crossbeam channel, read
//! by threads that poll it for a while and then sleep, each on its own.
//!
//! A send wakes a sleeping thread only when no thread polls. crossbeam's
//! blocking receive is woken by every send while it waits, even when
//! another thread polls and takes the job: with one task in flight, a
//! pool's second thread cost the event loop a futex wake-up per push and
//! made the round trip at concurrency 1 bimodal (9.5 or 12.4 µs,
//! bench/ANALYSIS.md).
//!
//! Invariant: a job sent is taken by a polling thread, or a sleeping
//! thread is woken for it. A thread counts itself asleep, then stops
//! counting itself as polling, then looks at the channel once more; a
//! sender sends, then reads both counts. SeqCst fences order the two sides
//! (Dekker): either the thread sees the job, or the sender sees it asleep
//! and nobody polling. A thread stops counting itself as polling only
//! after it took a job, so a sender may count on a thread that already
//! has one: that thread then wakes one for whatever is still queued.

use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// What the senders and the threads of one pool share.
struct Idlers {
    /// Threads polling the channel (or woken to): a job sent while one
    /// polls is taken without a wake-up. Written when a thread starts or
    /// stops polling.
    polling: CachePadded<AtomicUsize>,
    /// Threads asleep (or about to sleep). Written only when one sleeps or
    /// is woken: a send that finds none reads nothing else.
    asleep: CachePadded<AtomicUsize>,
    /// One per thread, by its index.
    beds: Box<[Bed]>,
}

#[derive(Default)]
struct Bed {
    /// Set by the thread before it sleeps, cleared by whoever wakes it.
    taken: AtomicBool,
    /// The thread, set before it first sleeps.
    thread: OnceLock<Thread>,
}

impl Idlers {
    /// Wakes sleeping threads for `queued` jobs, as many as there are jobs
    /// beyond the polling threads.
    fn wake_for(&self, queued: usize) {
        fence(SeqCst);
        if self.asleep.load(SeqCst) == 0 {
            return;
        }
        let wanted = queued.saturating_sub(self.polling.load(SeqCst));
        if wanted > 0 {
            self.wake(wanted);
        }
    }

    /// Wakes up to `n` sleeping threads; each counts as polling from now.
    /// A thread not yet parked gets its wake-up without a syscall.
    fn wake(&self, mut n: usize) {
        for bed in self.beds.iter() {
            if n == 0 {
                return;
            }
            if bed.taken.load(SeqCst) && bed.taken.swap(false, SeqCst) {
                self.polling.fetch_add(1, SeqCst);
                self.asleep.fetch_sub(1, SeqCst);
                if let Some(t) = bed.thread.get() {
                    t.unpark();
                }
                n -= 1;
            }
        }
    }
}

/// A new queue for `threads` threads: its sending half (cloned for each
/// sender) and its reading half (cloned for each thread).
pub fn queue<T>(threads: usize) -> (Queue<T>, Taker<T>) {
    let (tx, rx) = unbounded();
    let idle = Arc::new(Idlers {
        polling: CachePadded::new(AtomicUsize::new(0)),
        asleep: CachePadded::new(AtomicUsize::new(0)),
        beds: (0..threads).map(|_| Bed::default()).collect(),
    });
    (
        Queue {
            tx: Some(tx),
            idle: idle.clone(),
        },
        Taker { rx, idle },
    )
}

/// The sending half. Dropping one wakes every sleeping thread, so that
/// they see the channel closed once the last one is gone.
pub struct Queue<T> {
    /// Some until dropped: the channel closes before the threads wake.
    tx: Option<Sender<T>>,
    idle: Arc<Idlers>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            tx: self.tx.clone(),
            idle: self.idle.clone(),
        }
    }
}

impl<T: Clone> Queue<T> {
    /// Queues `n` copies of `job` (one per thread that shares it); Err
    /// when every thread is gone.
    pub fn send(&self, job: T, n: usize) -> Result<(), T> {
        let Some(tx) = &self.tx else {
            return Err(job);
        };
        for _ in 1..n {
            tx.send(job.clone()).map_err(|e| e.0)?;
        }
        tx.send(job).map_err(|e| e.0)?;
        self.idle.wake_for(n);
        Ok(())
    }
}

impl<T> Drop for Queue<T> {
    fn drop(&mut self) {
        drop(self.tx.take());
        fence(SeqCst);
        self.idle.wake(usize::MAX);
    }
}

/// The reading half: one per thread, by its index.
pub struct Taker<T> {
    rx: Receiver<T>,
    idle: Arc<Idlers>,
}

impl<T> Clone for Taker<T> {
    fn clone(&self) -> Self {
        Taker {
            rx: self.rx.clone(),
            idle: self.idle.clone(),
        }
    }
}

/// What a thread waiting for work gets.
pub enum Next<T> {
    Job(T),
    /// No job for IDLE (asked for only after large payloads).
    Idle,
    Closed,
}

/// The longest a thread that ran out of jobs polls before it sleeps. When
/// tasks come back to back (one caller pushing in a loop), the next one
/// arrives within microseconds: polling saves the futex wake-up on both
/// sides, which `make bench` measured at 1.6x the round trips per second at
/// concurrency 1.
const SPIN: Duration = Duration::from_micros(50);

/// The shortest: a job that comes this soon after the thread ran out is
/// still caught without a wake-up, whatever the recent waits. (The
/// channel's blocking receive, which threads used to wait in, spins and
/// yields a little before it blocks; without that, a thread slept and was
/// woken for jobs a few microseconds apart.)
const CATCH: Duration = Duration::from_micros(5);

/// How long a thread that handled large payloads waits for the next job
/// before it gives their memory back: long enough that a steady stream of
/// large tasks keeps reusing it (fresh pages cost more than the copies).
const IDLE: Duration = Duration::from_secs(1);

impl<T> Taker<T> {
    /// The next job for thread `index`; with `idle_after`, Idle once no
    /// job came for IDLE.
    pub fn next(&self, index: usize, idle_after: bool, spin: &mut Spin) -> Next<T> {
        match self.rx.try_recv() {
            Ok(job) => return Next::Job(job),
            Err(TryRecvError::Disconnected) => return Next::Closed,
            Err(TryRecvError::Empty) => {}
        }
        let start = Instant::now();
        let deadline = idle_after.then(|| start + IDLE);
        self.idle.polling.fetch_add(1, SeqCst);
        let next = self.wait(index, spin.budget().max(CATCH), start, deadline);
        spin.observe(start.elapsed());
        next
    }

    /// Polls (counted in `polling`) for `budget`, then sleeps; once woken,
    /// polls again.
    fn wait(
        &self,
        index: usize,
        budget: Duration,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Next<T> {
        let idle = &*self.idle;
        let mut polled_from = start;
        let job = loop {
            match self.rx.try_recv() {
                Ok(job) => break job,
                Err(TryRecvError::Disconnected) => return Next::Closed,
                Err(TryRecvError::Empty) if polled_from.elapsed() < budget => {
                    std::hint::spin_loop();
                }
                Err(TryRecvError::Empty) => match self.sleep(index, deadline) {
                    Some(Next::Job(job)) => break job,
                    Some(next) => return next,
                    None => polled_from = Instant::now(),
                },
            }
        };
        idle.polling.fetch_sub(1, SeqCst);
        // A sender may have counted on this thread for jobs still queued
        // behind this one (the other copies of a batch).
        fence(SeqCst);
        let queued = self.rx.len();
        if queued > 0 {
            idle.wake_for(queued);
        }
        Next::Job(job)
    }

    /// Sleeps, no longer polling, until woken (None: polling again) or the
    /// deadline passes (Idle). A job queued meanwhile is taken at once, the
    /// thread polling again.
    fn sleep(&self, index: usize, deadline: Option<Instant>) -> Option<Next<T>> {
        let idle = &*self.idle;
        let bed = &idle.beds[index];
        bed.thread.get_or_init(std::thread::current);
        bed.taken.store(true, SeqCst);
        idle.asleep.fetch_add(1, SeqCst);
        idle.polling.fetch_sub(1, SeqCst);
        fence(SeqCst);
        let looked = match self.rx.try_recv() {
            Err(TryRecvError::Empty) => None,
            Ok(job) => Some(Next::Job(job)),
            Err(TryRecvError::Disconnected) => Some(Next::Closed),
        };
        if let Some(next) = looked {
            // Not swapped: a waker took the bed and counted this thread
            // as polling already.
            if bed.taken.swap(false, SeqCst) {
                idle.polling.fetch_add(1, SeqCst);
                idle.asleep.fetch_sub(1, SeqCst);
            }
            return Some(next);
        }
        loop {
            match deadline {
                None => std::thread::park(),
                Some(d) => std::thread::park_timeout(d.saturating_duration_since(Instant::now())),
            }
            if !bed.taken.load(SeqCst) {
                return None;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Not swapped: woken just now, polling again.
                if !bed.taken.swap(false, SeqCst) {
                    return None;
                }
                idle.asleep.fetch_sub(1, SeqCst);
                return Some(Next::Idle);
            }
        }
    }
}

/// The poll before parking, adapted to how long this thread waits for a
/// job once its queue is empty: four times the recent such wait when that
/// is under SPIN, else none. Jobs that come back to back are caught without
/// a wake-up; jobs that come seldom cost no polling at all (a poll that
/// finds nothing burns a core the event loop may need). Jobs found waiting
/// in the queue say nothing about the gaps and are not counted.
pub struct Spin {
    /// Moving average of the waits, in nanoseconds (weight 1/8).
    wait_ns: u64,
}

impl Default for Spin {
    fn default() -> Spin {
        Spin {
            wait_ns: SPIN.as_nanos() as u64 / 4,
        }
    }
}

impl Spin {
    fn budget(&self) -> Duration {
        let spin = SPIN.as_nanos() as u64;
        if self.wait_ns >= spin {
            return Duration::ZERO;
        }
        Duration::from_nanos((4 * self.wait_ns).min(spin))
    }

    fn observe(&mut self, waited: Duration) {
        let w = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_ns = self.wait_ns - self.wait_ns / 8 + w / 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn spin_follows_the_waits() {
        let mut spin = Spin::default();
        assert!(spin.budget() > Duration::ZERO);
        // jobs that come seldom: no polling
        for _ in 0..40 {
            spin.observe(Duration::from_millis(2));
        }
        assert_eq!(spin.budget(), Duration::ZERO);
        // back to back again: polling comes back, bounded by SPIN
        for _ in 0..60 {
            spin.observe(Duration::from_micros(5));
        }
        let b = spin.budget();
        assert!(
            b > Duration::ZERO && b <= Duration::from_micros(40),
            "{b:?}"
        );
        for _ in 0..60 {
            spin.observe(Duration::from_micros(20));
        }
        assert_eq!(spin.budget(), SPIN);
    }

    /// Spawns `n` readers of `t` that add each job to `taken[0]` and to
    /// `taken[1 + index]`; reader `never_polls` (if any) has no poll budget.
    fn readers(
        t: Taker<u64>,
        n: usize,
        never_polls: Option<usize>,
        taken: &Arc<Vec<AtomicU64>>,
    ) -> Vec<std::thread::JoinHandle<()>> {
        (0..n)
            .map(|index| {
                let (t, taken) = (t.clone(), taken.clone());
                std::thread::spawn(move || {
                    let mut spin = Spin::default();
                    loop {
                        if never_polls == Some(index) {
                            spin.wait_ns = SPIN.as_nanos() as u64;
                        }
                        match t.next(index, false, &mut spin) {
                            Next::Job(n) => {
                                taken[1 + index].fetch_add(n, SeqCst);
                                taken[0].fetch_add(n, SeqCst);
                            }
                            Next::Idle => unreachable!(),
                            Next::Closed => return,
                        }
                    }
                })
            })
            .collect()
    }

    fn counters(readers: usize) -> Arc<Vec<AtomicU64>> {
        Arc::new((0..=readers).map(|_| AtomicU64::new(0)).collect())
    }

    /// Bursts of jobs with gaps of every length, readers that poll or
    /// not; after each burst the sender waits until it is all taken: a
    /// lost wake-up leaves a job in the queue with every reader blocked or
    /// asleep (none waits with a timeout). Closing wakes every reader.
    #[test]
    fn no_job_is_left_behind() {
        for n in [1, 3] {
            const BURSTS: u64 = 30_000;
            let (q, t) = queue::<u64>(n);
            let taken = counters(n);
            let readers = readers(t, n, Some(2), &taken);
            let mut sent = 0;
            for i in 0..BURSTS {
                let burst = 1 + i % 4;
                q.send(1, burst as usize).unwrap();
                sent += burst;
                let deadline = Instant::now() + Duration::from_secs(5);
                while taken[0].load(SeqCst) < sent {
                    assert!(Instant::now() < deadline, "a job was left in the queue");
                    std::hint::spin_loop();
                }
                match i % 13 {
                    0 => std::thread::sleep(Duration::from_micros(i % 200)),
                    1..=4 => std::thread::yield_now(),
                    _ => {}
                }
            }
            drop(q);
            for r in readers {
                r.join().unwrap();
            }
        }
    }

    /// Two jobs sent together (a batch of two tasks, or two pushes) run on
    /// both threads at once, whether they polled or slept when they came:
    /// each job's taker waits for the other job to be taken. Left queued
    /// behind its twin, the second would be taken only after the first
    /// one's wait timed out.
    #[test]
    fn a_shared_job_reaches_both_threads() {
        const ROUNDS: u64 = 20_000;
        const PATIENCE: Duration = Duration::from_millis(200);
        let (q, t) = queue::<u64>(2);
        let taken = Arc::new(AtomicU64::new(0));
        let alone = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|index| {
                let (t, taken, alone) = (t.clone(), taken.clone(), alone.clone());
                std::thread::spawn(move || {
                    let mut spin = Spin::default();
                    while let Next::Job(round) = t.next(index, false, &mut spin) {
                        taken.fetch_add(1, SeqCst);
                        let deadline = Instant::now() + PATIENCE;
                        while taken.load(SeqCst) < 2 * round {
                            if Instant::now() >= deadline {
                                alone.fetch_add(1, SeqCst);
                                break;
                            }
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        drop(t);
        for round in 1..=ROUNDS {
            if round % 2 == 0 {
                q.send(round, 2).unwrap();
            } else {
                // two pushes: the first thread may take the first after
                // the second was sent, counting on it
                q.send(round, 1).unwrap();
                q.send(round, 1).unwrap();
            }
            while taken.load(SeqCst) < 2 * round {
                std::hint::spin_loop();
            }
            if round % 7 == 0 {
                std::thread::sleep(Duration::from_micros(round % 300));
            }
        }
        drop(q);
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(alone.load(SeqCst), 0, "rounds whose second copy waited");
    }

    /// One job at a time, 20 µs apart (one caller pushing in a loop), one
    /// thread that polls that long and one that polls only CATCH: the
    /// second sleeps, and a send, which finds the first polling, does not
    /// wake it (it would be awake, not asleep, right after the send).
    /// Blocked in the channel's receive, it was woken by every send.
    #[test]
    fn a_send_to_a_polling_thread_wakes_nobody() {
        const JOBS: u64 = 20_000;
        let (q, t) = queue::<u64>(2);
        let idle = t.idle.clone();
        let taken = counters(2);
        let readers = readers(t, 2, Some(1), &taken);
        let mut asleep = 0;
        for i in 1..=JOBS {
            q.send(1, 1).unwrap();
            asleep += idle.asleep.load(SeqCst) as u64;
            while taken[0].load(SeqCst) < i {
                std::hint::spin_loop();
            }
            // the caller's turn: its result, its next push
            let turn = Instant::now();
            while turn.elapsed() < Duration::from_micros(20) {
                std::hint::spin_loop();
            }
        }
        drop(q);
        for r in readers {
            r.join().unwrap();
        }
        // Not every one: the polling thread may have been preempted.
        assert!(
            asleep > JOBS / 2,
            "a thread slept through {asleep} of {JOBS} sends"
        );
    }
}

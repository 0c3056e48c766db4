//! A pool's queue of jobs: a crossbeam channel whose readers poll it for a
//! while and then park on the queue's own condition variable, so that a
//! send wakes a parked thread only when no polling thread will take the
//! job anyway.
//!
//! Parked in the channel's blocking receive, a thread was woken by every
//! send while it waited (crossbeam wakes any registered receiver): with one
//! task in flight, a pool's second thread cost the event loop a futex
//! wake-up per push, and the round trip at concurrency 1 went from 9.3 to
//! up to 12.3 µs (bench/ANALYSIS.md).
//!
//! Invariant: a job sent is taken, or a parked thread is woken for it.
//! A thread counts itself in `polling` before its last look at the queue
//! as a poller and in `parked` before its look as a parker; a sender reads
//! both after its send. SeqCst fences order the two sides (Dekker): either
//! the sender sees the count, or the thread's next look sees the job. A
//! thread leaves its count only after it took a job, so a sender may count
//! on a thread that already has one: that thread, once uncounted, rings
//! for what is still queued (`hand_on`).

use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{fence, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The counts and the bell a queue's senders and readers share.
#[derive(Default)]
struct Door {
    /// Threads polling the queue. Written at every poll; on its own cache
    /// line, so that a push that finds no thread parked reads only `parked`.
    polling: CachePadded<AtomicUsize>,
    /// Threads parked on `bell` or about to (counted before their last
    /// look at the queue, under `lock`). Written only when a thread parks
    /// or wakes: a push reads it from its own cache.
    parked: CachePadded<AtomicUsize>,
    /// Held by a parking thread from its last look to its wait, and taken
    /// by a sender before it rings: no ring falls between the two.
    lock: Mutex<()>,
    bell: Condvar,
}

impl Door {
    /// Wakes parked threads for the jobs queued (counted only if a thread
    /// is parked) that no polling thread will take.
    fn ring(&self, queued: impl FnOnce() -> usize) {
        fence(SeqCst);
        let parked = self.parked.load(SeqCst);
        if parked == 0 {
            return;
        }
        let wanted = queued().saturating_sub(self.polling.load(SeqCst));
        if wanted == 0 {
            return;
        }
        // Taken and let go before the notify: a thread counted in `parked`
        // took the lock to count itself and holds it until it waits, so
        // once the lock is free it waits (or has seen the job). Notified
        // under the lock, a woken thread would find it held and sleep again.
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        if wanted >= parked {
            self.bell.notify_all();
        } else {
            for _ in 0..wanted {
                self.bell.notify_one();
            }
        }
    }
}

/// A new queue: its sending half (cloned for each sender) and its
/// reading half (cloned for each thread).
pub fn queue<T>() -> (Queue<T>, Taker<T>) {
    let (tx, rx) = unbounded();
    let door = Arc::new(Door::default());
    (
        Queue {
            tx: Some(tx),
            door: door.clone(),
        },
        Taker { rx, door },
    )
}

/// The sending half. Dropping the last one closes the queue: the threads
/// get Next::Closed once it is empty.
pub struct Queue<T> {
    /// Some until dropped: Drop closes the channel before it wakes the
    /// parked threads, so they see it closed.
    tx: Option<Sender<T>>,
    door: Arc<Door>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            tx: self.tx.clone(),
            door: self.door.clone(),
        }
    }
}

impl<T> Queue<T> {
    /// Queues `n` copies of `job` (one per thread that shares it) and wakes
    /// as many parked threads as no poller covers; Err when every reader
    /// is gone.
    pub fn send(&self, job: T, n: usize) -> Result<(), T>
    where
        T: Clone,
    {
        let Some(tx) = &self.tx else {
            return Err(job);
        };
        for _ in 1..n {
            tx.send(job.clone()).map_err(|e| e.0)?;
        }
        tx.send(job).map_err(|e| e.0)?;
        self.door.ring(|| tx.len());
        Ok(())
    }
}

impl<T> Drop for Queue<T> {
    fn drop(&mut self) {
        drop(self.tx.take());
        drop(self.door.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.door.bell.notify_all();
    }
}

/// The reading half, one per thread.
pub struct Taker<T> {
    rx: Receiver<T>,
    door: Arc<Door>,
}

impl<T> Clone for Taker<T> {
    fn clone(&self) -> Self {
        Taker {
            rx: self.rx.clone(),
            door: self.door.clone(),
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

/// The longest a thread that ran out of jobs polls before it parks. When
/// tasks come back to back (one caller pushing in a loop), the next one
/// arrives within microseconds: polling saves the futex wake-up on both
/// sides, which `make bench` measured at 1.6x the round trips per second at
/// concurrency 1.
const SPIN: Duration = Duration::from_micros(50);
const SPIN_NS: u64 = SPIN.as_nanos() as u64;

/// How long a thread that handled large payloads waits for the next job
/// before it gives their memory back: long enough that a steady stream of
/// large tasks keeps reusing it (fresh pages cost more than the copies).
pub const IDLE: Duration = Duration::from_secs(1);

impl<T> Taker<T> {
    /// The next job; with `idle_after`, Idle once no job came for IDLE.
    pub fn next(&self, idle_after: bool, spin: &mut Spin) -> Next<T> {
        match self.rx.try_recv() {
            Ok(job) => return Next::Job(job),
            Err(TryRecvError::Disconnected) => return Next::Closed,
            Err(TryRecvError::Empty) => {}
        }
        let start = Instant::now();
        let next = (self.poll(spin.budget(), start)).unwrap_or_else(|| {
            let deadline = idle_after.then(|| start + IDLE);
            self.park(deadline)
        });
        spin.observe(start.elapsed());
        if matches!(next, Next::Job(_)) {
            self.hand_on();
        }
        next
    }

    /// A sender counted this thread as polling or parked after it had
    /// already taken another job: rings for whatever is still queued, so a
    /// job shared by several threads (a batch) does not wait for this one.
    fn hand_on(&self) {
        self.door.ring(|| self.rx.len());
    }

    /// Polls until `budget` has passed since `start`; None if nothing came.
    fn poll(&self, budget: Duration, start: Instant) -> Option<Next<T>> {
        self.door.polling.fetch_add(1, SeqCst);
        fence(SeqCst);
        let next = loop {
            match self.rx.try_recv() {
                Ok(job) => break Some(Next::Job(job)),
                Err(TryRecvError::Disconnected) => break Some(Next::Closed),
                Err(TryRecvError::Empty) if start.elapsed() < budget => std::hint::spin_loop(),
                Err(TryRecvError::Empty) => break None,
            }
        };
        self.door.polling.fetch_sub(1, SeqCst);
        next
    }

    /// Waits on the bell until a job comes, the queue closes or `deadline`
    /// passes (Idle).
    fn park(&self, deadline: Option<Instant>) -> Next<T> {
        let door = &*self.door;
        let mut held = door.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            door.parked.fetch_add(1, SeqCst);
            fence(SeqCst);
            let looked = self.rx.try_recv();
            let next = match looked {
                Ok(job) => Some(Next::Job(job)),
                Err(TryRecvError::Disconnected) => Some(Next::Closed),
                Err(TryRecvError::Empty) => None,
            };
            if let Some(next) = next {
                door.parked.fetch_sub(1, SeqCst);
                return next;
            }
            held = match deadline {
                None => door.bell.wait(held).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    let (held, _) = door
                        .bell
                        .wait_timeout(held, left)
                        .unwrap_or_else(|e| e.into_inner());
                    held
                }
            };
            door.parked.fetch_sub(1, SeqCst);
            if deadline.is_some_and(|d| Instant::now() >= d) && self.rx.is_empty() {
                return Next::Idle;
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
            wait_ns: SPIN_NS / 4,
        }
    }
}

impl Spin {
    fn budget(&self) -> Duration {
        if self.wait_ns >= SPIN_NS {
            return Duration::ZERO;
        }
        Duration::from_nanos((4 * self.wait_ns).min(SPIN_NS))
    }

    fn observe(&mut self, waited: Duration) {
        // At most twice SPIN: one slow wake-up (tens to hundreds of
        // microseconds on a busy or virtual machine) must not end the
        // polling of jobs that come every few tens of microseconds; only
        // waits that stay long do.
        let w = u64::try_from(waited.as_nanos()).map_or(2 * SPIN_NS, |w| w.min(2 * SPIN_NS));
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

    /// Bursts of jobs with gaps of every length, readers that poll or
    /// not; after each burst the sender waits until it is all taken: a
    /// lost wake-up leaves a job in the queue with every reader parked (no
    /// reader waits with a timeout). Closing wakes every reader.
    #[test]
    fn no_job_is_left_behind() {
        for readers in [1, 3] {
            burst_and_wait(readers);
        }
    }

    fn burst_and_wait(readers: usize) {
        const BURSTS: u64 = 30_000;
        let (q, t) = queue::<u64>();
        let taken = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..readers)
            .map(|r| {
                let (t, taken) = (t.clone(), taken.clone());
                std::thread::spawn(move || {
                    let mut spin = Spin::default();
                    loop {
                        if r == 2 {
                            // one reader of three never polls
                            spin.wait_ns = SPIN_NS;
                        }
                        match t.next(false, &mut spin) {
                            Next::Job(n) => {
                                taken.fetch_add(n, SeqCst);
                            }
                            Next::Idle => unreachable!(),
                            Next::Closed => return,
                        }
                    }
                })
            })
            .collect();
        drop(t);
        let mut sent = 0;
        for i in 0..BURSTS {
            let burst = 1 + i % 4;
            q.send(1, burst as usize).unwrap();
            sent += burst;
            let deadline = Instant::now() + Duration::from_secs(5);
            while taken.load(SeqCst) < sent {
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

    /// A job shared by two threads (a batch of two tasks) runs on both at
    /// once, whether they polled or parked when it came: each copy's taker
    /// waits for the other copy to be taken. Left queued behind its twin,
    /// the second copy is taken only after the first one's wait timed out.
    #[test]
    fn a_shared_job_reaches_both_threads() {
        const ROUNDS: u64 = 20_000;
        const PATIENCE: Duration = Duration::from_millis(200);
        let (q, t) = queue::<u64>();
        let taken = Arc::new(AtomicU64::new(0));
        let alone = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (t, taken, alone) = (t.clone(), taken.clone(), alone.clone());
                std::thread::spawn(move || {
                    let mut spin = Spin::default();
                    while let Next::Job(round) = t.next(false, &mut spin) {
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
            q.send(round, 2).unwrap();
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
}

//! A task's streams (`push_stream`): the chunks its handler sends, on
//! their way from the pool thread to the event loop, and the chunks its
//! caller writes, the other way; at most `bound` of them unread each way.
//!
//! The handler's thread appends a chunk under the lock and, when the
//! queue is full, waits on `space` until the reader takes one or lets go
//! of the stream: a producer faster than its reader waits in its own
//! thread and never piles chunks up. The event loop never waits here: a
//! read takes a chunk or, finding none, marks that it wants one (`want`)
//! and waits on its record's semaphore; the next chunk then sends the
//! record's id on the worker's ready channel and wakes the event loop
//! (handoff/notify.rs), which posts that semaphore (worker/tasks.rs). The
//! handler's results come back as any task's do, after its last chunk:
//! a read takes the chunks first, so they always come before the results.
//!
//! Input mirrors it: the caller's write appends while fewer than `bound`
//! are unread, else marks that it waits for room (`writer_waits`) and waits
//! on the same semaphore (one coroutine reads and writes, one at a time),
//! or fails at once if asked not to wait; the handler's receive waits on
//! `data` in its thread, and the take that makes room for a waiting
//! writer sends the record's id on `ready` as a chunk does for a reader.

use crate::handoff::payload::Payload;
use crossbeam_channel::Sender;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// What a handler's send gets once the stream's caller let go of it
/// (timeout, close, request gone).
pub const CANCELLED: &str = "cancelled";

/// What a send or receive outside a stream's handler raises: the handler
/// crate's text too.
pub use ngx_threadpool_wire::NO_STREAM;

pub struct Stream {
    /// The record on the event loop, sent on `ready`.
    task: u64,
    /// The most unread chunks.
    bound: usize,
    queue: Mutex<Queue>,
    /// Signalled when a chunk is taken or the stream is closed.
    space: Condvar,
    /// Signalled when the caller writes, ends its input or lets go.
    data: Condvar,
    /// The worker's channel of streams with a chunk for a waiting reader.
    ready: Sender<u64>,
    /// How long sends waited for room, in µs (the pool's counter takes it
    /// when the record is freed).
    waited_us: AtomicU64,
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Payload>,
    /// The reader waits for the next chunk.
    want: bool,
    /// The reader let go: sends fail, nothing is kept.
    closed: bool,
    /// The caller's chunks the handler has not received.
    input: VecDeque<Payload>,
    /// The caller waits for room to write.
    writer_waits: bool,
    /// The caller wrote its last chunk (close_write).
    input_ended: bool,
    /// Copies of what crossed, for a shadow to run and compare again
    /// (thread/shadow.rs); None unless the stream was sampled.
    recorded: Option<Recorded>,
}

/// The chunks that crossed a stream, each way, as encoded (no spans).
#[derive(Default)]
pub struct Recorded {
    pub sent: Vec<Vec<u8>>,
    pub received: Vec<Vec<u8>>,
}

/// What a write finds.
pub enum Written {
    Done,
    /// `bound` chunks unread: the chunk is handed back, and the writer is
    /// marked as waiting for room when it said it would wait.
    Full(Payload),
    /// The input was ended, or the stream let go of.
    Ended,
}

/// What a read finds.
pub enum Taken {
    Chunk(Payload),
    /// No chunk: the reader is marked as waiting for one.
    Empty,
}

/// A send that could not be made: the stream's reader let go of it.
#[derive(Debug)]
pub struct Closed;

impl Stream {
    pub fn new(task: u64, bound: usize, ready: Sender<u64>) -> Stream {
        Stream {
            task,
            bound: bound.max(1),
            queue: Mutex::default(),
            space: Condvar::new(),
            data: Condvar::new(),
            ready,
            waited_us: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Plain data: a thread that panicked holding the lock left it whole.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a chunk, waiting while `bound` chunks are unread (pool
    /// thread), or Closed at once when the reader let go (the chunk is
    /// dropped).
    pub fn send(&self, chunk: Payload, wake: impl FnOnce()) -> Result<(), Closed> {
        let mut q = self.lock();
        if !q.closed && q.chunks.len() >= self.bound {
            let since = Instant::now();
            while !q.closed && q.chunks.len() >= self.bound {
                q = self.space.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
            let us = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.waited_us.fetch_add(us, Ordering::Relaxed);
        }
        if q.closed {
            return Err(Closed);
        }
        if let Some(r) = &mut q.recorded {
            r.sent.push(chunk.bytes.clone());
        }
        q.chunks.push_back(chunk);
        let want = std::mem::take(&mut q.want);
        drop(q);
        if want && self.ready.send(self.task).is_ok() {
            wake();
        }
        Ok(())
    }

    /// How long its sends waited for room so far, in µs.
    pub fn waited_us(&self) -> u64 {
        self.waited_us.load(Ordering::Relaxed)
    }

    /// The next chunk, or Empty with the reader marked as waiting (event
    /// loop; never blocks: the lock is only held for a push or a pop).
    pub fn take(&self) -> Taken {
        let mut q = self.lock();
        match q.chunks.pop_front() {
            Some(chunk) => {
                q.want = false;
                drop(q);
                self.space.notify_one();
                Taken::Chunk(chunk)
            }
            None => {
                q.want = true;
                Taken::Empty
            }
        }
    }

    /// The reader lets go: a waiting send or receive returns Closed, and
    /// so does every later one; unread chunks are dropped.
    pub fn close(&self) {
        let dropped = {
            let mut q = self.lock();
            q.closed = true;
            (std::mem::take(&mut q.chunks), std::mem::take(&mut q.input))
        };
        self.space.notify_all();
        self.data.notify_all();
        drop(dropped);
    }

    /// Appends a caller's chunk for the handler (event loop; never
    /// blocks): Full when `bound` are unread, the writer then marked as
    /// waiting for room if `wait`.
    pub fn write(&self, chunk: Payload, wait: bool) -> Written {
        let mut q = self.lock();
        if q.closed || q.input_ended {
            return Written::Ended;
        }
        if q.input.len() >= self.bound {
            q.writer_waits = wait;
            return Written::Full(chunk);
        }
        q.input.push_back(chunk);
        drop(q);
        self.data.notify_one();
        Written::Done
    }

    /// The caller wrote its last chunk: the handler's receive gives the
    /// end of input once it took the chunks before.
    pub fn end_input(&self) {
        self.lock().input_ended = true;
        self.data.notify_all();
    }

    /// The caller's next chunk, None at the end of its input, waiting for
    /// it (pool thread): Closed at once when the caller let go.
    pub fn receive(&self, wake: impl FnOnce()) -> Result<Option<Payload>, Closed> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return Err(Closed);
            }
            if let Some(chunk) = q.input.pop_front() {
                if let Some(r) = &mut q.recorded {
                    r.received.push(chunk.bytes.clone());
                }
                let writer = std::mem::take(&mut q.writer_waits);
                drop(q);
                if writer && self.ready.send(self.task).is_ok() {
                    wake();
                }
                return Ok(Some(chunk));
            }
            if q.input_ended {
                return Ok(None);
            }
            q = self.data.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// A stream that no one reads, whose input is `input` and ended: the
    /// one a shadow runs the handler with; its sends never wait.
    pub fn detached(input: Vec<Vec<u8>>) -> Stream {
        let (ready, _) = crossbeam_channel::bounded(0);
        let s = Stream::new(0, usize::MAX, ready);
        {
            let mut q = s.lock();
            q.input = input
                .into_iter()
                .map(|bytes| Payload {
                    bytes,
                    ..Payload::default()
                })
                .collect();
            q.input_ended = true;
        }
        s
    }

    /// Keeps copies of the chunks from now on (pool thread, before the
    /// handler runs).
    pub fn record(&self) {
        self.lock().recorded = Some(Recorded::default());
    }

    /// The copies kept since `record`.
    pub fn take_recorded(&self) -> Option<Recorded> {
        self.lock().recorded.take()
    }

    /// The chunks sent and not read (a detached stream's: all of them).
    pub fn take_chunks(&self) -> Vec<Payload> {
        self.lock().chunks.drain(..).collect()
    }
}

thread_local! {
    /// The stream of the task this thread runs (null between tasks, for a
    /// task pushed without one, and on the event loop). Points into the
    /// task's Work, which the thread holds while the mark is set.
    static SERVING: Cell<*const Stream> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` (one task's handler) with `stream` as the stream this thread's
/// sends go to; the mark is cleared when `f` returns or unwinds.
pub fn serving<R>(stream: Option<&Stream>, f: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            SERVING.set(std::ptr::null());
        }
    }
    SERVING.set(stream.map_or(std::ptr::null(), |s| s));
    let _clear = Clear;
    f()
}

/// Runs `f` with the stream of the task this thread runs, if any.
pub fn with_serving<R>(f: impl FnOnce(Option<&Stream>) -> R) -> R {
    let s = SERVING.get();
    // SAFETY: a non-null mark points to the stream of the task this thread
    // runs, whose Work the thread holds until `serving` clears the mark.
    f(unsafe { s.as_ref() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::unbounded;
    use std::sync::Arc;
    use std::time::Duration;

    fn chunk(b: u8) -> Payload {
        Payload {
            bytes: vec![b],
            ..Payload::default()
        }
    }

    /// A full stream holds its producer until a chunk is read; the reader
    /// hears of the next chunk once it said it wants one; chunks keep
    /// their order.
    #[test]
    fn bound_order_and_wake() {
        let (tx, rx) = unbounded();
        let s = Arc::new(Stream::new(7, 2, tx));
        assert!(matches!(s.take(), Taken::Empty));
        s.send(chunk(1), || {}).expect("room");
        assert_eq!(rx.try_recv().ok(), Some(7), "the reader wanted one");
        s.send(chunk(2), || {}).expect("room");
        assert!(rx.try_recv().is_err(), "nobody waits");
        let producer = {
            let s = s.clone();
            std::thread::spawn(move || s.send(chunk(3), || {}).map(|_| ()))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!producer.is_finished(), "full: the producer waits");
        let mut got = Vec::new();
        while got.len() < 3 {
            if let Taken::Chunk(p) = s.take() {
                got.push(p.bytes[0]);
            }
        }
        assert!(producer.join().expect("producer").is_ok());
        assert_eq!(got, [1, 2, 3]);
    }

    /// Input: the bound holds the writer back, a receive makes room and
    /// tells a waiting writer, the end of input comes after the chunks.
    #[test]
    fn input_bound_and_end() {
        let (tx, rx) = unbounded();
        let s = Arc::new(Stream::new(3, 2, tx));
        assert!(matches!(s.write(chunk(1), true), Written::Done));
        assert!(matches!(s.write(chunk(2), true), Written::Done));
        assert!(matches!(s.write(chunk(3), false), Written::Full(_)));
        assert!(rx.try_recv().is_err());
        assert!(matches!(s.write(chunk(3), true), Written::Full(_)));
        let got = s.receive(|| {}).expect("open").expect("a chunk");
        assert_eq!(got.bytes, [1]);
        assert_eq!(rx.try_recv().ok(), Some(3), "the writer waited");
        assert!(matches!(s.write(chunk(3), true), Written::Done));
        s.end_input();
        assert!(matches!(s.write(chunk(4), true), Written::Ended));
        let rest: Vec<u8> = std::iter::from_fn(|| s.receive(|| {}).expect("open"))
            .map(|p| p.bytes[0])
            .collect();
        assert_eq!(rest, [2, 3]);
    }

    /// Closing releases a waiting producer at once, and every later send
    /// fails.
    #[test]
    fn close_releases_the_producer() {
        let (tx, _rx) = unbounded();
        let s = Arc::new(Stream::new(1, 1, tx));
        s.send(chunk(1), || {}).expect("room");
        let producer = {
            let s = s.clone();
            std::thread::spawn(move || s.send(chunk(2), || {}).is_err())
        };
        std::thread::sleep(Duration::from_millis(20));
        let consumer = {
            let s = s.clone();
            std::thread::spawn(move || s.receive(|| {}).is_err())
        };
        std::thread::sleep(Duration::from_millis(20));
        s.close();
        assert!(producer.join().expect("producer"), "closed");
        assert!(consumer.join().expect("consumer"), "closed");
        assert!(s.send(chunk(3), || {}).is_err());
    }
}

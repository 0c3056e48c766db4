//! A pool's latest update (docs/updates.md), in a shared memory zone of
//! the pool's own that reloads keep: its version, its arguments (encoded
//! as a task's), the handler code it set if any, and when and where it
//! was made. The event loops of every worker write it, then wake every
//! worker's update thread (thread/updates.rs) through one word of a zone
//! of its own, which reads it and hands it to the pool's threads.
//!
//! Writers take the zone's lock, a pid: a worker killed holding it is
//! seen dead and its lock taken over. Readers never lock: a sequence
//! number, odd while a writer is at work, tells them to read again, so
//! that no event loop ever waits for a pool thread.

use crate::ngx::os;
use crate::ngx::shm::{read_words, write_words, Zone, WORD};
use crate::ngx::sys;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The start of the zone's block.
#[repr(C)]
struct Header {
    /// The pid of the writer at work, 0 when none.
    lock: AtomicU64,
    /// Odd while a writer changes what follows.
    seq: AtomicU64,
    /// The latest update's; 0 before the first.
    version: AtomicU64,
    /// The update of the code in the data; 0: the configuration's.
    code_version: AtomicU64,
    code_len: AtomicU64,
    args_len: AtomicU64,
    /// When the latest update was called (the time of day, µs).
    called_at_us: AtomicU64,
    /// The worker that made it.
    source: AtomicU64,
}

/// The word every worker's update thread waits on (a futex is 32 bits),
/// changed after each update of any pool; in a zone of its own, which
/// reloads keep, so that the workers of two configurations share it.
#[derive(Clone, Copy)]
pub struct Wake(Zone);

impl Wake {
    /// Adds the zone.
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed (postconfiguration).
    pub unsafe fn add(cf: *mut sys::ngx_conf_t) -> Option<Wake> {
        // SAFETY: cf is the configuration being parsed (the contract).
        unsafe { Zone::add_kept(cf, "ngx_threadpool_updates", WORD) }.map(Wake)
    }

    /// The word, once nginx has made the zone.
    pub fn word(&self) -> Option<&'static AtomicU32> {
        // SAFETY: the zone was added with room for 8 bytes; an AtomicU32,
        // valid when zero, at its start.
        unsafe { self.0.as_slice::<AtomicU32>(0, 1)?.first() }
    }

    /// Changes the word and wakes every thread waiting on it.
    pub fn wake(&self) {
        if let Some(word) = self.word() {
            word.fetch_add(1, Ordering::Release);
            os::futex_wake(word);
        }
    }
}

/// An update as a pool thread applies it.
pub struct Update {
    pub version: u64,
    /// The handler code it runs (a Lua pool's process chunk), and the
    /// update that set it; None: the configuration's.
    pub code: Option<Code>,
    /// Its arguments, encoded as a task's.
    pub args: Vec<u8>,
    pub called_at_us: u64,
    pub source: u64,
}

/// Handler code an update set: shared by the update that set it and
/// those after it.
#[derive(Clone)]
pub struct Code {
    pub version: u64,
    pub code: Arc<[u8]>,
}

/// Why an update was not made.
#[derive(Debug, PartialEq, Eq)]
pub enum PublishError {
    /// Its code and arguments need `needed` bytes; the zone holds `room`.
    TooLarge { needed: usize, room: usize },
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            PublishError::TooLarge { needed, room } => write!(
                f,
                "update too large: {needed} bytes, thread_pool_update_size allows {room}"
            ),
        }
    }
}

/// A pool's update zone.
#[derive(Clone, Copy)]
pub struct UpdateZone {
    zone: Zone,
    /// The bytes of code and arguments it holds.
    room: usize,
    /// Where its updates wake the update threads.
    pub wake: Wake,
}

impl UpdateZone {
    /// Adds pool `pool`'s zone, with room for `room` bytes of code and
    /// arguments, kept across reloads while its size stays; its updates
    /// `wake` the update threads.
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed (postconfiguration).
    pub unsafe fn add(
        cf: *mut sys::ngx_conf_t,
        pool: &str,
        room: usize,
        wake: Wake,
    ) -> Option<UpdateZone> {
        let room = room.next_multiple_of(WORD);
        let name = format!("ngx_threadpool_update:{pool}");
        // SAFETY: cf is the configuration being parsed (the contract).
        let zone = unsafe { Zone::add_kept(cf, &name, size_of::<Header>() + room) }?;
        Some(UpdateZone { zone, room, wake })
    }

    /// The header and the data words, once nginx has made the zone.
    fn parts(&self) -> Option<(&'static Header, &'static [AtomicU64])> {
        // SAFETY: the zone was added with room for a Header and `room`
        // bytes after it, at 8-byte aligned offsets; both are atomics,
        // valid when zero.
        unsafe {
            let header = self.zone.as_slice::<Header>(0, 1)?.first()?;
            let data = self
                .zone
                .as_slice::<AtomicU64>(size_of::<Header>(), self.room / WORD)?;
            Some((header, data))
        }
    }

    /// The latest update's version (0: none yet).
    pub fn version(&self) -> u64 {
        self.parts()
            .map_or(0, |(h, _)| h.version.load(Ordering::Acquire))
    }

    /// Makes the next update, from worker `source`: `args` (encoded) and,
    /// if given, new handler `code` (otherwise the latest code stays).
    /// Its version. Waits only for another event loop's copy, never for
    /// a pool thread.
    pub fn publish(
        &self,
        code: Option<&[u8]>,
        args: &[u8],
        source: usize,
    ) -> Result<u64, PublishError> {
        let Some((h, data)) = self.parts() else {
            return Err(PublishError::TooLarge {
                needed: args.len(),
                room: 0,
            });
        };
        let _lock = Lock::take(&h.lock);
        let kept_code = h.code_len.load(Ordering::Relaxed) as usize;
        let code_len = code.map_or(kept_code, <[u8]>::len);
        let needed = code_len.next_multiple_of(WORD) + args.len();
        if needed > self.room {
            return Err(PublishError::TooLarge {
                needed,
                room: self.room,
            });
        }
        // Odd: readers see a change under way (a writer killed midway
        // left it odd; this write ends even again either way).
        let seq = h.seq.load(Ordering::Relaxed) | 1;
        h.seq.store(seq, Ordering::Relaxed);
        fence(Ordering::Release);
        let version = h.version.load(Ordering::Relaxed) + 1;
        if let Some(code) = code {
            write_words(data, 0, code);
            h.code_len.store(code.len() as u64, Ordering::Relaxed);
            h.code_version.store(version, Ordering::Relaxed);
        }
        write_words(data, code_len.next_multiple_of(WORD), args);
        h.args_len.store(args.len() as u64, Ordering::Relaxed);
        h.called_at_us.store(os::wall_clock_us(), Ordering::Relaxed);
        h.source.store(source as u64, Ordering::Relaxed);
        h.version.store(version, Ordering::Relaxed);
        h.seq.store(seq + 1, Ordering::Release);
        self.wake.wake();
        Ok(version)
    }

    /// The latest update, if there has been one; `code` is the code a
    /// reader already holds, reused when the update did not change it.
    /// None too while writers keep changing it (the reader tries again
    /// at the next wake-up).
    pub fn read(&self, code: Option<&Code>) -> Option<Update> {
        let (h, data) = self.parts()?;
        for _ in 0..READ_TRIES {
            let seq = h.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                std::thread::yield_now();
                continue;
            }
            let version = h.version.load(Ordering::Relaxed);
            if version == 0 {
                return None;
            }
            let code_version = h.code_version.load(Ordering::Relaxed);
            let code_len = (h.code_len.load(Ordering::Relaxed) as usize).min(self.room);
            let args_len = h.args_len.load(Ordering::Relaxed) as usize;
            let at = code_len.next_multiple_of(WORD);
            let code = match code {
                _ if code_version == 0 => None,
                Some(c) if c.version == code_version => Some(c.clone()),
                _ => Some(Code {
                    version: code_version,
                    code: read_words(data, 0, code_len).into(),
                }),
            };
            let args = read_words(data, at, args_len.min(self.room - at));
            let update = Update {
                version,
                code,
                args,
                called_at_us: h.called_at_us.load(Ordering::Relaxed),
                source: h.source.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if h.seq.load(Ordering::Relaxed) == seq {
                return Some(update);
            }
        }
        None
    }
}

/// How often a reader tries while writers are at work.
const READ_TRIES: usize = 100;

/// The zone's lock, held by this process (its pid) until dropped.
struct Lock(&'static AtomicU64);

impl Lock {
    /// Takes the lock, from a holder that no longer exists if need be.
    fn take(lock: &'static AtomicU64) -> Lock {
        let me = std::process::id() as u64;
        loop {
            match lock.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Lock(lock),
                Err(holder) if holder != me && !os::alive(holder as i32) => {
                    if lock
                        .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Lock(lock);
                    }
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

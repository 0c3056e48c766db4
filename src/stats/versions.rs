//! The update versions of every worker's pool threads, and each worker's
//! latest update error, in the status table (status_table.rs): what
//! `stats()`, `thread_pool_status` and an update's caller waiting for
//! every thread read (docs/updates.md).

use crate::ngx::shm::{read_words, write_words, WORD};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// A pool thread's place in the update versions.
#[repr(C)]
#[derive(Default)]
pub struct ThreadVersion {
    /// The version it runs (0: the configuration's).
    pub applied: AtomicU64,
    /// The latest version it failed to apply (it kept `applied`).
    pub failed: AtomicU64,
}

/// The bytes of an update error kept for its caller.
const ERROR_WORDS: usize = 32;

/// The first error of a worker's pool threads with the latest update they
/// failed.
#[repr(C)]
#[derive(Default)]
pub struct UpdateError {
    /// Odd while a thread writes it.
    seq: AtomicU64,
    version: AtomicU64,
    len: AtomicU64,
    text: [AtomicU64; ERROR_WORDS],
}

impl UpdateError {
    /// Keeps `text` as update `version`'s error, unless a thread keeps one
    /// for it (or a later one) already, or is writing one.
    pub fn set(&self, version: u64, text: &str) {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || self.version.load(Ordering::Relaxed) >= version
            || self
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let mut bytes = text.as_bytes();
        if bytes.len() > ERROR_WORDS * WORD {
            // at a character's start
            let end = (0..=ERROR_WORDS * WORD)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            bytes = &bytes[..end];
        }
        write_words(&self.text, 0, bytes);
        self.len.store(bytes.len() as u64, Ordering::Relaxed);
        self.version.store(version, Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// The error kept, with its version, if it is of `version` or later.
    pub fn get(&self, version: u64) -> Option<(u64, String)> {
        let seq = self.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let v = self.version.load(Ordering::Relaxed);
        let len = (self.len.load(Ordering::Relaxed) as usize).min(ERROR_WORDS * WORD);
        let bytes = read_words(&self.text, 0, len);
        fence(Ordering::Acquire);
        (v >= version && v > 0 && self.seq.load(Ordering::Relaxed) == seq)
            .then(|| (v, String::from_utf8_lossy(&bytes).into_owned()))
    }
}

/// The threads of a pool in every worker that an update reached: those
/// at its version or later, and those that failed it.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Reached {
    pub applied: usize,
    pub failed: usize,
    pub threads: usize,
}

impl Reached {
    /// Counts `threads` for `version`.
    pub fn add(&mut self, threads: &[ThreadVersion], version: u64) {
        for t in threads {
            self.threads += 1;
            if t.applied.load(Ordering::Relaxed) >= version {
                self.applied += 1;
            } else if t.failed.load(Ordering::Relaxed) >= version {
                self.failed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_kept_once_per_version_and_cut_at_a_character() {
        let e = UpdateError::default();
        assert_eq!(e.get(1), None);
        e.set(2, "first");
        e.set(2, "second");
        assert_eq!(e.get(1), Some((2, "first".into())));
        assert_eq!(e.get(3), None);
        let long = "é".repeat(200);
        e.set(3, &long);
        let (_, kept) = e.get(3).unwrap();
        assert!(long.starts_with(&kept) && kept.len() <= ERROR_WORDS * WORD);
    }
}

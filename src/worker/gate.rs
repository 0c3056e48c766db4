//! The accept gate: a worker whose pools hold too many outstanding tasks
//! stops accepting new connections on the shared listening sockets, so the
//! kernel hands them to the other workers, and accepts again once it has
//! caught up.
//!
//! A worker's load is its pushed tasks queued or running (until their
//! completion is drained, so a task whose caller timed out or went away
//! still counts while a thread runs it; a posted task sends no completion
//! to count it out, so it does not count) plus the connections it
//! accepted that have not pushed a task yet (until their first push, their
//! first request's log phase, or their close): a burst of accepts counts
//! before its tasks arrive.
//!
//! A worker pauses when its load reaches the high mark and another worker
//! that accepts carries clearly less (SLACK); it resumes at the low mark or
//! when no accepting worker carries less than it does. So when every worker
//! is over the mark, they all accept and nginx's own balance applies, and a
//! burst of connections spreads over the workers instead of piling onto
//! the last one accepting. Two workers deciding at once could still both
//! pause: a count of paused workers in shared memory makes sure the last
//! accepting worker never does.
//!
//! Each change only posts a check (ngx/accept.rs `defer`), which runs once
//! per event-loop iteration.

use crate::ngx::accept::{self, now_ms, Nudge};
use crate::ngx::log;
use crate::stats::gate::{GateShared, GateSlot};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};

/// How often a paused worker looks at the other workers' loads, when its
/// own events do not make it look: when they fill up during a burst of
/// connections, it takes its share again.
const PAUSED_CHECK_MS: u64 = 5;

/// How much more than the least loaded other worker a worker must carry
/// before it pauses: ties and off-by-one differences do not toggle.
const SLACK: usize = 2;

/// The accept gate's marks, resolved from the directive and the threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Marks {
    pub high: usize,
    pub low: usize,
}

impl Marks {
    /// Defaults from the worker's pool threads: pause once a new task would
    /// wait for a whole round of every thread, resume when the queue is
    /// empty again.
    pub fn resolve(high: Option<usize>, low: Option<usize>, threads: usize) -> Marks {
        let high = high.unwrap_or(2 * threads.max(1));
        let low = low.unwrap_or(threads.max(1)).min(high.saturating_sub(1));
        Marks { high, low }
    }
}

struct Gate {
    marks: Marks,
    shared: &'static GateShared,
    slots: &'static [GateSlot],
    me: usize,
    /// Workers that may take part (the master's worker_processes).
    workers: usize,
    tasks: usize,
    pending: HashSet<u64>,
    paused: bool,
    nudge: Option<&'static Nudge>,
    /// The load at the last nudge (0: none since the load was low).
    nudged_at: usize,
}

thread_local! {
    static GATE: RefCell<Option<Gate>> = const { RefCell::new(None) };
}

fn with_gate(f: impl FnOnce(&mut Gate)) {
    GATE.with(|g| {
        if let Ok(mut g) = g.try_borrow_mut() {
            if let Some(g) = g.as_mut() {
                f(g)
            }
        }
    })
}

/// Starts the gate in this worker (init_process). `workers` is how many
/// workers the master runs; `me` this one's slot.
pub fn start(
    marks: Marks,
    shared: &'static GateShared,
    slots: &'static [GateSlot],
    me: usize,
    workers: usize,
    nudge: Option<&'static Nudge>,
) {
    if accept::accept_mutex_on() {
        log::message(
            log::NGX_LOG_WARN,
            format_args!("thread_pool_accept_gate is off: accept_mutex pauses accept itself"),
        );
        return;
    }
    let Some(slot) = slots.get(me) else {
        return;
    };
    // A predecessor in this slot that died while paused.
    if slot.paused.swap(0, SeqCst) != 0 {
        shared.paused_workers.fetch_sub(1, SeqCst);
    }
    for c in [&slot.pauses, &slot.paused_ms, &slot.load, &slot.accepted] {
        c.store(0, Relaxed);
    }
    let shared_sockets = accept::install(accept::Hooks {
        accepted,
        done,
        check,
    });
    if shared_sockets == 0 {
        log::message(
            log::NGX_LOG_NOTICE,
            format_args!(
                "accept gate: no shared http listening socket (reuseport only), nothing to pause"
            ),
        );
        return;
    }
    slot.active.store(1, SeqCst);
    GATE.with(|g| {
        *g.borrow_mut() = Some(Gate {
            marks,
            shared,
            slots,
            me,
            workers: workers.min(slots.len()),
            tasks: 0,
            pending: HashSet::new(),
            paused: false,
            nudge: nudge.filter(|n| n.watch()),
            nudged_at: 0,
        })
    });
    log::message(
        log::NGX_LOG_NOTICE,
        format_args!(
            "accept gate: pause at {} outstanding tasks, resume at {}; shared listening \
             sockets: {shared_sockets}",
            marks.high, marks.low
        ),
    );
}

/// Ends the gate at worker exit: a paused worker no longer counts.
pub fn stop() {
    let gate = GATE.with(|g| g.borrow_mut().take());
    if let Some(mut g) = gate {
        if g.paused {
            g.end_pause();
        }
        g.slots[g.me].active.store(0, SeqCst);
    }
}

pub fn tasks_started(n: usize) {
    with_gate(|g| {
        g.tasks += n;
        accept::defer();
    })
}

pub fn tasks_finished(n: usize) {
    with_gate(|g| {
        g.tasks = g.tasks.saturating_sub(n);
        accept::defer();
    })
}

/// The connection `number` pushed a task: from now on the task counts.
pub fn pushed(number: u64) {
    with_gate(|g| {
        g.pending.remove(&number);
    })
}

fn accepted(number: u64) {
    with_gate(|g| {
        g.pending.insert(number);
        g.slots[g.me].accepted.fetch_add(1, Relaxed);
        accept::defer();
    })
}

fn done(number: u64) {
    with_gate(|g| {
        if g.pending.remove(&number) {
            accept::defer();
        }
    })
}

fn check() {
    with_gate(Gate::check)
}

/// Whether a worker should be paused, given its state and load and the
/// least load of the other workers that accept (None: no other does).
fn should_pause(paused: bool, load: usize, marks: Marks, least_accepting: Option<usize>) -> bool {
    let Some(least) = least_accepting else {
        return false;
    };
    if paused {
        load > marks.low && load > least
    } else {
        load >= marks.high && load >= least + SLACK
    }
}

impl Gate {
    fn check(&mut self) {
        let load = self.tasks + self.pending.len();
        self.slots[self.me].load.store(load as u64, Relaxed);
        let (mut least_accepting, mut least_paused) = (None::<usize>, None::<usize>);
        for (i, s) in self.slots[..self.workers].iter().enumerate() {
            if i == self.me || s.active.load(Relaxed) == 0 {
                continue;
            }
            let l = s.load.load(Relaxed) as usize;
            let least = if s.paused.load(Relaxed) != 0 {
                &mut least_paused
            } else {
                &mut least_accepting
            };
            *least = Some(least.map_or(l, |m| m.min(l)));
        }
        if self.paused {
            if !should_pause(true, load, self.marks, least_accepting) {
                self.end_pause();
                accept::set_shared_accept(true);
                log::debug(format_args!("accept gate: resumed at {load}"));
            }
        } else if should_pause(false, load, self.marks, least_accepting) {
            if !self.pause(load) {
                self.nudge(load);
            }
        } else if least_accepting.is_none() && should_pause(false, load, self.marks, least_paused) {
            // Alone accepting and over the mark, while a paused worker
            // carries less: it should take connections again.
            self.nudge(load);
        } else {
            self.nudged_at = 0;
        }
        if self.paused {
            accept::check_in(PAUSED_CHECK_MS);
        }
    }

    /// Makes the paused workers check now, once per SLACK more load.
    fn nudge(&mut self, load: usize) {
        if load >= self.nudged_at + SLACK {
            if let Some(n) = self.nudge {
                n.send();
            }
            self.nudged_at = load;
        }
    }

    /// Pauses, unless it would leave no worker accepting.
    fn pause(&mut self, load: usize) -> bool {
        let limit = self.workers.saturating_sub(1) as u64;
        let counted = self
            .shared
            .paused_workers
            .fetch_update(SeqCst, SeqCst, |n| (n < limit).then_some(n + 1));
        if counted.is_err() {
            return false;
        }
        accept::set_shared_accept(false);
        self.paused = true;
        let slot = &self.slots[self.me];
        slot.paused_since.store(now_ms(), Relaxed);
        slot.paused.store(1, SeqCst);
        slot.pauses.fetch_add(1, Relaxed);
        log::debug(format_args!("accept gate: paused at {load}"));
        true
    }

    fn end_pause(&mut self) {
        self.paused = false;
        let slot = &self.slots[self.me];
        let since = slot.paused_since.load(Relaxed);
        slot.paused_ms
            .fetch_add(now_ms().saturating_sub(since), Relaxed);
        slot.paused.store(0, SeqCst);
        self.shared.paused_workers.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKS: Marks = Marks { high: 12, low: 6 };

    #[test]
    fn the_only_accepting_worker_never_pauses() {
        assert!(!should_pause(false, 1000, MARKS, None));
        assert!(!should_pause(true, 1000, MARKS, None));
    }

    #[test]
    fn pauses_over_the_high_mark_when_another_carries_less() {
        assert!(!should_pause(false, 11, MARKS, Some(0)));
        assert!(should_pause(false, 12, MARKS, Some(0)));
        assert!(should_pause(false, 12, MARKS, Some(10)));
        // every worker over the mark: accept as nginx would
        assert!(!should_pause(false, 20, MARKS, Some(19)));
    }

    #[test]
    fn resumes_at_the_low_mark_or_when_least_loaded() {
        assert!(should_pause(true, 7, MARKS, Some(0)));
        assert!(!should_pause(true, 6, MARKS, Some(0)));
        assert!(!should_pause(true, 20, MARKS, Some(20)));
        assert!(should_pause(true, 20, MARKS, Some(19)));
    }

    #[test]
    fn default_marks_follow_the_threads() {
        assert_eq!(Marks::resolve(None, None, 6), Marks { high: 12, low: 6 });
        assert_eq!(Marks::resolve(Some(4), None, 6), Marks { high: 4, low: 3 });
        assert_eq!(
            Marks::resolve(Some(30), Some(10), 6),
            Marks { high: 30, low: 10 }
        );
    }
}

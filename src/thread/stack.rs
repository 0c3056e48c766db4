//! A pool thread's stack (`thread_pool_stack_size`): a task that recursed
//! deep through C functions touched pages far below its thread's usual
//! depth; they are given back after it, so that one deep task does not
//! keep its thread's memory grown for good.

use crate::ngx::os;
use std::time::Duration;

/// The depth below the current frame from which touched pages count as a
/// deep task's: the event loop's own stack under Linux's `ulimit -s`,
/// deeper than ordinary C calls (PCRE matching without JIT) go.
const DEEP: usize = 8 << 20;

/// What is kept below the current frame: the next tasks' ordinary depth.
const KEEP: usize = 1 << 20;

/// A task shorter than this cannot have recursed DEEP (thousands of
/// levels through C functions): no system call after it.
const DEEP_TASK: Duration = Duration::from_millis(1);

/// The calling pool thread's stack.
pub struct Stack {
    /// Its lowest address, above the guard page.
    low: usize,
}

impl Stack {
    /// The calling thread's stack, if glibc knows it.
    pub fn own() -> Option<Stack> {
        let (low, _) = os::own_stack()?;
        Some(Stack {
            low: low + os::PAGE,
        })
    }

    /// After a task that ran for `ran`: if it touched the stack DEEP below
    /// this frame, the pages below KEEP go back to the system.
    pub fn after_task(&self, ran: Duration) {
        if ran < DEEP_TASK {
            return;
        }
        let here = 0u8;
        let sp = std::hint::black_box(&here) as *const u8 as usize;
        let Some(deep) = sp.checked_sub(DEEP).filter(|&d| d > self.low) else {
            return;
        };
        if os::resident(deep) {
            let to = (sp - KEEP) & !(os::PAGE - 1);
            os::give_back(self.low, to);
        }
    }
}

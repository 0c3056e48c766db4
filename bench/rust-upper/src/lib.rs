//! make bench's trivial task in a Rust pool (the hand-off section's `tpr`
//! variant):
//!
//!   thread_pool_process_by_rust tpr .../libbench_upper.so;
//!
//! A task is the Lua pool's: `push_task("upper", s)`, `s` upper-cased as
//! bench/lua/bench_tasks.lua's `upper` does (`string.upper`: bytes, ASCII
//! letters only), so that the two pools differ in their handler's kind
//! only. `s` is borrowed (read in place at 16 KiB and above), never checked
//! for UTF-8, as Lua does not check it.

use ngx_threadpool_handler::serde_bytes::{ByteBuf, Bytes};
use ngx_threadpool_handler::{export, Error, Handler, Init, Task};

/// No state: each task stands alone.
struct Upper;

impl Handler for Upper {
    type Output<'t> = ByteBuf;

    fn init(_: &Init) -> Result<Upper, Error> {
        Ok(Upper)
    }

    fn process<'t>(&mut self, task: &Task<'t>) -> Result<ByteBuf, Error> {
        let (name, s): (&str, &Bytes) = task.args()?;
        if name != "upper" {
            return Err(format!("no task {name:?}: only \"upper\"").into());
        }
        Ok(ByteBuf::from(s.to_ascii_uppercase()))
    }
}

export!(Upper);

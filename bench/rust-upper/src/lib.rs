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
use ngx_threadpool_handler::{export, Error, Init, Task};

fn init(_: &Init) -> Result<(), String> {
    Ok(())
}

fn process(_: &mut (), task: &Task) -> Result<ByteBuf, Error> {
    let (name, s): (&str, &Bytes) = task.args()?;
    if name != "upper" {
        return Err(format!("no task {name:?}: only \"upper\"").into());
    }
    Ok(ByteBuf::from(s.to_ascii_uppercase()))
}

export!(init, process);

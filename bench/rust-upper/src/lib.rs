//! make bench's tasks in a Rust pool, the Lua pool's in Rust so that the
//! two pools differ in their handler's kind only:
//!
//!   thread_pool_process_by_rust tpr .../libbench_upper.so;
//!
//! - `push_task("upper", s)`: the hand-off section's trivial task (its
//!   variant `tpr`), `s` upper-cased as bench/lua/bench_tasks.lua's `upper`
//!   does (`string.upper`: bytes, ASCII letters only). `s` is borrowed
//!   (read in place at 16 KiB and above), never checked for UTF-8, as Lua
//!   does not check it.
//! - `"chunks", n, size` and `"one", size`: the streaming
//!   section's, as bench/lua/bench_stream.lua's `task` makes them.

use ngx_threadpool_handler::serde_bytes::{ByteBuf, Bytes};
use ngx_threadpool_handler::{export, Error, Handler, Init, Task};
use serde::Serialize;

/// No state: each task stands alone.
struct Upper;

/// A task's one result: bytes (a Lua string) or a count.
#[derive(Serialize)]
#[serde(untagged)]
enum Output {
    Bytes(ByteBuf),
    Count(u64),
}

impl Handler for Upper {
    type Output<'t> = Output;

    fn init(_: &Init) -> Result<Upper, Error> {
        Ok(Upper)
    }

    fn process<'t>(&mut self, task: &Task<'t>) -> Result<Output, Error> {
        let name: &str = task.arg(1)?;
        match name {
            "upper" => {
                let (_, s): (&str, &Bytes) = task.args()?;
                Ok(Output::Bytes(ByteBuf::from(s.to_ascii_uppercase())))
            }
            "chunks" => {
                let (_, n, size): (&str, u64, usize) = task.args()?;
                // The same piece for every chunk, as the Lua handler does.
                let piece = vec![b'x'; size];
                for _ in 0..n {
                    task.send(Bytes::new(&piece))?;
                }
                Ok(Output::Count(n))
            }
            "one" => {
                let (_, size): (&str, usize) = task.args()?;
                Ok(Output::Bytes(ByteBuf::from(vec![b'x'; size])))
            }
            _ => Err(format!("no task {name:?}: upper, chunks or one").into()),
        }
    }
}

export!(Upper);

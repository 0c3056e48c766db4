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
//! - `"chunks", n, size`, `"one", size`, `"forever", path` and `"input",
//!   path`: the streaming section's, as bench/lua/bench_stream.lua's
//!   `task` does them.

use ngx_threadpool_handler::serde_bytes::{ByteBuf, Bytes};
use ngx_threadpool_handler::{export, Error, Handler, Init, Task};
use serde::de::IgnoredAny;
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
            "forever" => {
                let (_, path): (&str, &str) = task.args()?;
                while task.send("x").is_ok() {}
                note_time(path)
            }
            "input" => {
                let (_, path): (&str, &str) = task.args()?;
                while let Ok(Some(_)) = task.receive::<IgnoredAny>() {}
                note_time(path)
            }
            _ => Err(format!("no task {name:?}: upper, chunks, one, forever or input").into()),
        }
    }
}

/// Writes CLOCK_MONOTONIC, in µs, to the file at `path`: when a handler
/// saw its caller let go, for the event loop to compare with its own.
fn note_time(path: &str) -> Result<Output, Error> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let us = ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3;
    std::fs::write(path, format!("{us:.3}"))?;
    Ok(Output::Count(0))
}

export!(Upper);

//! A handler library (`cargo build --release --example upper` builds
//! `target/release/examples/libupper.so`) that shows the crate's parts;
//! tests/c_abi.rs drives it through the C header.
//!
//! `push_task(s [, n])`: `s` upper-cased, this thread's count of tasks, and
//! whether the task was cancelled; `s` = "panic" panics, "fail" fails,
//! "spin" loops until the caller gives up.

use ngx_threadpool_handler::{export, Error, Init, Task, Values};

struct State {
    pool: String,
    tasks: u64,
}

fn init(init: &Init) -> Result<State, String> {
    if init.config() == Some("refuse") {
        return Err("refused by CONFIG".into());
    }
    log::info!(
        "{} #{} config {:?}",
        init.pool(),
        init.thread(),
        init.config()
    );
    Ok(State {
        pool: init.pool().to_string(),
        tasks: 0,
    })
}

/// The string upper-cased, this thread's tasks, and whether cancelled.
type Upper = Values<(String, u64, bool)>;

fn process(state: &mut State, task: &Task) -> Result<Upper, Error> {
    let (s, _n): (&str, Option<u32>) = task.args()?;
    state.tasks += 1;
    match s {
        "panic" => panic!("asked to, in {}", state.pool),
        "fail" => return Err("asked to fail".into()),
        "spin" => while !task.cancelled() {},
        _ => log::warn!("task {}", state.tasks),
    }
    Ok(Values((s.to_uppercase(), state.tasks, task.cancelled())))
}

export!(init, process);

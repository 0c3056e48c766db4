//! A handler library (`cargo build --release --example upper` builds
//! `target/release/examples/libupper.so`) that shows the crate's parts;
//! tests/c_abi.rs drives it through the C header.
//!
//! `push_task(s [, n])`: `s` upper-cased, this thread's count of tasks, and
//! whether the task was cancelled; `s` = "panic" panics, "fail" fails,
//! "spin" loops until the caller gives up.

use ngx_threadpool_handler::{export, Error, Handler, Init, Task, Values};

struct State {
    pool: String,
    tasks: u64,
}

impl Handler for State {
    /// The string upper-cased, this thread's tasks, and whether cancelled.
    type Output<'t> = Values<(String, u64, bool)>;

    fn init(init: &Init) -> Result<State, Error> {
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

    fn process<'t>(&mut self, task: &Task<'t>) -> Result<Self::Output<'t>, Error> {
        let (s, _n): (&str, Option<u32>) = task.args()?;
        self.tasks += 1;
        match s {
            "panic" => panic!("asked to, in {}", self.pool),
            "fail" => return Err("asked to fail".into()),
            "spin" => while !task.cancelled() {},
            _ => log::warn!("task {}", self.tasks),
        }
        Ok(Values((s.to_uppercase(), self.tasks, task.cancelled())))
    }
}

export!(State);

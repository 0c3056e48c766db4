//! A handler library (`cargo build --release --example upper` builds
//! `target/release/examples/libupper.so`) that shows the crate's parts;
//! tests/c_abi.rs drives it through the C header.
//!
//! `push_task(s [, n])`: `s` upper-cased with the latest update's suffix,
//! this thread's count of tasks, and whether the task was cancelled; `s` =
//! "panic" panics, "fail" fails, "spin" loops until the caller gives up.
//! `update(suffix)` sets the suffix; `update("fail")` fails.

use ngx_threadpool_handler::{export, Error, Handler, Init, Task, Update, Values};

struct State {
    pool: String,
    tasks: u64,
    suffix: String,
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
            suffix: String::new(),
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
        let upper = s.to_uppercase() + &self.suffix;
        Ok(Values((upper, self.tasks, task.cancelled())))
    }

    fn update(&mut self, update: &Update<'_>) -> Result<(), Error> {
        let suffix: &str = update.args()?;
        if suffix == "fail" {
            return Err(format!("update {} refused", update.version()).into());
        }
        log::info!("version {} suffix {suffix}", update.version());
        self.suffix = suffix.to_string();
        Ok(())
    }
}

export!(State);

//! The WAF as a pool handler (the handler crate's `Handler` and `export!`):
//!
//!   thread_pool_process_by_rust waf_rust .../libwaf_rust.so .../waf_rules.lua;
//!
//! CONFIG is the path of the rule file, the one waf.lua `require`s: each
//! pool thread reads and compiles it once. A task is waf.lua's call: one
//! request table in, nil or the list of matched rule ids out; a request
//! that is not a table fails with waf.lua's message.

use ngx_threadpool_handler::{export, Error, Handler, Init, Task};

use crate::{Value, Waf};

impl Handler for Waf {
    /// The matched rule ids, or nil.
    type Output<'t> = Option<Vec<u32>>;

    fn init(init: &Init) -> Result<Waf, Error> {
        let path = init
            .config()
            .ok_or("waf-rust needs the rule file's path as CONFIG")?;
        let waf = Waf::from_file(path).map_err(|e| format!("{path}: {e}"))?;
        log::info!("{} rules from {path}", waf.rules().len());
        Ok(waf)
    }

    fn process<'t>(&mut self, task: &Task<'t>) -> Result<Option<Vec<u32>>, Error> {
        let req: Value = task.arg(1)?;
        Ok(self.scan(&req)?)
    }
}

export!(Waf);

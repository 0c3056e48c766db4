//! The WAF as a pool handler (the handler crate's `export!`):
//!
//!   thread_pool_process_by_rust waf_rust .../libwaf_rust.so .../waf_rules.lua;
//!
//! CONFIG is the path of the rule file, the one waf.lua `require`s: each
//! pool thread reads and compiles it once. A task is waf.lua's call: one
//! request table in, nil or the list of matched rule ids out; a request
//! that is not a table fails with waf.lua's message.

use std::error::Error;

use ngx_threadpool_handler::{export, Init, Task};

use crate::{Value, Waf};

fn init(init: &Init) -> Result<Waf, String> {
    let path = init
        .config()
        .ok_or("waf-rust needs the rule file's path as CONFIG")?;
    let waf = Waf::from_file(path).map_err(|e| format!("{path}: {e}"))?;
    log::info!("{} rules from {path}", waf.rules().len());
    Ok(waf)
}

fn process(waf: &mut Waf, task: &Task<'_>) -> Result<Option<Vec<u32>>, Box<dyn Error>> {
    let req: Value = task.arg(1)?;
    Ok(waf.scan(&req)?)
}

export!(init, process);

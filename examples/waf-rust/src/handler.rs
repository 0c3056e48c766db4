//! The WAF as a pool handler (the handler crate's `Handler` and `export!`):
//!
//!   thread_pool_process_by_rust waf_rust .../libwaf_rust.so .../waf_rules.lua;
//!
//! CONFIG is the path of the rule file, the one waf.lua `require`s: each
//! pool thread reads and compiles it once. A task is waf.lua's call: one
//! request table in, nil or the list of matched rule ids out; a request
//! that is not a table fails with waf.lua's message.
//!
//! An update (`tp.waf_rust:update(extras)`, which waf.lua's pool takes
//! too) is a Lua array of extra rules in the rule file's shape; they
//! follow the file's rules, in place of the previous update's. A bad one
//! fails the update, naming its id, and the thread keeps its rules.

use ngx_threadpool_handler::{export, Error, Handler, Init, Task, Update};

use crate::{RuleList, Value, Waf};

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

    fn update(&mut self, update: &Update<'_>) -> Result<(), Error> {
        // a tuple, so that a refused list is argument #1's error
        let (RuleList(extras),) = update.args()?;
        let n = extras.len();
        self.set_extras(extras)?;
        log::info!("version {}: {n} extra rules", update.version());
        Ok(())
    }
}

export!(Waf);

#[cfg(test)]
mod tests {
    //! The exports, called as the module calls them: a thread's state
    //! built from a rule file, updated, and scanning.

    use super::{
        ngx_threadpool_free, ngx_threadpool_init, ngx_threadpool_process, ngx_threadpool_update,
    };
    use ngx_threadpool_handler::__private::ffi::{
        ngx_tp_bytes_t, ngx_tp_init_t, ngx_tp_out_t, ngx_tp_task_t, ngx_tp_update_t,
    };
    use rmp::encode;
    use std::ffi::{c_int, c_void};
    use std::ptr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const FILE: &str = "return {\n{ id = 1, pattern = [[(?i)\\bunion\\b]], \
                        targets = { \"args\" }, msg = \"file\" },\n}\n";

    /// A rule of an update: (id, pattern, targets).
    type Extra<'a> = (u32, &'a str, &'a [&'a str]);

    /// One argument: an array of rules in the rule file's shape.
    fn extras(rules: &[Extra]) -> Vec<u8> {
        let mut p = Vec::new();
        encode::write_uint(&mut p, 1).unwrap();
        encode::write_map_len(&mut p, 1).unwrap();
        encode::write_uint(&mut p, 1).unwrap();
        encode::write_array_len(&mut p, rules.len() as u32).unwrap();
        for (id, pattern, targets) in rules {
            encode::write_map_len(&mut p, 4).unwrap();
            encode::write_str(&mut p, "id").unwrap();
            encode::write_uint(&mut p, u64::from(*id)).unwrap();
            encode::write_str(&mut p, "pattern").unwrap();
            encode::write_bin(&mut p, pattern.as_bytes()).unwrap();
            encode::write_str(&mut p, "targets").unwrap();
            encode::write_array_len(&mut p, targets.len() as u32).unwrap();
            for t in *targets {
                encode::write_str(&mut p, t).unwrap();
            }
            encode::write_str(&mut p, "msg").unwrap();
            encode::write_str(&mut p, "extra").unwrap();
        }
        p
    }

    /// One argument: the request `{ args = { q = QUERY } }`.
    fn request(query: &str) -> Vec<u8> {
        let mut p = Vec::new();
        encode::write_uint(&mut p, 1).unwrap();
        encode::write_map_len(&mut p, 1).unwrap();
        encode::write_uint(&mut p, 1).unwrap();
        encode::write_map_len(&mut p, 1).unwrap();
        encode::write_str(&mut p, "args").unwrap();
        encode::write_map_len(&mut p, 1).unwrap();
        encode::write_str(&mut p, "q").unwrap();
        encode::write_str(&mut p, query).unwrap();
        p
    }

    /// The module's writer: a growing buffer behind its `ngx_tp_out_t`.
    #[repr(C)]
    struct Out {
        out: ngx_tp_out_t,
        buf: Vec<u8>,
    }

    unsafe extern "C" fn write(out: *mut ngx_tp_out_t, data: *const u8, len: usize) -> c_int {
        // SAFETY: out is the first field of an Out (repr(C)); data points
        // to len bytes.
        unsafe {
            let out = &mut *out.cast::<Out>();
            out.buf
                .extend_from_slice(std::slice::from_raw_parts(data, len));
        }
        0
    }

    fn out() -> Box<Out> {
        Box::new(Out {
            out: ngx_tp_out_t {
                write,
                module: ptr::null_mut(),
            },
            buf: Vec::new(),
        })
    }

    unsafe extern "C" fn log_fn(_: *const c_void, _: c_int, _: *const u8, _: usize) {}

    unsafe extern "C" fn not_cancelled(_: *const ngx_tp_task_t) -> c_int {
        0
    }

    unsafe extern "C" fn no_send(_: *const ngx_tp_task_t, _: *const u8, _: usize) -> c_int {
        -1
    }

    unsafe extern "C" fn no_receive(_: *const ngx_tp_task_t, _: *mut ngx_tp_out_t) -> c_int {
        -1
    }

    fn bytes(b: &[u8]) -> ngx_tp_bytes_t {
        ngx_tp_bytes_t {
            data: b.as_ptr(),
            len: b.len(),
        }
    }

    /// A thread's state, built from `FILE`.
    struct Thread(*mut c_void);

    impl Thread {
        fn start() -> Thread {
            static STARTED: AtomicUsize = AtomicUsize::new(0);
            let n = STARTED.fetch_add(1, Ordering::Relaxed);
            let path =
                std::env::temp_dir().join(format!("waf-rust-{}.{n}.lua", std::process::id()));
            std::fs::write(&path, FILE).unwrap();
            let config = path.to_str().unwrap();
            let init = ngx_tp_init_t {
                pool: bytes(b"waf_rust"),
                config: bytes(config.as_bytes()),
                thread: 0,
                log_fn,
                log: ptr::null(),
            };
            let (mut state, mut err) = (ptr::null_mut(), out());
            // SAFETY: init and its strings outlive the call; state and err
            // are the module's, as it passes them.
            let rc = unsafe { ngx_threadpool_init(&init, &mut state, &mut err.out) };
            std::fs::remove_file(&path).unwrap();
            assert_eq!(rc, 0, "{:?}", String::from_utf8_lossy(&err.buf));
            Thread(state)
        }

        /// The update's error text, if it failed.
        fn update(&self, version: u64, payload: &[u8]) -> Result<(), String> {
            let update = ngx_tp_update_t {
                version,
                args: bytes(payload),
            };
            let mut err = out();
            // SAFETY: the state is init's, on this thread; the update
            // outlives the call; err is an empty writer.
            let rc = unsafe { ngx_threadpool_update(self.0, &update, &mut err.out) };
            match rc {
                0 => Ok(()),
                _ => Err(error_text(&err.buf)),
            }
        }

        /// The ids of the rules that match `?q=QUERY`.
        fn scan(&self, query: &str) -> Vec<u32> {
            let payload = request(query);
            let task = ngx_tp_task_t {
                args: bytes(&payload),
                spans: ptr::null(),
                nspans: 0,
                cancelled: not_cancelled,
                module: ptr::null(),
                send: no_send,
                receive: no_receive,
            };
            let mut res = out();
            // SAFETY: the state is init's, on this thread; the task
            // outlives the call; res is an empty writer.
            let rc = unsafe { ngx_threadpool_process(self.0, &task, &mut res.out) };
            assert_eq!(rc, 0);
            // uint(1) map(0) for nil, or map(1) {1: array of ids}
            let mut rd = &res.buf[..];
            rmp::decode::read_int::<u64, _>(&mut rd).unwrap();
            if rmp::decode::read_map_len(&mut rd).unwrap() == 0 {
                return Vec::new();
            }
            rmp::decode::read_int::<u64, _>(&mut rd).unwrap();
            let n = rmp::decode::read_array_len(&mut rd).unwrap();
            (0..n)
                .map(|_| rmp::decode::read_int(&mut rd).unwrap())
                .collect()
        }
    }

    impl Drop for Thread {
        fn drop(&mut self) {
            // SAFETY: the state is init's, freed once.
            unsafe { ngx_threadpool_free(self.0) };
        }
    }

    /// The text of an error payload: `uint(1) map(1) {1: str}`.
    fn error_text(p: &[u8]) -> String {
        let mut rd = p;
        rmp::decode::read_int::<u64, _>(&mut rd).unwrap();
        rmp::decode::read_map_len(&mut rd).unwrap();
        rmp::decode::read_int::<u64, _>(&mut rd).unwrap();
        let len = rmp::decode::read_str_len(&mut rd).unwrap() as usize;
        String::from_utf8_lossy(&rd[..len]).into_owned()
    }

    #[test]
    fn an_update_replaces_the_extra_rules() {
        let t = Thread::start();
        assert_eq!(t.scan("union evil"), [1]);
        let first = extras(&[(90001, "evil", &["args"]), (90002, "other", &["body"])]);
        t.update(1, &first).unwrap();
        assert_eq!(t.scan("union evil"), [1, 90001]);
        // the whole state: the file's rules and these extras, not the last
        t.update(2, &extras(&[(90003, "(?i)BAD", &["args", "headers"])]))
            .unwrap();
        assert_eq!(t.scan("evil bad"), [90003]);
        t.update(3, &extras(&[])).unwrap();
        assert_eq!(t.scan("evil bad union"), [1]);
    }

    #[test]
    fn a_bad_rule_fails_the_update_naming_its_id_and_changes_nothing() {
        let t = Thread::start();
        t.update(1, &extras(&[(90001, "evil", &["args"])])).unwrap();
        let refused = [
            (
                extras(&[(90002, "ok", &["args"]), (90003, "a(?=b)", &["args"])]),
                "waf rule 90003: ",
            ),
            (extras(&[(90004, "(", &["args"])]), "waf rule 90004: "),
            (
                extras(&[(90005, "x", &["cookie"])]),
                "bad argument #1: waf rule 90005: unknown target cookie",
            ),
            // ("x")
            (
                vec![0x01, 0x81, 0x01, 0xa1, b'x'],
                "bad argument #1: expected a list of rules",
            ),
        ];
        for (payload, text) in refused {
            let err = t.update(2, &payload).unwrap_err();
            assert!(err.starts_with(text), "{err:?}");
        }
        assert_eq!(t.scan("evil ok"), [90001]);
    }
}

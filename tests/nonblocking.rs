//! The point of the module: a pool task burning CPU does not block the
//! event loop. This is the one timing assertion of the test suite.

mod common;

use common::Nginx;
use std::time::{Duration, Instant};

/// Marks its start and end with files in `dir`, burning 1 s of CPU between.
const BURN: &str = r#"
return function(dir)
    assert(io.open(dir .. "/started", "w")):close()
    local t0 = os.clock()
    local spins = 0
    while os.clock() - t0 < 1 do
        spins = spins + 1
    end
    assert(io.open(dir .. "/finished", "w")):close()
    return spins
end
"#;

#[test]
fn static_requests_are_served_while_a_task_burns_cpu() {
    let http = r#"
    thread_pool_process_by_lua_file burn conf/burn.lua;
    server {
        listen 127.0.0.1:$PORT;
        location /static/ { alias conf/; }
        location /burn { content_by_lua_block {
            local tp = require "resty.threadpool"
            ngx.say(assert(tp.burn:push_task(ngx.config.prefix() .. "gate")))
        } }
    }
"#;
    let n = Nginx::start_with(
        1,
        "thread_pool burn threads=1;",
        http,
        &[("burn.lua", BURN), ("hello.txt", "hello\n")],
    );
    // The worker runs as nobody: the marker files go to a directory it may
    // write to.
    let gate = n.dir.join("gate");
    std::fs::create_dir(&gate).unwrap();
    std::fs::set_permissions(&gate, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    let port = n.port;
    let burner = std::thread::spawn(move || common::request(port, "GET", "/burn", &[], b""));
    assert!(
        common::eventually(Duration::from_secs(10), || gate.join("started").exists()),
        "the task never started"
    );
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let r = n.get("/static/hello.txt");
        times.push(t0.elapsed());
        assert_eq!((r.status, r.text().as_str()), (200, "hello\n"));
    }
    assert!(
        !gate.join("finished").exists(),
        "the task must still be running after the static requests ({times:?})"
    );
    for t in &times {
        assert!(
            *t < Duration::from_millis(100),
            "a static request took {t:?} ({times:?})"
        );
    }

    let r = burner.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().trim().parse::<u64>().unwrap() > 0, "{}", r.text());
    assert!(gate.join("finished").exists());
    n.assert_clean_log();
}

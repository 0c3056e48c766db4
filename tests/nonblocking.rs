//! The point of the module: a pool task burning CPU does not block the
//! event loop. The task burns until the test has been served, so the
//! verdict (every static request answered while the task still runs)
//! holds however busy the machine; how fast they are answered is a figure
//! of `make bench` (head of line).

mod common;

use common::Case;
use std::time::Duration;

/// Marks its start and end with files in `dir`, burning CPU between until
/// the file `stop` appears there (or 60 s of CPU have passed, should the
/// test never write it).
const BURN: &str = r#"
return function(dir)
    assert(io.open(dir .. "/started", "w")):close()
    local t0 = os.clock()
    local spins = 0
    while os.clock() - t0 < 60 do
        spins = spins + 1
        if spins % 100000 == 0 then
            local stop = io.open(dir .. "/stop")
            if stop then
                stop:close()
                break
            end
        end
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
    let n = Case::new("thread_pool burn threads=1;")
        .http(http)
        .file("burn.lua", BURN)
        .file("hello.txt", "hello\n")
        .start();
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
    // An event loop running the task would answer none of these before it
    // ends, and it ends only once they are answered: the read timeout is
    // the verdict's only clock, as a bound against hanging.
    for i in 0..5 {
        let r = common::try_request(
            port,
            "GET",
            "/static/hello.txt",
            &[],
            b"",
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("static request {i} not answered while the task runs: {e}"));
        assert_eq!((r.status, r.text().as_str()), (200, "hello\n"));
    }
    assert!(
        !gate.join("finished").exists(),
        "the task must still be running after the static requests"
    );
    std::fs::write(gate.join("stop"), b"").unwrap();

    let r = burner.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().trim().parse::<u64>().unwrap() > 0, "{}", r.text());
    assert!(gate.join("finished").exists());
    n.assert_clean_log();
}

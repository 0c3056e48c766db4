//! `tp.NAME:stats()`: this worker's counters and timings of a pool, after
//! a known mix of tasks: returned, failed, refused (queue full), timed
//! out and abandoned by their request; the wait of a batch's task counts
//! the tasks before it.

mod common;

use common::*;
use std::time::Duration;

const HTTP: &str = r#"
    thread_pool_process_by_lua_block st {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        return function(op, arg)
            if op == "sleep" then
                ffi.C.usleep(arg * 1e6)
            elseif op == "err" then
                error("failed on purpose")
            end
            return op
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        location /run {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.print(tostring(tp.st:push_task(ngx.var.arg_op)))
            }
        }
        location /timeout {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.print(select(2, tp.st:push_task_timeout(0.05, "sleep", 0.3)))
            }
        }
        location /reject {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local a = ngx.thread.spawn(function() return tp.st:push_task("sleep", 0.3) end)
                ngx.sleep(0.05)
                local b = ngx.thread.spawn(function() return tp.st:push_task("sleep", 0.01) end)
                local _, err = tp.st:push_task("ok")
                ngx.thread.wait(a)
                ngx.thread.wait(b)
                ngx.print(err)
            }
        }
        location /batch {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local res = assert(tp.st:push_tasks({ { "sleep", 0.2 }, { "ok" } }))
                ngx.print(res[2][2])
            }
        }
        location /abandon {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.thread.spawn(function() return tp.st:push_task("sleep", 0.2) end)
                ngx.sleep(0.01)
                ngx.exit(200)
            }
        }
        location /json {
            content_by_lua_block {
                local cjson = require "cjson"
                local tp = require "resty.threadpool"
                local ok, json = pcall(cjson.encode, assert(tp.st:stats()))
                if not ok then
                    return ngx.print(json)
                end
                local s = cjson.decode(json)
                local last = s.run.buckets[#s.run.buckets]
                ngx.print(#s.run.buckets, " ", s.wait.buckets[1].le, " ", last.le, " ",
                          tonumber(last.le) == math.huge, " ", s.pushed)
            }
        }
        location /stats {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local s = assert(tp.st:stats())
                local out = {}
                for _, k in ipairs({ "threads", "busy", "queued", "in_flight", "pushed",
                                     "completed", "errors", "rejected", "timed_out",
                                     "abandoned" }) do
                    out[#out + 1] = k .. "=" .. s[k]
                end
                for _, h in ipairs({ "wait", "run" }) do
                    out[#out + 1] = h .. ".count=" .. s[h].count
                    local le1 = 0 -- cumulative, up to 1 s
                    for i = 1, 6 do le1 = le1 + s[h].buckets[i].count end
                    out[#out + 1] = h .. ".le1=" .. le1
                    out[#out + 1] = h .. ".in(0.1,1]=" .. s[h].buckets[6].count
                    out[#out + 1] = h .. ".sum>0=" .. tostring(s[h].sum > 0)
                end
                ngx.print(table.concat(out, " "))
            }
        }
    }
"#;

#[test]
fn counters_after_a_known_workload() {
    let ngx = Nginx::start("thread_pool st threads=1 max_queue=1;", HTTP);
    for _ in 0..5 {
        assert_eq!(ngx.get("/run?op=ok").text(), "ok");
    }
    for _ in 0..2 {
        assert_eq!(ngx.get("/run?op=err").text(), "nil");
    }
    assert_eq!(ngx.get("/timeout").text(), "timeout");
    // the timed-out task still holds the thread for a while
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(ngx.get("/reject").text(), "queue full");
    assert_eq!(ngx.get("/abandon").status, 200);
    // Every task has finished once a task queued behind them has.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(ngx.get("/run?op=ok").text(), "ok");
    assert_eq!(
        ngx.get("/stats").text(),
        "threads=1 busy=0 queued=0 in_flight=0 pushed=12 completed=10 errors=2 \
         rejected=1 timed_out=1 abandoned=1 wait.count=12 wait.le1=12 \
         wait.in(0.1,1]=1 wait.sum>0=true run.count=12 run.le1=12 run.in(0.1,1]=3 run.sum>0=true"
    );
    ngx.assert_clean_log();
}

/// With cjson's defaults, which refuse infinities: the last bucket's bound
/// is "+Inf", which tonumber() reads as math.huge.
#[test]
fn stats_encode_as_json() {
    let ngx = Nginx::start("thread_pool st threads=1;", HTTP);
    assert_eq!(ngx.get("/run?op=ok").text(), "ok");
    assert_eq!(ngx.get("/json").text(), "8 1e-05 +Inf true 1");
    ngx.assert_clean_log();
}

/// A thread that runs a batch's tasks in turn: the second waited for the
/// first (0.2 s), and says so in `wait`.
#[test]
fn a_batch_task_waits_for_the_tasks_before_it() {
    let ngx = Nginx::start("thread_pool st threads=1;", HTTP);
    assert_eq!(ngx.get("/batch").text(), "ok");
    let stats = ngx.get("/stats").text();
    assert!(
        stats.contains("wait.count=2 wait.le1=2 wait.in(0.1,1]=1 ")
            && stats.contains("run.count=2 run.le1=2 run.in(0.1,1]=1 "),
        "{stats}"
    );
    ngx.assert_clean_log();
}

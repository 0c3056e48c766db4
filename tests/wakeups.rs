//! A wake-up that no one took stays with its record's semaphore: a chunk
//! or a completion posts it while its coroutine waits, and, in the same
//! turn of the event loop, before the posted wake-up runs, the wait ends
//! another way (its timeout: nginx runs expired timers before posted
//! events; or `ngx.thread.kill`). The record's next owner, a later push,
//! must still wait for its own task: it answers with its task's result,
//! not with nil, "no result" at once.
//!
//! Each race is made certain, not likely: a light thread holds the event
//! loop in a blocking poll(2) while the pool's task ends and the waiter's
//! timer (or its killer's) expires, so all of them meet in the turn after.
//! One worker and one record free at a time: the next push gets the same
//! record.

mod common;

use common::*;

const MAIN: &str = "thread_pool gen threads=1;";

/// The pool's handlers, which pause in the pool thread: a stream that
/// sends one chunk after 50 ms, then returns; a task that echoes its
/// argument after 100 ms.
const HTTP: &str = r#"
    init_by_lua_block {
        require("ffi").cdef "int wakeups_test_poll(void *, unsigned long, int) asm(\"poll\");"
    }
    thread_pool_process_by_lua_block gen {
        local ffi = require "ffi"
        local tp = require "resty.threadpool"
        ffi.cdef "int wakeups_test_usleep(unsigned int) asm(\"usleep\");"
        return function(what, v)
            if what == "chunk" then
                ffi.C.wakeups_test_usleep(50000)
                assert(tp.send("chunk"))
                return
            end
            ffi.C.wakeups_test_usleep(100000)
            return v
        end
    }
"#;

/// A race's location: its Lua (RACE, which returns the answer) runs
/// while a light thread holds the event loop for 300 ms, from 10 ms after
/// the race started waiting.
const HOLD: &str = r#"
    local C = require("ffi").C
    local holder = ngx.thread.spawn(function()
        ngx.sleep(0.01)
        C.wakeups_test_poll(nil, 0, 300)
    end)
    local answer = (function()
        RACE
    end)()
    ngx.thread.wait(holder)
    ngx.print(answer)
"#;

/// The pushes after a race: each must wait for its own task.
const NEXT: &str = r#"
    local out = {}
    for _, v in ipairs({ "a", "b", "c" }) do
        local r, err = tp.gen:push_task("echo", v)
        out[#out + 1] = tostring(r) .. (err and (" " .. err) or "")
    end
    ngx.print(table.concat(out, ","))
"#;
const NEXT_WANT: &str = "a,b,c";

/// A race: its location, its Lua (see HOLD) and its answer.
struct Race {
    path: &'static str,
    lua: &'static str,
    want: &'static str,
}

/// A stream's read times out in the turn its chunk comes.
const READ_TIMEOUT: Race = Race {
    path: "/read_timeout",
    lua: r#"
        local s = assert(tp.gen:push_stream("chunk"))
        local v, err = s:read(0.1)
        return tostring(v) .. " " .. err
    "#,
    want: "nil timeout",
};

/// A push times out in the turn its task ends.
const PUSH_TIMEOUT: Race = Race {
    path: "/push_timeout",
    lua: r#"
        local v, err = tp.gen:push_task_timeout(0.15, "echo", "late")
        return tostring(v) .. " " .. err
    "#,
    want: "nil timeout",
};

/// A waiting light thread is killed in the turn its task ends.
const KILL: Race = Race {
    path: "/kill",
    lua: r#"
        local waiter = ngx.thread.spawn(function()
            return tp.gen:push_task("echo", "never")
        end)
        ngx.sleep(0.15)
        assert(ngx.thread.kill(waiter))
        return "killed"
    "#,
    want: "killed",
};

const RACES: [Race; 3] = [READ_TIMEOUT, PUSH_TIMEOUT, KILL];

/// The pool, a location per race and /next.
fn case() -> Case {
    RACES
        .iter()
        .fold(Case::new(MAIN).http(HTTP), |case, race| {
            case.lua(race.path, &HOLD.replace("RACE", race.lua))
        })
        .lua("/next", NEXT)
}

/// `race`, then pushes that wait for their own tasks.
fn run(race: &Race) {
    case()
        .get(race.path, 200, race.want)
        .get("/next", 200, NEXT_WANT)
        .run();
}

#[test]
fn a_read_that_timed_out_as_its_chunk_came() {
    run(&READ_TIMEOUT);
}

#[test]
fn a_push_that_timed_out_as_its_task_ended() {
    run(&PUSH_TIMEOUT);
}

#[test]
fn a_waiter_killed_as_its_task_ended() {
    run(&KILL);
}

/// Each race, three times, in one process under valgrind's memcheck: the
/// semaphores that keep a wake-up and are reused, with no invalid access
/// or leak.
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn the_races_under_valgrind() {
    let mut n = case().under_valgrind().start();
    for _ in 0..3 {
        for race in &RACES {
            assert_eq!(n.get(race.path).text(), race.want, "{}", race.path);
            assert_eq!(n.get("/next").text(), NEXT_WANT, "after {}", race.path);
        }
    }
    n.quit_under_valgrind();
    n.assert_clean_log();
}

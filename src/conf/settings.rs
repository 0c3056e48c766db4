//! A pool's settings, declared in one place: each is one field of
//! `Settings` (its default in `Settings::default`) and one entry of
//! `DIRECTIVES` (its directive and parser). The directive's setter
//! (conf/mod.rs) stores the field in the pool's configuration, and the struct
//! travels unchanged to the worker and each of the pool's threads, which
//! read the fields they use.

use crate::conf::error::ConfError;
use crate::ngx::conf::Conf;
use crate::ngx::os::{Policy, Scheduling};
use crate::ngx::sys;
use std::ffi::CStr;
use std::time::Duration;

/// A pool's settings, as configured.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `thread_pool_slow_task_log`: a warn line for a task running longer
    /// (None: off). Read by the worker's watchdog.
    pub slow_task: Option<Duration>,
    /// `thread_pool_scheduling`: set by each thread on itself.
    pub scheduling: Scheduling,
    /// `thread_pool_zero_copy`: strings of at least this many bytes are
    /// read in place rather than copied (None: off). Read by the shim for
    /// arguments, by a Lua thread for results.
    pub zero_copy: Option<usize>,
    /// `thread_pool_deadline`: push_task's and push_tasks' timeout, which
    /// is then also their deadline (None: off, the shim's 60 s timeout
    /// and no deadline). Read by the shim.
    pub deadline: Option<Duration>,
    /// `thread_pool_stream_chunks`: the most chunks of a stream sent and
    /// not read yet (push_stream may ask for another). Read by the shim's
    /// push_stream.
    pub stream_chunks: usize,
    /// `thread_pool_update_size`: the bytes of code and arguments the
    /// pool's latest update may hold in shared memory (None: off, no
    /// updates). Read at postconfiguration, which adds the zone.
    pub update_size: Option<usize>,
    /// `thread_pool_stack_size`: each pool thread's stack. Read by the
    /// worker when it starts the threads.
    pub stack_size: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            // A LuaJIT task this long is almost certainly stuck (a loop
            // that cannot be interrupted).
            slow_task: Some(Duration::from_secs(10)),
            scheduling: DEFAULT_SCHEDULING,
            zero_copy: Some(DEFAULT_ZERO_COPY),
            deadline: None,
            stream_chunks: DEFAULT_STREAM_CHUNKS,
            update_size: Some(DEFAULT_UPDATE_SIZE),
            stack_size: DEFAULT_STACK_SIZE,
        }
    }
}

/// The directive of a setting: `NAME POOL ARGS...` in the http block.
pub struct Directive {
    pub name: &'static CStr,
    /// nginx's argument-count flags, POOL included (NGX_CONF_TAKE2...).
    pub args: u32,
    pub parse: Parse,
}

/// Parses a setting's arguments after POOL into its field.
pub type Parse = fn(&mut Settings, Conf, &[&[u8]]) -> Result<(), ConfError>;

/// Every setting's directive; the setter gets an entry's index.
pub const DIRECTIVES: [Directive; 7] = [
    Directive {
        name: c"thread_pool_slow_task_log",
        args: sys::NGX_CONF_TAKE2,
        parse: slow_task,
    },
    Directive {
        name: c"thread_pool_scheduling",
        args: sys::NGX_CONF_TAKE23,
        parse: scheduling,
    },
    Directive {
        name: c"thread_pool_zero_copy",
        args: sys::NGX_CONF_TAKE2,
        parse: zero_copy,
    },
    Directive {
        name: c"thread_pool_deadline",
        args: sys::NGX_CONF_TAKE2,
        parse: deadline,
    },
    Directive {
        name: c"thread_pool_stream_chunks",
        args: sys::NGX_CONF_TAKE2,
        parse: stream_chunks,
    },
    Directive {
        name: c"thread_pool_update_size",
        args: sys::NGX_CONF_TAKE2,
        parse: update_size,
    },
    Directive {
        name: c"thread_pool_stack_size",
        args: sys::NGX_CONF_TAKE2,
        parse: stack_size,
    },
];

/// `thread_pool_slow_task_log POOL TIME | off;`.
fn slow_task(s: &mut Settings, cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    s.slow_task = if args[0] == b"off" {
        None
    } else {
        Some(Duration::from_millis(time_ms(cf, args[0])?))
    };
    Ok(())
}

/// `thread_pool_deadline POOL TIME | off;`.
fn deadline(s: &mut Settings, cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    s.deadline = match args[0] {
        b"off" => None,
        time => Some(Duration::from_millis(time_ms(cf, time)?)),
    };
    Ok(())
}

/// A TIME argument in ms, more than 0.
fn time_ms(cf: Conf, arg: &[u8]) -> Result<u64, ConfError> {
    cf.parse_time_ms(arg)
        .filter(|&ms| ms > 0)
        .ok_or(ConfError::BadTime)
}

/// `thread_pool_scheduling`'s default: on a loaded machine the event loop
/// gets the CPU first when it has work, so a static request waits less
/// behind CPU-heavy tasks, which still get the rest of the CPU.
const DEFAULT_SCHEDULING: Scheduling = Scheduling {
    policy: Policy::Normal,
    nice: 5,
};

/// `thread_pool_scheduling POOL normal | batch | idle [nice=N];`.
fn scheduling(s: &mut Settings, _cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    let policy = Scheduling::parse_policy(args[0])
        .ok_or_else(|| ConfError::BadScheduling(lossy(args[0])))?;
    let mut nice = DEFAULT_SCHEDULING.nice;
    if let Some(arg) = args.get(1) {
        let arg = lossy(arg);
        nice = arg
            .strip_prefix("nice=")
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|n| (0..=19).contains(n))
            .ok_or(ConfError::BadScheduling(arg))?;
    }
    s.scheduling = Scheduling { policy, nice };
    Ok(())
}

/// `thread_pool_zero_copy`'s default. Borrowing a string costs a fixed
/// ~0.5 µs (anchoring it, a span, a pin) and saves copying it twice; from
/// this size the copies cost more (`make bench`, zero-copy rows).
const DEFAULT_ZERO_COPY: usize = 16 * 1024;

/// `thread_pool_zero_copy POOL SIZE | off;`.
fn zero_copy(s: &mut Settings, cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    s.zero_copy = match args[0] {
        b"off" => None,
        size => match cf.parse_size(size) {
            Some(n) if n > 0 => Some(n),
            _ => return Err(ConfError::BadSize(lossy(size))),
        },
    };
    Ok(())
}

/// `thread_pool_stream_chunks`' default: enough chunks in flight that a
/// reader that sends each to a client rarely finds none ready, few enough
/// that a stream of 64 KiB chunks holds 1 MiB at most.
const DEFAULT_STREAM_CHUNKS: usize = 16;

/// The most unread chunks a stream may be given (the setting and
/// push_stream's override): a bound, not a buffer size.
pub const STREAM_CHUNKS_MAX: usize = 65536;

/// `thread_pool_stream_chunks POOL N;`.
fn stream_chunks(s: &mut Settings, _cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    s.stream_chunks = std::str::from_utf8(args[0])
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| (1..=STREAM_CHUNKS_MAX).contains(n))
        .ok_or_else(|| ConfError::BadStreamChunks {
            arg: lossy(args[0]),
            max: STREAM_CHUNKS_MAX,
        })?;
    Ok(())
}

/// `thread_pool_update_size`'s default: a rule set of a few thousand
/// rules, or a handler chunk, with room to spare; shared memory of one
/// zone per pool, whatever the workers.
const DEFAULT_UPDATE_SIZE: usize = 1 << 20;

/// `thread_pool_update_size POOL SIZE | off;`.
fn update_size(s: &mut Settings, cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    s.update_size = match args[0] {
        b"off" => None,
        size => match cf.parse_size(size) {
            Some(n) if n > 0 => Some(n),
            _ => return Err(ConfError::BadSize(lossy(size))),
        },
    };
    Ok(())
}

/// `thread_pool_stack_size`'s default. LuaJIT bounds a recursion through
/// C functions (a `string.gsub` callback that calls gsub, a `table.sort`
/// comparator that sorts) by its Lua stack alone, 65,500 slots: about
/// 6,000 levels of gsub, each with an 8 KiB buffer on the C stack. 8 MiB
/// (the event loop's, under Linux's `ulimit -s`) ends such a recursion in
/// a crash of the worker, 32 MiB too; from 64 MiB LuaJIT's own "stack
/// overflow" error ends it first. Only the pages a task touches are
/// memory: the rest is address space.
const DEFAULT_STACK_SIZE: usize = 64 << 20;

/// The smallest `thread_pool_stack_size`: below it, a task's ordinary C
/// calls (PCRE matching without JIT among them) would not fit.
pub const STACK_SIZE_MIN: usize = 1 << 20;

/// `thread_pool_stack_size POOL SIZE;`.
fn stack_size(s: &mut Settings, cf: Conf, args: &[&[u8]]) -> Result<(), ConfError> {
    s.stack_size = cf
        .parse_size(args[0])
        .filter(|&n| n >= STACK_SIZE_MIN)
        .ok_or_else(|| ConfError::BadStackSize {
            arg: lossy(args[0]),
            min: STACK_SIZE_MIN,
        })?;
    Ok(())
}

pub fn lossy(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).into_owned()
}

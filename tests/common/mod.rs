//! The harness of the integration tests: starts Debian's real nginx with
//! lua-nginx-module and this module under a temporary prefix on loopback
//! (through a `Case`), and speaks HTTP/1.1 to it. This file is the map;
//! each file below holds one concern.
// Each test binary uses its own part of the harness, and of what it
// re-exports.
#![allow(dead_code, unused_imports)]

/// `Case`, the one way a test starts nginx (or runs `nginx -t`).
mod case;
/// The nginx.conf the harness writes around a test's directives.
mod conf;
/// The nginx, lua module and module build under test; the user; counts.
mod env;
/// The HTTP/1.1 client.
mod http;
/// The error log's verdict: levels that fail a test, expected patterns.
mod log;
/// Prometheus's parser over the status page.
mod metrics;
/// What /proc says of nginx's processes.
mod procs;
/// Temporary prefix directories and free loopback ports.
mod scratch;
/// A running nginx: signals, quit, its log; stopped when dropped.
mod server;
/// Waiting for a condition, or for a pool to go idle.
mod wait;

/// What the tests of native handlers share (fixtures, abort scenarios).
pub mod handlers;

pub use case::Case;
pub use env::{
    env_u64, lua_built_in, lua_module_lines, lua_module_path, module_path, nginx, nginx_env, repo,
    user_line, MODULES,
};
pub use http::{request, try_request, Response};
pub use log::{assert_clean, assert_clean_but, matches, matches_whole};
pub use metrics::prometheus;
pub use procs::{children_of, kill, rss_kib, status_kib, thread_count};
pub use scratch::{free_port, prefix};
pub use server::Nginx;
pub use wait::{eventually, skipped_once_idle};

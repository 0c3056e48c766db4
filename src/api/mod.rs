//! What the event loop offers: the C functions behind
//! lua/resty/threadpool.lua (`require "ngx_threadpool"`), and the
//! `thread_pool_status` content handler.

pub mod functions;
pub mod status;

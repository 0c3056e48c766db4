//! Small pieces of nginx's http module for a content handler of our own.

use super::sys;

/// Sets `handler` as the content handler of the location being parsed.
///
/// # Safety
/// `cf` must be the configuration being parsed, inside a location.
pub unsafe fn set_location_handler(cf: *mut sys::ngx_conf_t, handler: sys::ngx_http_handler_pt) {
    // SAFETY: the core module's location conf of the current context.
    unsafe {
        let ctx = (*cf).ctx as *mut sys::ngx_http_conf_ctx_t;
        let clcf = *(*ctx).loc_conf.add(sys::ngx_http_core_module.ctx_index)
            as *mut sys::ngx_http_core_loc_conf_t;
        (*clcf).handler = handler;
    }
}

/// Answers `r` with 200 and `body` of type `content_type`; nginx's return
/// code for the content handler.
///
/// # Safety
/// `r` must be the request a content handler was called for, on the
/// event-loop thread.
pub unsafe fn send_text(
    r: *mut sys::ngx_http_request_t,
    content_type: &'static [u8],
    body: &[u8],
) -> sys::ngx_int_t {
    let error = sys::NGX_HTTP_INTERNAL_SERVER_ERROR as sys::ngx_int_t;
    // SAFETY: r is live; the buffer and chain come from its pool and the
    // body is copied into it before nginx sends anything.
    unsafe {
        if sys::ngx_http_discard_request_body(r) != sys::NGX_OK as sys::ngx_int_t {
            return error;
        }
        let out = &mut (*r).headers_out;
        out.status = sys::NGX_HTTP_OK as sys::ngx_uint_t;
        out.content_length_n = body.len() as sys::off_t;
        out.content_type_len = content_type.len();
        out.content_type = sys::ngx_str_t {
            len: content_type.len(),
            data: content_type.as_ptr() as *mut u8,
        };
        let rc = sys::ngx_http_send_header(r);
        if rc == sys::NGX_ERROR as sys::ngx_int_t || rc > sys::NGX_OK as sys::ngx_int_t {
            return rc;
        }
        if body.is_empty() {
            // nginx refuses a buffer with no data (an alert): its special
            // last buffer ends the response. Not r->header_only: the bit
            // fields of ngx_http_request_t start 2 bytes into a 32-bit
            // unit (after `port`), and where one would cross into the
            // next unit (nginx 1.31's uri_changes) the C compiler moves
            // it there while bindgen 0.72 does not (it lays out a run of
            // bit fields as if it began aligned: rust-bindgen#3105,
            // #1377): from there on the accessors are 2 bits off (nginx
            // 1.31: set_header_only sets `pipeline`, and the header
            // waited forever). No accessor of those bit fields is used.
            return sys::ngx_http_send_special(r, sys::NGX_HTTP_LAST as sys::ngx_uint_t);
        }
        let b = sys::ngx_create_temp_buf((*r).pool, body.len());
        let cl = sys::ngx_alloc_chain_link((*r).pool);
        if b.is_null() || cl.is_null() {
            return error;
        }
        std::ptr::copy_nonoverlapping(body.as_ptr(), (*b).last, body.len());
        (*b).last = (*b).last.add(body.len());
        (*b).set_last_buf(1);
        (*b).set_last_in_chain(1);
        (*cl).buf = b;
        (*cl).next = std::ptr::null_mut();
        sys::ngx_http_output_filter(r, cl)
    }
}

/// The worker's number (`ngx_worker`), as ngx.worker.id() gives it.
pub fn worker_number() -> usize {
    // SAFETY: set once before init_process and read-only afterwards.
    unsafe { sys::ngx_worker }
}

/// worker_processes as configured so far, if set (`auto` included).
///
/// # Safety
/// `cf` must be the configuration being parsed.
pub unsafe fn configured_workers(cf: *mut sys::ngx_conf_t) -> Option<usize> {
    // SAFETY: cf is the configuration being parsed (the contract), whose
    // cycle's core conf exists from the start of parsing.
    let n = unsafe { (*core_conf((*cf).cycle)).worker_processes };
    (n > 0).then_some(n as usize)
}

/// How many workers serve this configuration: worker_processes, or 1
/// without a master process.
pub fn running_workers() -> usize {
    // SAFETY: the running cycle is configured; ngx_process is set before
    // init_process and read-only afterwards.
    unsafe {
        if sys::ngx_process == sys::NGX_PROCESS_SINGLE as sys::ngx_uint_t {
            return 1;
        }
        (*core_conf(sys::ngx_cycle)).worker_processes.max(1) as usize
    }
}

/// The core module's conf of `cycle`.
///
/// # Safety
/// `cycle` must be live; its core conf exists from the start of parsing.
unsafe fn core_conf(cycle: *mut sys::ngx_cycle_t) -> *const sys::ngx_core_conf_t {
    // SAFETY: cycle is live (the contract), and its core conf sits in the slot
    // of the core module's index from the start of parsing.
    unsafe { *(*cycle).conf_ctx.add(sys::ngx_core_module.index) as *const sys::ngx_core_conf_t }
}

/// The machine's CPUs as nginx counted them.
pub fn cpus() -> usize {
    // SAFETY: set by nginx at start-up, read-only afterwards.
    unsafe { sys::ngx_ncpu.max(1) as usize }
}

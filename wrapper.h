/* The nginx headers bindgen reads; the tree is configured by build.rs with
 * the flags of the nginx binary that will load the module. */
#include <ngx_config.h>
#include <sched.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>
#include <ngx_thread_pool.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* Macros bindgen cannot evaluate, turned into constants. */
const char *NGX_RS_MODULE_SIGNATURE = NGX_MODULE_SIGNATURE;
const ngx_uint_t NGX_RS_HTTP_MAIN_CONF_OFFSET = NGX_HTTP_MAIN_CONF_OFFSET;
const ngx_uint_t NGX_RS_READ_EVENT = NGX_READ_EVENT;
const ngx_uint_t NGX_RS_EXCLUSIVE_EVENT = NGX_EXCLUSIVE_EVENT;
const ngx_uint_t NGX_RS_CLEAR_EVENT = NGX_CLEAR_EVENT;
const long NGX_RS_SYS_FUTEX = SYS_futex;

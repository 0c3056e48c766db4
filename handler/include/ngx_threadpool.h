/*
 * ngx_threadpool.h: the ABI between the ngx_threadpool nginx module and a
 * native handler library (thread_pool_process_by_rust POOL PATH [CONFIG]).
 *
 * A handler library is a shared object exporting the four functions below,
 * and optionally a fifth, ngx_threadpool_update. The module loads it when
 * the configuration is read (so `nginx -t` checks it), builds one handler
 * state per pool thread with ngx_threadpool_init, and calls
 * ngx_threadpool_process for each task and ngx_threadpool_update for each
 * live update, always from the thread that owns the state. States are
 * never shared between threads.
 *
 * Values cross as MessagePack, the payload the Lua side already uses:
 *
 *     payload := uint(n) map(k) { uint(position) value }*k
 *
 * n is the number of values (Lua's select('#', ...)); only non-nil values
 * are in the map, keyed by their 1-based position. A value is nil (also
 * ngx.null), bool, int, float64, bin or str (a Lua string), array (a Lua
 * table whose keys are exactly 1..n) or map. A string the module reads in
 * place rather than copying (thread_pool_zero_copy) is an ext of type 1
 * (NGX_TP_EXT_BORROWED) whose 4 data bytes are the big-endian index of a
 * span in ngx_tp_task_t.spans; its bytes are valid until process returns.
 * A result must not contain ext values.
 */

#ifndef NGX_THREADPOOL_H
#define NGX_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What ngx_threadpool_abi_version returns. Version 2 added send and
 * receive to ngx_tp_task_t; the module loads libraries of versions 1 and
 * 2 (a version 1 library never reads the fields it does not know). The
 * optional export ngx_threadpool_update changes no version: the module
 * looks it up in a library of any version, and a module that does not
 * know it never looks. */
#define NGX_THREADPOOL_ABI_VERSION 2

/* The msgpack ext type of a borrowed string. */
#define NGX_TP_EXT_BORROWED 1

/* The module's limits of a payload, as for Lua values: at most this many
 * values (n), and tables nested at most this deep (a top-level array or
 * map is level 1). A result past them gives the caller nil and
 * "bad payload: ...". */
#define NGX_TP_MAX_VALUES 4096
#define NGX_TP_MAX_DEPTH  100

/* Return codes of init, process and update. */
#define NGX_TP_OK     0   /* out holds the results payload */
#define NGX_TP_ERROR  1   /* out holds an error payload: one value, the
                             caller gets nil and that value */

/* Further return codes of a task's send and receive (streams). */
#define NGX_TP_CANCELLED 2  /* the caller let go of the stream */
#define NGX_TP_END       3  /* receive: the caller's input ended */
#define NGX_TP_NO_STREAM 4  /* the task was not pushed with push_stream */

/* Log levels, nginx's (NGX_LOG_ERR ... NGX_LOG_DEBUG). */
#define NGX_TP_LOG_ERR    4
#define NGX_TP_LOG_WARN   5
#define NGX_TP_LOG_NOTICE 6
#define NGX_TP_LOG_INFO   7
#define NGX_TP_LOG_DEBUG  8

typedef struct {
    const unsigned char *data;
    size_t len;
} ngx_tp_bytes_t;

/* Where a handler writes a payload: append len bytes of data. Returns 0, or
 * -1 when the payload cannot grow (out of memory, or larger than the
 * module's limit) and nothing was appended: the handler should then return
 * NGX_TP_ERROR with a short message. */
typedef struct ngx_tp_out_s {
    int (*write)(struct ngx_tp_out_s *out, const unsigned char *data,
                 size_t len);
    void *module;   /* the module's; do not touch */
} ngx_tp_out_t;

/* Writes a line to nginx's error log at level, naming the pool and thread.
 * Callable from the handler's thread during init, process and update. */
typedef void (*ngx_tp_log_pt)(const void *log, int level,
                              const unsigned char *msg, size_t len);

typedef struct {
    ngx_tp_bytes_t pool;     /* the pool's name */
    ngx_tp_bytes_t config;   /* CONFIG from nginx.conf; data NULL if none */
    unsigned thread;         /* this thread's index in the pool, from 0 */
    ngx_tp_log_pt log_fn;
    const void *log;         /* the argument of log_fn; valid for the
                                state's life */
} ngx_tp_init_t;

typedef struct ngx_tp_task_s {
    ngx_tp_bytes_t args;          /* the arguments' payload */
    const ngx_tp_bytes_t *spans;  /* borrowed strings, by index */
    size_t nspans;
    /* Non-zero once the caller gave up (timeout, request gone, its batch
     * timed out): the result will be dropped, the handler may return at
     * once. Cheap: an atomic load. */
    int (*cancelled)(const struct ngx_tp_task_s *task);
    const void *module;           /* the module's; do not touch */
    /* Version 2, streams (push_stream). send hands one chunk to the
     * stream's reader: a payload of one value (n = 1, as results), which
     * the module copies. It waits in this thread while the stream's bound
     * of chunks are unread. NGX_TP_OK; NGX_TP_CANCELLED at once once the
     * caller let go (cancelled() is then non-zero: return); NGX_TP_ERROR
     * for a payload over the module's limit; NGX_TP_NO_STREAM. */
    int (*send)(const struct ngx_tp_task_s *task,
                const unsigned char *payload, size_t len);
    /* receive writes the caller's next chunk (stream:write()) to out, a
     * payload of one value, waiting for it in this thread: NGX_TP_OK;
     * NGX_TP_END once the caller's input ended (stream:close_write())
     * and every chunk was received; NGX_TP_CANCELLED at once once the
     * caller let go; NGX_TP_ERROR when out refused the bytes;
     * NGX_TP_NO_STREAM. Nothing is written but on NGX_TP_OK. */
    int (*receive)(const struct ngx_tp_task_s *task, ngx_tp_out_t *out);
} ngx_tp_task_t;

/* A live update (tp.NAME:update(...)): a version, larger than any
 * before it, and the arguments' payload, encoded as a task's but always
 * copied: never an ext value, so there are no spans. It carries the whole
 * new state, not a change to the previous one: a thread that starts after
 * several updates gets only the latest. */
typedef struct {
    uint64_t version;
    ngx_tp_bytes_t args;   /* valid until update returns */
} ngx_tp_update_t;

/* The exports of a handler library, each declared through its function
 * type (NAME_t), which a module that loads a library looks its exports up
 * as: four, and ngx_threadpool_update, which is optional. */

/* Returns NGX_THREADPOOL_ABI_VERSION of the header it was built with. */
typedef uint32_t ngx_threadpool_abi_version_t(void);
ngx_threadpool_abi_version_t ngx_threadpool_abi_version;

/* Builds this thread's state into *state. On NGX_TP_ERROR, err holds a
 * payload with one string value: the pool is not usable, and its tasks get
 * nil and that text. */
typedef int ngx_threadpool_init_t(const ngx_tp_init_t *init, void **state,
                                  ngx_tp_out_t *err);
ngx_threadpool_init_t ngx_threadpool_init;

/* Runs one task: NGX_TP_OK with the results in out, or NGX_TP_ERROR with
 * one error value in out. out is empty on entry. */
typedef int ngx_threadpool_process_t(void *state, const ngx_tp_task_t *task,
                                     ngx_tp_out_t *out);
ngx_threadpool_process_t ngx_threadpool_process;

/* Frees a state when its thread exits (worker exit or reload). */
typedef void ngx_threadpool_free_t(void *state);
ngx_threadpool_free_t ngx_threadpool_free;

/* Optional. Applies a live update to this thread's state, between two of
 * its tasks: NGX_TP_OK once the state is the update's, or NGX_TP_ERROR
 * with one error value in err (empty on entry; read only on NGX_TP_ERROR)
 * and the state left as it was: the thread keeps serving its previous
 * state and version, and the failure is reported. A library without this
 * export loads as before, and the module refuses updates of its pool. */
typedef int ngx_threadpool_update_t(void *state,
                                    const ngx_tp_update_t *update,
                                    ngx_tp_out_t *err);
ngx_threadpool_update_t ngx_threadpool_update;

#ifdef __cplusplus
}
#endif

#endif /* NGX_THREADPOOL_H */

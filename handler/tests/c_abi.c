/* Drives a handler library through include/ngx_threadpool.h as the module
 * does: its exports looked up by name and called with the header's types,
 * so that a field out of place or a wrong prototype shows in what comes
 * back. Prints what it sees, one line per event. */

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ngx_threadpool.h"

/* The exports, typed by the header's own prototypes. */
static __typeof__(ngx_threadpool_abi_version) *abi_version;
static __typeof__(ngx_threadpool_init) *init;
static __typeof__(ngx_threadpool_process) *process;
static __typeof__(ngx_threadpool_free) *free_state;
static __typeof__(ngx_threadpool_update) *update;

typedef struct {
    ngx_tp_out_t out;       /* first: the handler gets &out */
    unsigned char buf[4096];
    size_t len;
} out_buf_t;

static int
out_write(ngx_tp_out_t *out, const unsigned char *data, size_t len)
{
    out_buf_t *o = (out_buf_t *) out;

    if (o->len + len > sizeof(o->buf)) {
        return -1;
    }
    memcpy(o->buf + o->len, data, len);
    o->len += len;
    return 0;
}

static void
log_fn(const void *log, int level, const unsigned char *msg, size_t len)
{
    printf("log %s %d %.*s\n", (const char *) log, level, (int) len, msg);
}

static int
cancelled(const ngx_tp_task_t *task)
{
    return *(const int *) task->module;
}

/* A task pushed otherwise than by push_stream. */
static int
no_stream_send(const ngx_tp_task_t *task, const unsigned char *p, size_t len)
{
    (void) task; (void) p; (void) len;
    return NGX_TP_NO_STREAM;
}

static int
no_stream_receive(const ngx_tp_task_t *task, ngx_tp_out_t *out)
{
    (void) task; (void) out;
    return NGX_TP_NO_STREAM;
}

static void
print_payload(const char *what, int rc, out_buf_t *o)
{
    printf("%s %d ", what, rc);
    for (size_t i = 0; i < o->len; i++) {
        printf("%02x", o->buf[i]);
    }
    printf("\n");
    o->len = 0;
}

int
main(int argc, char **argv)
{
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL || argc != 2) {
        printf("dlopen %s\n", dlerror());
        return 1;
    }
    abi_version = (__typeof__(abi_version)) dlsym(lib, "ngx_threadpool_abi_version");
    init = (__typeof__(init)) dlsym(lib, "ngx_threadpool_init");
    process = (__typeof__(process)) dlsym(lib, "ngx_threadpool_process");
    free_state = (__typeof__(free_state)) dlsym(lib, "ngx_threadpool_free");
    update = (__typeof__(update)) dlsym(lib, "ngx_threadpool_update");
    if (!abi_version || !init || !process || !free_state || !update) {
        printf("dlsym missing\n");
        return 1;
    }
    printf("abi %u\n", (unsigned) abi_version());

    out_buf_t o = { { out_write, NULL }, { 0 }, 0 };
    ngx_tp_init_t in = {
        { (const unsigned char *) "cpool", 5 },
        { (const unsigned char *) "c", 1 },
        2, log_fn, "L"
    };
    void *state = NULL;
    int rc = init(&in, &state, &o.out);
    print_payload("init", rc, &o);

    /* ("hello" borrowed through span 0, 7) */
    static const unsigned char args[] = {
        0x02, 0x82, 0x01, 0xd6, NGX_TP_EXT_BORROWED, 0, 0, 0, 0, 0x02, 0x07
    };
    ngx_tp_bytes_t spans[] = { { (const unsigned char *) "hello", 5 } };
    int flag = 1;
    ngx_tp_task_t task = {
        { args, sizeof(args) }, spans, 1, cancelled, &flag,
        no_stream_send, no_stream_receive
    };
    rc = process(state, &task, &o.out);
    print_payload("process", rc, &o);

    spans[0] = (ngx_tp_bytes_t) { (const unsigned char *) "panic", 5 };
    rc = process(state, &task, &o.out);
    print_payload("panic", rc, &o);

    /* ("!") and ("fail"): an update's arguments are copied, never spans */
    static const unsigned char suffix[] = { 0x01, 0x81, 0x01, 0xa1, '!' };
    static const unsigned char fail[] = {
        0x01, 0x81, 0x01, 0xa4, 'f', 'a', 'i', 'l'
    };
    ngx_tp_update_t up = { 7, { suffix, sizeof(suffix) } };
    rc = update(state, &up, &o.out);
    print_payload("update", rc, &o);
    up = (ngx_tp_update_t) { 8, { fail, sizeof(fail) } };
    rc = update(state, &up, &o.out);
    print_payload("update", rc, &o);

    spans[0] = (ngx_tp_bytes_t) { (const unsigned char *) "hello", 5 };
    rc = process(state, &task, &o.out);
    print_payload("process", rc, &o);

    free_state(state);
    printf("freed\n");
    return 0;
}

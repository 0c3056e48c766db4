//! Helpers for directive setters: arguments, errors, file names.

use super::sys;
use std::ffi::c_char;

/// A configuration being parsed.
#[derive(Clone, Copy)]
pub struct Conf(*mut sys::ngx_conf_t);

impl Conf {
    /// # Safety
    /// `cf` must be the configuration nginx passed to a setter or a
    /// configuration hook, used only during that call.
    pub unsafe fn from_raw(cf: *mut sys::ngx_conf_t) -> Conf {
        Conf(cf)
    }

    pub fn raw(self) -> *mut sys::ngx_conf_t {
        self.0
    }

    /// The directive's words, name first.
    pub fn args(&self) -> Vec<&[u8]> {
        // SAFETY: during a setter cf->args is an array of ngx_str_t that
        // lives in the cycle's pool.
        unsafe {
            let args = (*self.0).args;
            let words =
                std::slice::from_raw_parts((*args).elts as *const sys::ngx_str_t, (*args).nelts);
            words.iter().map(|w| super::str_bytes(w)).collect()
        }
    }

    /// "nginx.conf:12": the current file's base name and line, as
    /// lua-nginx-module names its inline chunks.
    pub fn position(&self) -> String {
        self.position_at(self.line())
    }

    /// "nginx.conf:12" for `line` of the current file.
    pub fn position_at(&self, line: usize) -> String {
        // SAFETY: conf_file is set while a file is being parsed.
        unsafe {
            let file = (*self.0).conf_file;
            if file.is_null() {
                return "?".into();
            }
            let name = super::str_bytes(&(*file).file.name);
            let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
            format!("{}:{line}", String::from_utf8_lossy(base))
        }
    }

    /// "/etc/nginx/nginx.conf:12": the current file and line, as nginx
    /// ends its configuration errors.
    pub fn file_line(&self) -> String {
        // SAFETY: conf_file is set while a file is being parsed.
        unsafe {
            let file = (*self.0).conf_file;
            if file.is_null() {
                return "?".into();
            }
            let name = String::from_utf8_lossy(super::str_bytes(&(*file).file.name));
            format!("{name}:{}", (*file).line)
        }
    }

    /// A time in nginx's syntax (`100ms`, `5s`, `1m`) in milliseconds.
    pub fn parse_time_ms(&self, word: &[u8]) -> Option<u64> {
        let mut s = sys::ngx_str_t {
            len: word.len(),
            data: word.as_ptr() as *mut u8,
        };
        // SAFETY: ngx_parse_time only reads the string.
        let ms = unsafe { sys::ngx_parse_time(&mut s, 0) };
        u64::try_from(ms).ok()
    }

    /// A size in nginx's syntax (`512`, `16k`, `1m`) in bytes.
    pub fn parse_size(&self, word: &[u8]) -> Option<usize> {
        let mut s = sys::ngx_str_t {
            len: word.len(),
            data: word.as_ptr() as *mut u8,
        };
        // SAFETY: ngx_parse_size only reads the string.
        let size = unsafe { sys::ngx_parse_size(&mut s) };
        usize::try_from(size).ok()
    }

    /// The line nginx's tokenizer is on in the current file (0 without one).
    pub fn line(&self) -> usize {
        // SAFETY: conf_file is set while a file is being parsed.
        unsafe { (*self.0).conf_file.as_ref().map_or(0, |f| f.line) }
    }

    /// Moves nginx's line counter: past what a setter read itself, or to the
    /// line an error should name.
    pub fn set_line(&self, line: usize) {
        // SAFETY: self holds the configuration nginx passed to the running
        // setter or hook (from_raw's contract), whose conf_file is null or the
        // file being parsed.
        if let Some(f) = unsafe { (*self.0).conf_file.as_mut() } {
            f.line = line;
        }
    }

    /// The rest of the current file, from where nginx's tokenizer stopped
    /// (right after a block directive's `{`).
    pub fn reader(&self) -> ConfReader {
        // SAFETY: self holds the configuration nginx passed to the running
        // setter or hook (from_raw's contract), whose conf_file is null or the
        // file being parsed, alive while it is read.
        ConfReader(unsafe { (*self.0).conf_file })
    }

    /// `path` made absolute against the server prefix (`-p`).
    pub fn full_path(&self, path: &[u8]) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let p = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
        if p.is_absolute() {
            return p.to_path_buf();
        }
        // SAFETY: cf->cycle->prefix lives as long as the cycle.
        let prefix = unsafe { super::str_bytes(&(*(*self.0).cycle).prefix) };
        std::path::Path::new(std::ffi::OsStr::from_bytes(prefix)).join(p)
    }

    /// The setter's error return: nginx prints `"<directive>" directive
    /// <msg> in <file>:<line>`. The text is copied into the cycle's pool.
    pub fn error(&self, msg: &str) -> *mut c_char {
        // SAFETY: cf->pool is the cycle's pool; the copy is NUL-terminated.
        unsafe {
            let p = sys::ngx_pnalloc((*self.0).pool, msg.len() + 1) as *mut u8;
            if p.is_null() {
                return NGX_CONF_ERROR;
            }
            std::ptr::copy_nonoverlapping(msg.as_ptr(), p, msg.len());
            *p.add(msg.len()) = 0;
            p as *mut c_char
        }
    }

    /// Logs the module's message at emerg with the current file and line,
    /// for errors outside a directive's setter (which returns `error`).
    pub fn emerg(&self, msg: &str) {
        let msg = format!("{}{msg}", super::log::PREFIX);
        // SAFETY: "%*s" takes a size_t length and a pointer to that many
        // bytes; msg outlives the call.
        unsafe {
            sys::ngx_conf_log_error(
                sys::NGX_LOG_EMERG as usize,
                self.0,
                0,
                c"%*s".as_ptr(),
                msg.len(),
                msg.as_ptr(),
            )
        }
    }
}

/// A source of configuration bytes that refills as it is read.
pub trait Input {
    /// The unread bytes, refilled when all were consumed; empty at the end
    /// of the input.
    fn fill(&mut self) -> Result<&[u8], String>;
    /// Marks the first `n` bytes of the last `fill` as read.
    fn consume(&mut self, n: usize);
}

/// Reads a configuration file through nginx's own buffer, refilling it the
/// way ngx_conf_read_token does, so that nginx's tokenizer carries on right
/// after what was read.
pub struct ConfReader(*mut sys::ngx_conf_file_t);

impl Input for ConfReader {
    fn fill(&mut self) -> Result<&[u8], String> {
        if self.0.is_null() {
            return Ok(&[]);
        }
        // SAFETY: during a setter conf_file, its buffer (NGX_CONF_BUFFER
        // bytes from start to end, unread bytes from pos to last) and its
        // open file are nginx's, and nothing else uses them until the setter
        // returns. The dump buffer, if any, was sized for the whole file and
        // gets each byte once, as nginx appends what it reads.
        unsafe {
            let f = &mut *self.0;
            let b = &mut *f.buffer;
            if b.pos >= b.last {
                let left = f.file.info.st_size - f.file.offset;
                if left <= 0 {
                    return Ok(&[]);
                }
                let size = (left as usize).min(b.end.offset_from(b.start) as usize);
                let n = sys::ngx_read_file(&mut f.file, b.start, size, f.file.offset);
                if n < 0 {
                    return Err("cannot read the configuration file".into());
                }
                if n as usize != size {
                    return Err(format!("pread() returned only {n} bytes instead of {size}"));
                }
                b.pos = b.start;
                b.last = b.start.add(size);
                if let Some(dump) = f.dump.as_mut() {
                    std::ptr::copy_nonoverlapping(b.start, dump.last, size);
                    dump.last = dump.last.add(size);
                }
            }
            Ok(std::slice::from_raw_parts(
                b.pos,
                b.last.offset_from(b.pos) as usize,
            ))
        }
    }

    fn consume(&mut self, n: usize) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: n is at most what fill returned, so pos stays <= last.
        unsafe {
            let b = &mut *(*self.0).buffer;
            b.pos = b.pos.add(n);
        }
    }
}

pub const NGX_CONF_OK: *mut c_char = std::ptr::null_mut();
pub const NGX_CONF_ERROR: *mut c_char = usize::MAX as *mut c_char;

/// `ngx_http_cycle_get_module_main_conf`: a module's http main conf, or null
/// when the configuration has no http block.
///
/// # Safety
/// `cycle` must be a live cycle whose configuration has been parsed.
pub unsafe fn http_main_conf(
    cycle: *mut sys::ngx_cycle_t,
    module: *const sys::ngx_module_t,
) -> *mut std::ffi::c_void {
    // SAFETY: conf_ctx[ngx_http_module.index] is the http block's
    // ngx_http_conf_ctx_t (null without one); main_conf has a slot per
    // http module, indexed by ctx_index.
    unsafe {
        let ctx =
            *(*cycle).conf_ctx.add(sys::ngx_http_module.index) as *mut sys::ngx_http_conf_ctx_t;
        if ctx.is_null() {
            return std::ptr::null_mut();
        }
        *(*ctx).main_conf.add((*module).ctx_index)
    }
}

//! What a test takes from the machine for a while: a temporary prefix
//! directory and a free loopback port.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh prefix directory with conf/ and logs/.
pub fn prefix(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ngx_threadpool-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    dir
}

/// Where free_port looks: below Linux's ephemeral ports (32768 and up by
/// default), which the kernel hands to client sockets. A port taken from
/// those (bind to port 0) could be a test client's local port by the time
/// nginx binds it, beside another test: "Address already in use".
const PORTS: std::ops::Range<usize> = 20000..32000;

/// A free loopback port (bound and released), each test process walking
/// the range from a place of its own.
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let start = std::process::id() as usize * 97;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (PORTS.start + (start + n) % PORTS.len()) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

//! The thumbnail demo of nginx-conf/ (thumb.lua through the MagickWand
//! binding magick.lua): `/thumb/NAME` in a pool thread and `/thumb-inline/NAME`
//! on the event loop both return a 300×200 JPEG, and each pool thread reads
//! the watermark once, however many thumbnails it makes.

mod common;

use common::{prefix, Case, Nginx};
use std::path::PathBuf;
use std::process::Command;

const WORKERS: usize = 2;
const THREADS: usize = 2;
const LOADED: &str = "thumb: watermark loaded";

/// Images made by ImageMagick's `convert` (Debian's imagemagick), removed
/// when dropped.
struct Images(PathBuf);

impl Images {
    fn make() -> Images {
        let dir = prefix("thumbs-images");
        let convert = |args: &[&str]| {
            let st = Command::new("convert")
                .args(args)
                .status()
                .expect("convert (Debian's imagemagick: make deps) runs");
            assert!(st.success(), "convert {args:?} failed");
        };
        let photo = dir.join("photo.jpg");
        convert(&[
            "-size",
            "900x600",
            "-seed",
            "1",
            "plasma:",
            photo.to_str().unwrap(),
        ]);
        let png = dir.join("photo.png");
        convert(&[
            "-size",
            "640x480",
            "gradient:red-blue",
            png.to_str().unwrap(),
        ]);
        let mark = dir.join("watermark.png");
        convert(&["-size", "25x25", "xc:white", mark.to_str().unwrap()]);
        Images(dir)
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn location(path: &str, call: &str) -> String {
    format!(
        r#"
        location ~ ^/{path}/([\w-]+\.(?:jpg|png))$ {{
            set $image $1;
            content_by_lua_block {{
                local blob, err = {call}(ngx.var.image)
                if not blob then
                    ngx.log(ngx.WARN, "thumb: ", err)
                    return ngx.exit(ngx.HTTP_NOT_FOUND)
                end
                ngx.header.content_type = "image/jpeg"
                ngx.print(blob)
            }}
        }}"#
    )
}

fn start(images: &Images) -> Nginx {
    let main = format!(
        "thread_pool thumbs threads={THREADS};\nenv THUMB_IMAGES={};",
        images.0.display()
    );
    let http = format!(
        r#"
    lua_package_path "{repo}/lua/?.lua;{repo}/nginx-conf/?.lua;;";
    thread_pool_process_by_lua_file thumbs {repo}/nginx-conf/thumb.lua;
    server {{
        listen 127.0.0.1:$PORT;
        {pool}
        {inline}
    }}"#,
        repo = common::repo().display(),
        pool = location("thumb", "require('resty.threadpool').thumbs:push_task"),
        inline = location("thumb-inline", "require('thumb')"),
    );
    Case::new(&main).http(&http).workers(WORKERS).start()
}

/// Width and height from a JPEG's start-of-frame segment.
fn jpeg_size(b: &[u8]) -> Option<(u16, u16)> {
    if !b.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut i = 2;
    while i + 9 < b.len() {
        if b[i] != 0xFF {
            return None;
        }
        let marker = b[i + 1];
        let len = u16::from_be_bytes([b[i + 2], b[i + 3]]) as usize;
        // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
        if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
            let h = u16::from_be_bytes([b[i + 5], b[i + 6]]);
            let w = u16::from_be_bytes([b[i + 7], b[i + 8]]);
            return Some((w, h));
        }
        i += 2 + len;
    }
    None
}

#[test]
fn both_variants_make_300x200_thumbnails() {
    let images = Images::make();
    let ngx = start(&images);
    for variant in ["thumb", "thumb-inline"] {
        for name in ["photo.jpg", "photo.png"] {
            let r = ngx.get(&format!("/{variant}/{name}"));
            assert_eq!(r.status, 200, "{variant}/{name}: {}", ngx.error_log());
            assert_eq!(
                jpeg_size(&r.body),
                Some((300, 200)),
                "{variant}/{name}: not a 300x200 JPEG"
            );
        }
        // A missing original is an error the handler returns, not a crash.
        assert_eq!(ngx.get(&format!("/{variant}/missing.jpg")).status, 404);
    }
    ngx.assert_clean_log();
}

#[test]
fn pool_threads_read_the_watermark_once_each() {
    let images = Images::make();
    let ngx = start(&images);
    let pool_loads = |log: &str| {
        log.lines()
            .filter(|l| l.contains(LOADED) && l.contains("thread pool: thumbs"))
            .count()
    };
    // Every thread has run its chunk once at start.
    assert!(common::eventually(
        std::time::Duration::from_secs(10),
        || { pool_loads(&ngx.error_log()) == WORKERS * THREADS }
    ));
    for _ in 0..(4 * WORKERS * THREADS) {
        assert_eq!(ngx.get("/thumb/photo.jpg").status, 200);
    }
    let log = ngx.error_log();
    assert_eq!(pool_loads(&log), WORKERS * THREADS, "{log}");
    ngx.assert_clean_log();
}

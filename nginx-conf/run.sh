#!/usr/bin/env bash
# `make run`: nginx in the foreground on 127.0.0.1:RUN_PORT with
# nginx-conf/demo.conf, under the prefix RUN_DIR, the module at MODULE and
# cargo's output at TARGET_DIR (the Makefile passes all four). NGINX is the
# nginx to run (NGX_TP_NGINX, as the tests take it, else the one on PATH).
# Where the lua module is compiled into it (OpenResty's shape: an
# --add-module of lua-nginx-module-* or, in OpenResty's bundle, ngx_lua-*),
# the demo loads no lua module of its own, else Debian's or the one
# NGX_TP_LUA_MODULE names, as the tests do (tests/common's lua_built_in and
# lua_module_lines).
set -euo pipefail
cd "$(dirname "$0")/.."

nginx=${NGINX:-${NGX_TP_NGINX:-nginx}}
lua_modules=
if ! "$nginx" -V 2>&1 | grep -qE -- '--add-module=[^ ]*(lua-nginx-module|ngx_lua-)'; then
    lua_modules="load_module /usr/lib/nginx/modules/ndk_http_module.so; load_module ${NGX_TP_LUA_MODULE:-/usr/lib/nginx/modules/ngx_http_lua_module.so};"
fi
# As root, nginx would run its workers as nobody, who may not read a
# checkout in a private directory.
user=
[ "$(id -u)" != 0 ] || user='user root;'

mkdir -p "$RUN_DIR/conf" "$RUN_DIR/logs" "$RUN_DIR/html"
cp nginx-conf/thumbs.html "$RUN_DIR/html/"
sed -e "s#@MODULE@#$MODULE#g" -e "s#@REPO@#$PWD#g" -e "s#@TARGET@#$TARGET_DIR#g" \
    -e "s#@PORT@#$RUN_PORT#g" -e "s#@USER@#$user#g" -e "s#@LUA_MODULES@#$lua_modules#" \
    nginx-conf/demo.conf > "$RUN_DIR/conf/nginx.conf"
cp nginx-conf/*.lua "$RUN_DIR/conf/" 2>/dev/null || true

url=http://127.0.0.1:$RUN_PORT
cat <<PAGES
ngx_threadpool demo on $url/ (Ctrl-C stops it)
  curl $url/static            a static page
  curl '$url/upper?s=foo'      FOO, from a pool thread
  curl '$url/sort?n=200000'    a CPU-heavy sort, offloaded
  curl '$url/sort-inline?n=200000'  the same sort on the event loop
  curl "$url/waf/?q=1'%20OR%20'1'='1"  403 from the WAF in a pool thread
  curl "$url/waf-inline/?q=hello"    the WAF on the event loop
  curl "$url/waf-rust/?q=<script>"   the same rules in Rust (and /metrics: the shadow's counts)
  curl $url/admin/waf/rules -d id=90001 -d pattern=evil -d targets=args
       a WAF rule added live to both WAFs: /waf/?q=evil and /waf-rust/?q=evil are blocked
       (curl -X DELETE $url/admin/waf/rules: removed; docs/demo.md)
  $url/thumbs.html            thumbnails by ImageMagick in a pool thread and inline
  curl -so /dev/null -w '%{time_starttransfer} %{time_total}\\n' '$url/gzip?mb=64'
       64 MiB gzipped in a pool thread, streamed as it is made (/gzip-whole: returned whole)
  curl $url/metrics           the pools' and the accept gate's metrics
PAGES
exec "$nginx" -p "$RUN_DIR" -c conf/nginx.conf -g 'daemon off;'

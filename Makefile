# ngx_threadpool: build, test and run against Debian's nginx and lua module.

SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEB_PACKAGES := nginx nginx-dev libnginx-mod-http-lua lua-resty-core lua-cjson libpcre3 \
	libluajit2-5.1-dev libclang-dev clang pkg-config wrk \
	imagemagick libmagickwand-6.q16-6 python3-prometheus-client
MODULE := target/release/libngx_threadpool.so
RUN_DIR := $(CURDIR)/target/run
# As root, nginx would run its workers as nobody, who may not read a
# checkout in a private directory.
RUN_USER := $(shell [ "$$(id -u)" = 0 ] && echo 'user root;')

.PHONY: deps build test lint run images bench bench-deps fairness valgrind clean

# Installs the Debian packages that are missing (apt-get update only then).
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	cargo build --release

test: build
	cargo test --release -- --test-threads=2

lint:
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings

# nginx in the foreground on 127.0.0.1:8080 with nginx-conf/demo.conf.
run: build images
	@mkdir -p $(RUN_DIR)/conf $(RUN_DIR)/logs $(RUN_DIR)/html
	@cp nginx-conf/thumbs.html $(RUN_DIR)/html/
	@sed -e 's#@MODULE@#$(CURDIR)/$(MODULE)#g' -e 's#@REPO@#$(CURDIR)#g' \
		-e "s#@USER@#$(RUN_USER)#g" \
		nginx-conf/demo.conf > $(RUN_DIR)/conf/nginx.conf
	@cp nginx-conf/*.lua $(RUN_DIR)/conf/ 2>/dev/null || true
	@echo "ngx_threadpool demo on http://127.0.0.1:8080/ (Ctrl-C stops it)"
	@echo "  curl http://127.0.0.1:8080/static            a static page"
	@echo "  curl 'http://127.0.0.1:8080/upper?s=foo'      FOO, from a pool thread"
	@echo "  curl 'http://127.0.0.1:8080/sort?n=200000'    a CPU-heavy sort, offloaded"
	@echo "  curl 'http://127.0.0.1:8080/sort-inline?n=200000'  the same sort on the event loop"
	@echo "  curl \"http://127.0.0.1:8080/waf/?q=1'%20OR%20'1'='1\"  403 from the WAF in a pool thread"
	@echo "  curl \"http://127.0.0.1:8080/waf-inline/?q=hello\"    the WAF on the event loop"
	@echo "  http://127.0.0.1:8080/thumbs.html            thumbnails by ImageMagick in a pool thread and inline"
	nginx -p $(RUN_DIR) -c conf/nginx.conf -g 'daemon off;'

# The thumbnail demo's images, made once by ImageMagick (no downloads):
# three 2400x1600 originals and a 25x25 watermark. IMAGES=DIR puts them
# elsewhere (tests and make fairness use their own prefix).
IMAGES ?= $(RUN_DIR)/images
images: deps $(IMAGES)/watermark.png
$(IMAGES)/watermark.png:
	@mkdir -p $(IMAGES)
	for i in 1 2 3; do convert -size 2400x1600 -seed $$i plasma:blue-green $(IMAGES)/photo$$i.jpg; done
	convert -size 25x25 xc:none -fill 'rgba(255,255,255,0.8)' -draw 'circle 12,12 12,2' $@

# The benchmark's own Debian packages (plots); make test does not need them.
bench-deps:
	@$(MAKE) --no-print-directory deps DEB_PACKAGES=python3-matplotlib

# push_task vs inline Lua vs ngx.run_worker_thread on loopback: writes
# bench/REPORT.md and bench/*.png. ~10 minutes; QUICK=1 for a ~1 minute smoke
# run. System python3, for Debian's matplotlib.
bench: build bench-deps
	QUICK=$(QUICK) /usr/bin/python3 bench/run.py

# The talk's timeout table, scaled (Direct, Thread, Thread + reuseport by
# load): writes bench/FAIRNESS.md and bench/fairness_*.png. ~8 minutes;
# QUICK=1 for a ~2 minute smoke run.
fairness: build bench-deps
	@$(MAKE) --no-print-directory deps
	QUICK=$(QUICK) /usr/bin/python3 bench/fairness.py

# Requests ending under their tasks (tests/lifetime.rs, scenarios a-d) in one
# nginx process under valgrind's memcheck; fails on any memory error or
# definite leak not in tests/valgrind.supp. ~1 minute; not part of make test.
valgrind: build
	@$(MAKE) --no-print-directory deps DEB_PACKAGES=valgrind
	cargo test --release --test lifetime -- --ignored --nocapture abort_scenarios_under_valgrind

clean:
	cargo clean

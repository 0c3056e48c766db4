# ngx_threadpool: build, test and run against Debian's nginx and lua module.

SHELL := /bin/bash
# The Debian packages of the build, the tests and the demo, on any Debian
# release: `a|b` names one package that releases call differently, the
# first apt knows is taken (matrix/deps.sh). LuaJIT's headers are those of
# the LuaJIT the lua module links: OpenResty's fork, libluajit2-5.1-dev on
# Debian 12 (whose libluajit-5.1-dev is another LuaJIT), libluajit-5.1-dev
# from Debian 13 on. imagemagick brings the MagickWand library the
# thumbnail demo loads, libnginx-mod-http-lua the PCRE its ngx.re uses.
DEB_PACKAGES = nginx nginx-dev libnginx-mod-http-lua lua-resty-core lua-cjson \
	'libluajit2-5.1-dev|libluajit-5.1-dev' \
	libclang-dev clang pkg-config wrk gcc libc6-dev make git ca-certificates python3 procps \
	imagemagick python3-prometheus-client dpkg-dev debhelper binutils lua-check luarocks
# cargo's output: target/, or CARGO_TARGET_DIR (matrix/chroot.sh sets it per
# release, so that each release's build and package stay apart). Absolute:
# nginx resolves a relative load_module path against its prefix.
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
MODULE := $(TARGET_DIR)/release/libngx_threadpool.so

.PHONY: deps build test publish-check dist dist-check test-stress test-perturb test-luajit-assert test-trixie test-forky test-openresty test-lua-releases deb-test test-matrix lint fuzz run images bench bench-deps bench-trixie bench-compare fairness valgrind \
	clean install install-files uninstall deb soak soak-test soak-short soak-inject

# Installs the Debian packages that are missing (apt-get update only then).
deps:
	@matrix/deps.sh $(DEB_PACKAGES)

build: deps
	cargo build --release

test: build
	cargo test --release -- --test-threads=2
	cargo test --release -p ngx_threadpool_handler -p waf-rust
	@$(MAKE) --no-print-directory soak-test soak-short

# The two crates as crates.io would take them: cargo packages wire/ and
# handler/ and builds each package alone, the handler against the wire
# package (cargo publish --dry-run: crates.io's index is read, nothing is
# uploaded; --allow-dirty, so that uncommitted work can be checked). Into
# target/package/; ~10 s once the crates.io dependencies are built. In
# make test-matrix, once on this machine: it needs crates.io's index, which
# the chroots of the other releases do not reach.
publish-check:
	cargo publish --dry-run --allow-dirty -p ngx_threadpool_wire -p ngx_threadpool_handler

# The source release: TARGET_DIR/dist/ngx_threadpool-VERSION.tar.gz, under
# ngx_threadpool-VERSION/: the files of the commit checked out (git
# archive HEAD; uncommitted changes are not in it), and every crate
# Cargo.lock names, vendored (cargo vendor: vendor/ and the
# .cargo/config.toml that builds from it), so that it builds without
# crates.io (docs/installation.md, "From the source tarball"). Made again
# from scratch each time, with the commit's time on every file.
# The one version ([workspace.package] in Cargo.toml).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DIST = $(TARGET_DIR)/dist/ngx_threadpool-$(VERSION).tar.gz
DIST_STAGE = $(TARGET_DIR)/dist/stage
dist:
	@git diff --quiet HEAD || echo "dist: uncommitted changes are not in the tarball (HEAD's files)" >&2
	@! grep -q '^repository = "https://github.com/OWNER/' Cargo.toml || \
		echo "dist: the repository's OWNER is not filled in yet (docs/installation.md: Publishing a release)" >&2
	rm -rf $(DIST_STAGE) && mkdir -p $(DIST_STAGE)
	git archive --prefix=ngx_threadpool-$(VERSION)/ HEAD | tar -x -C $(DIST_STAGE)
	cd $(DIST_STAGE)/ngx_threadpool-$(VERSION) && mkdir .cargo && \
		cargo vendor --locked vendor > .cargo/config.toml
	tar -C $(DIST_STAGE) --sort=name --mtime=@$$(git log -1 --format=%ct) \
		--owner=0 --group=0 --numeric-owner -c ngx_threadpool-$(VERSION) | gzip -n > $(DIST)
	rm -rf $(DIST_STAGE)
	@echo $(DIST)

# The tarball built in a directory of its own as the README's Install
# says (make build, make install with DESTDIR), offline (its vendored
# crates only), and the module loaded by nginx -t (tests/dist.sh). cargo's
# output is kept outside the checkout (/var/cache/ngx-threadpool/dist, or
# TARGET_DIR/dist/cache where that cannot be written): ~2 minutes once the
# vendored crates are built there (the module and its bindings are built
# every time), ~5 the first time.
dist-check: dist
	@TARBALL=$(DIST) VERSION=$(VERSION) FALLBACK=$(TARGET_DIR)/dist/cache MAKE="$(MAKE)" tests/dist.sh

# make test N times (5 by default) while two CPU-bound processes, started
# and stopped with it, keep the cores busy: the suite's verdicts must not
# depend on the machine's load. Fails on any red run, naming its failing
# tests; each run's output in target/stress/run-K.log (tests/stress.sh).
N ?= 5
test-stress: build
	@MAKE="$(MAKE)" bash tests/stress.sh $(N)

# The whole suite with glibc's MALLOC_PERTURB_ set for nginx (PERTURB, a
# byte, 165 by default): each block malloc hands out is filled with the
# byte's complement and each freed one with the byte, so that a read of
# memory not written yet, or already freed, reads garbage and fails a
# check instead of passing by luck. Only nginx gets it
# (NGX_TP_MALLOC_PERTURB: tests/common/env.rs), not cargo.
PERTURB ?= 165
test-perturb: build
	NGX_TP_MALLOC_PERTURB=$(PERTURB) cargo test --release -- --test-threads=2

# The foundation tests (LUA_RELEASE_TESTS below) and tests/faults.rs with a
# LuaJIT built with its assertions and C API checks (LUA_USE_ASSERT,
# LUA_USE_APICHECK) in place of Debian's for nginx: OpenResty's LuaJIT
# 2.1-20251030 from NGX_TP_UPSTREAM, built once into
# target/luajit-assert (matrix/luajit-assert.sh) and given to nginx by
# LD_LIBRARY_PATH (NGX_TP_LUAJIT). A failed assertion aborts the worker,
# which fails its test.
test-luajit-assert: build
	luajit=$$(matrix/luajit-assert.sh) && NGX_TP_LUAJIT=$$luajit \
		cargo test --release $(LUA_RELEASE_TESTS:%=--test %) --test faults -- --test-threads=2

# The same suite on the other targets of the README's support table, each
# in a chroot made with debootstrap from the Debian archive of this
# machine's apt sources and kept under /var/cache/ngx-threadpool, reused by
# the next run (a missing or unfinished one is made again;
# matrix/chroot.sh): Debian 13 (test-trixie) and Debian testing
# (test-forky). A release's row ends with its package (make deb: built in a
# fresh chroot of the release) installed into another fresh chroot of the
# release (deb-test). Root only (chroot, mounts).
CHROOT_RELEASES := trixie forky
$(CHROOT_RELEASES:%=test-%): test-%:
	RELEASE=$* matrix/chroot.sh 'make test'
	@$(MAKE) --no-print-directory deb-test RELEASE=$* CARGO_TARGET_DIR=$(CURDIR)/target/$*
# The package of RELEASE (make deb) installed with apt-get into a fresh
# debootstrap chroot of that release, which serves docs/configuration.md's
# example through it (matrix/deb-install.sh).
HOST_RELEASE := $(shell . /etc/os-release 2>/dev/null && echo $$VERSION_CODENAME)
RELEASE ?= $(HOST_RELEASE)
deb-test: deb
	RELEASE=$(RELEASE) FRESH=1 matrix/chroot.sh \
		'matrix/deb-install.sh $(TARGET_DIR)/debian/$(DEB_PKG)_*.deb'
# OpenResty 1.31.1.1's nginx as OpenResty builds it (lua-nginx-module
# 0.10.31rc5 and ngx_devel_kit compiled in, its own LuaJIT and lualib), from
# the source tarballs in NGX_TP_UPSTREAM (default ../shared/upstream) alone,
# natively (matrix/openresty.sh, kept under /var/cache/ngx-threadpool). The
# module is built against that nginx's own patched tree and `nginx -V`
# flags, as OpenResty's users build it; the whole suite runs against it.
OPENRESTY_PACKAGES := libpcre2-dev zlib1g-dev libssl-dev patch xz-utils
test-openresty:
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(DEB_PACKAGES) $(OPENRESTY_PACKAGES)"
	nginx=$$(matrix/openresty.sh) && NGX_TP_NGINX=$$nginx \
		NGX_SRC=$${nginx%/sbin/nginx}/src CARGO_TARGET_DIR=$$PWD/target/openresty $(MAKE) test
# The other lua-nginx-module releases of the supported range (Cargo.toml's
# package.metadata.lua-nginx-module): each built by matrix/lua-module.sh as
# a dynamic module for Debian 12's nginx, with its own lua-resty-core, and
# kept under /var/cache/ngx-threadpool/lua-module (~1 minute each, cold).
LUA_RELEASES := 0.10.24 0.10.25 0.10.26 0.10.27 0.10.29 0.10.31 0.10.32rc2
# The foundation part of the suite, run against Debian's nginx with each of
# them: the README synopsis (readme); push_task, push_tasks, post_task and
# push_stream (basic, batch, post, stream); requests ending under their
# tasks (lifetime, cancel); reload and quit (lifecycle); every phase and
# context a push is made from, or refused in (phases). Then, a few seconds
# more, where releases differ most for pool threads: the release's
# lua-resty-core required in them (require), the ngx API and ngx.re there
# as on the event loop (parity_api, parity_re: PCRE 8 up to 0.10.25, PCRE2
# after). ~1 minute a release; the whole suite would take 3-6.
LUA_RELEASE_TESTS := readme basic batch post stream lifetime cancel lifecycle phases \
	require parity_api parity_re
# PCRE 8's headers (0.10.24 and 0.10.25 use its API) and ngx_devel_kit's.
LUA_RELEASE_PACKAGES := libpcre3-dev libnginx-mod-http-ndk-dev
# The test binaries are make test's (the same nginx tree and target/): only
# the lua module loaded changes (matrix/lua-releases.sh).
test-lua-releases: build
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(LUA_RELEASE_PACKAGES)"
	LUA_RELEASES="$(LUA_RELEASES)" LUA_RELEASE_TESTS="$(LUA_RELEASE_TESTS)" matrix/lua-releases.sh
# Every row, one after the other (.ci/run): the quick ones first; the
# source tarball after the host's suite.
test-matrix: test publish-check dist-check test-lua-releases deb-test test-openresty test-trixie test-forky

# The project's Lua with luacheck (settings and globals in .luacheckrc).
LUA_SOURCES := lua src/vm bench tests/fixtures nginx-conf soak

# MISUSE_CALLS random calls of the module's C functions in one worker
# (tests/misuse.rs; make test makes 6,000). Then the codec against
# FUZZ_INPUTS generated inputs (tests/fuzz/): round trips of random Lua
# values, and mutated, near-valid and random payloads for the decoder, in
# one process per CPU (FUZZ_JOBS). 5-10 minutes on 2 cores; make test runs
# 300,000 of them.
FUZZ_INPUTS ?= 10000000
MISUSE_CALLS ?= 200000
fuzz: deps
	MISUSE_CALLS=$(MISUSE_CALLS) cargo test --release --test misuse -- --exact \
		random_calls_leave_the_worker_alive_serving_and_flat --nocapture
	FUZZ_INPUTS=$(FUZZ_INPUTS) cargo test --release --test fuzz -- --exact fuzz --nocapture

# rustfmt, clippy, luacheck, and the docs: links, and a reference entry for
# every directive and Lua function (docs/check.py).
lint: deps
	cargo fmt --all --check
	cargo clippy --release --all-targets --workspace -- -D warnings
	luacheck --no-color $(LUA_SOURCES)
	/usr/bin/python3 -B docs/check.py

# nginx in the foreground on 127.0.0.1:RUN_PORT with nginx-conf/demo.conf,
# under the prefix RUN_DIR (nginx-conf/run.sh: which nginx, which lua
# module).
RUN_DIR ?= $(CURDIR)/target/run
RUN_PORT ?= 8080
run: build images
	cargo build --release -p waf-rust
	@RUN_DIR=$(RUN_DIR) RUN_PORT=$(RUN_PORT) MODULE=$(MODULE) TARGET_DIR=$(TARGET_DIR) \
		NGINX="$(NGINX)" NGX_TP_LUA_MODULE="$(NGX_TP_LUA_MODULE)" \
		exec nginx-conf/run.sh

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
# bench/REPORT.md and bench/*.png. ~15 minutes; QUICK=1 for a ~1 minute smoke
# run. System python3, for Debian's matplotlib. The Rust pools' handlers: the
# WAF's and the hand-off section's (bench/rust-upper).
bench: build bench-deps
	cargo build --release -p waf-rust -p bench-upper
	QUICK=$(QUICK) /usr/bin/python3 bench/run.py

# The hand-off section on Debian 13 (lua-nginx-module 0.10.28 and its
# run_worker_thread), in the chroot of make test-trixie: writes
# bench/results-debian13.json, then renders REPORT.md again with it as a
# section of its own beside this machine's last run (or puts the section
# into REPORT.md as it is, where this machine has no run). ~8 minutes;
# QUICK=1.
bench-trixie:
	matrix/chroot.sh 'make bench-deps build && cargo build --release -p bench-upper -p waf-rust && \
		QUICK=$(QUICK) python3 bench/run.py --sections handoff --results bench/results-debian13.json'
	/usr/bin/python3 bench/report.py

# The hand-off cells of BASE (a git revision, checked out and built in a
# worktree under target/) against the working tree, the two alternating:
# per cell both medians, their spread, their ratio and the median of the
# rounds' ratios. ~12 minutes with the default 5 rounds; ROUNDS=N, QUICK=1
# for 200 ms cells, CELLS=PATTERNS for some cells only (bench/compare.py).
bench-compare: build
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<rev> [ROUNDS=5] [QUICK=1] [CELLS=tp|8|16,...]" >&2; exit 2; }
	cargo build --release -p bench-upper
	QUICK=$(QUICK) ROUNDS=$(ROUNDS) CELLS="$(CELLS)" /usr/bin/python3 bench/compare.py $(BASE)

# The talk's timeout table, scaled (Direct, Thread, Thread + reuseport by
# load): writes bench/FAIRNESS.md and bench/fairness_*.png. ~8 minutes;
# QUICK=1 for a ~2 minute smoke run.
fairness: build bench-deps
	@$(MAKE) --no-print-directory deps
	cargo build --release -p bench-overload-client
	QUICK=$(QUICK) /usr/bin/python3 bench/fairness.py

# Requests ending under their tasks (tests/lifetime.rs, scenarios a-d; the
# abort paths of a C and a Rust native pool, tests/native.rs and
# tests/rust_handler.rs; streams whose caller goes away, tests/stream.rs;
# wake-ups no one took, tests/wakeups.rs)
# in one nginx process under valgrind's memcheck;
# fails on any memory error or definite leak not in tests/valgrind.supp.
# A few minutes; not part of make test.
valgrind: build
	@$(MAKE) --no-print-directory deps DEB_PACKAGES=valgrind
	cargo test --release --test lifetime -- --ignored --nocapture abort_scenarios_under_valgrind
	cargo test --release --test native -- --ignored --nocapture native_abort_scenarios_under_valgrind
	cargo test --release --test rust_handler -- --ignored --nocapture rust_abort_scenarios_under_valgrind
	cargo test --release --test stream -- --ignored --nocapture stream_endings_under_valgrind
	cargo test --release --test wakeups -- --ignored --nocapture the_races_under_valgrind
	cargo test --release --test updates -- --ignored --nocapture updates_under_valgrind

# One nginx with 2 workers and every feature at once under a bounded
# loopback load, a reload every 30 s, for MINUTES minutes: writes
# bench/SOAK.md and bench/soak.png, exits non-zero on a lost or unexpected
# answer, a crash line or growth past its bounds (docs/testing.md, "Soak").
MINUTES ?= 30
soak: build bench-deps
	/usr/bin/python3 -B soak/soak.py --minutes $(MINUTES)

# The soak's own logic, without nginx (~1 s).
soak-test:
	/usr/bin/python3 -B -m unittest discover -s soak -p 'test_*.py'

# A 40 s soak (one reload) into a temporary directory (~50 s).
soak-short: build
	@out=$$(mktemp -d); /usr/bin/python3 -B soak/soak.py --seconds 40 --out $$out; \
	rc=$$?; rm -rf $$out; exit $$rc

# Each fault of soak.py --inject in a 40 s soak, which must fail (~4 minutes).
SOAK_FAULTS := crash drop leak_fd leak_mem
soak-inject: build
	@for f in $(SOAK_FAULTS); do \
		out=$$(mktemp -d); \
		/usr/bin/python3 -B soak/soak.py --seconds 40 --inject $$f --out $$out > $$out/run.log 2>&1; \
		rc=$$?; grep -A20 'FAIL: ' $$out/run.log | sed "s/^/[$$f] /"; rm -rf $$out; \
		if [ $$rc -eq 0 ]; then echo "the soak passed with the fault $$f injected" >&2; exit 1; fi; \
	done; echo "the soak failed on each fault: $(SOAK_FAULTS)"

clean:
	cargo clean

# Installed as Debian installs its nginx modules (libnginx-mod-http-lua):
# the module in nginx's modules directory, named ngx_http_<name>_module.so
# after the package; the Lua shim beside lua-resty-core's files; a
# load_module snippet in modules-available, enabled by a link whose number
# sorts after 50-mod-http-lua.conf (this module needs the lua module loaded
# first). DESTDIR stages the files elsewhere (debian/rules does).
NAME := threadpool
MODULES_DIR := /usr/lib/nginx/modules
MODULE_SO := ngx_http_$(NAME)_module.so
LUA_DIR := /usr/share/lua/5.1
MODULES_AVAILABLE := /usr/share/nginx/modules-available
MODULES_ENABLED := /etc/nginx/modules-enabled
SNIPPET := mod-http-$(NAME).conf
ENABLED := 60-$(SNIPPET)
NGX_SRC ?= /usr/share/nginx/src

$(MODULE):
	@$(MAKE) --no-print-directory build

install: install-files
	install -d -m 0755 $(DESTDIR)$(MODULES_ENABLED)
	ln -sfn $(MODULES_AVAILABLE)/$(SNIPPET) $(DESTDIR)$(MODULES_ENABLED)/$(ENABLED)

# The files alone (0644, readable by nginx's worker user), without the link.
install-files: $(MODULE)
	install -d -m 0755 $(DESTDIR)$(MODULES_DIR) $(DESTDIR)$(MODULES_AVAILABLE) \
		$(DESTDIR)$(LUA_DIR)/resty
	install -m 0644 $(MODULE) $(DESTDIR)$(MODULES_DIR)/$(MODULE_SO)
	install -m 0644 lua/resty/$(NAME).lua $(DESTDIR)$(LUA_DIR)/resty/
	install -m 0644 packaging/$(SNIPPET) $(DESTDIR)$(MODULES_AVAILABLE)/

uninstall:
	rm -f $(DESTDIR)$(MODULES_ENABLED)/$(ENABLED) \
		$(DESTDIR)$(MODULES_AVAILABLE)/$(SNIPPET) \
		$(DESTDIR)$(MODULES_DIR)/$(MODULE_SO) \
		$(DESTDIR)$(LUA_DIR)/resty/$(NAME).lua

# The Debian package of RELEASE (default: this machine's) from debian/,
# built by dpkg-buildpackage in a fresh chroot of the release with only its
# build dependencies, the crates vendored, and checked by the release's
# lintian (packaging/deb.sh): TARGET_DIR/debian/DEB_PKG_VERSION_ARCH.deb.
# Root (chroot, mounts): run as another user, it asks sudo for that part.
DEB_PKG := $(shell sed -n 's/^Source: //p' debian/control)
deb:
	RELEASE=$(RELEASE) OUT=$(TARGET_DIR)/debian packaging/deb.sh

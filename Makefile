# dqoes-cg: set-up, demo, tests and installation. Every target works on a fresh Debian 12 machine,
# from a checkout anywhere (make -C DIR, or make -f DIR/Makefile).
PYTHON ?= python3
PREFIX ?= /usr/local
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
C_SOURCES = $(wildcard $(ROOT)/csrc/*.[ch] $(ROOT)/lab/guest/*.c $(ROOT)/bench/*.c)

.PHONY: deps demo test test-swarm lint install install-package install-unit uninstall \
	probe install-probe

# System packages for the real-kernel guest, then the package itself (editable) with its extras.
deps:
	bash $(ROOT)/lab/guest/install-deps
	cd $(ROOT) && $(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test,bench,lab]' \
	    -e probe

# The demo runs here if this host has cgroup v2 with the cpu controller (its workers Docker
# containers if an engine answers, else processes), else in a qemu guest with a real kernel,
# systemd and Docker's engine (lab/guest), which may write only to DEMO_OUT.
DEMO_OUT ?= $(ROOT)/demo-output
demo: deps
	@mkdir -p $(DEMO_OUT)
	@cd $(ROOT) && out=$$(realpath $(DEMO_OUT)) && redraw=$$([ -t 1 ] && echo --redraw); \
	if $(PYTHON) -c 'from lab.cgroups import cgroup2_cpu_mount as m; exit(m() is None)'; then \
		$(PYTHON) -m lab.demo --out $$out $$redraw; \
	else \
		echo "This host has no cgroup v2 cpu controller: the demo runs in a qemu guest (real Linux kernel, systemd and Docker's engine, emulated CPUs; booting takes a few seconds)."; \
		$(PYTHON) -m lab.guest --systemd --writable $$out -- $(PYTHON) -m lab.demo --out $$out $$redraw; \
	fi

# The Python linter and the C style (.clang-format), then every test.
lint:
	cd $(ROOT) && $(PYTHON) -m ruff check --quiet .
	clang-format --style=file:$(ROOT)/.clang-format --dry-run --Werror $(C_SOURCES)

test: deps lint
	cd $(ROOT) && $(PYTHON) -m pytest -q -rs

# All the multi-node Swarm tests (their own guest, 48 minutes once on a loaded host); `make test`
# runs their smoke test only (marker swarm_smoke).
test-swarm: deps
	cd $(ROOT) && DQOES_SWARM_TESTS=1 $(PYTHON) -m pytest -q -rs -m guest_swarm

# --- the producer alone (dqoes-probe: pure Python, no dependency), for a service's image ------
# Its wheel in $(PROBE_DIST) (copy it into an image: `pip install dqoes_probe-*.whl`), then
# installed for $(PYTHON). Offline: PIP_FLAGS=--no-build-isolation.
PROBE_DIST ?= $(ROOT)/probe/dist
probe:
	$(PYTHON) -m pip wheel -q --no-deps --disable-pip-version-check $(PIP_FLAGS) \
	    -w $(PROBE_DIST) $(ROOT)/probe

install-probe: probe
	$(PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore \
	    --force-reinstall --no-deps --no-index --find-links $(PROBE_DIST) dqoes-probe

# --- dqoesd and the cluster's services (run as root; see README, "Running it as a service"
# and "The cluster") ------------------------------------------------------------------------
# Each has systemd/NAME.service and its options file systemd/NAME.default.
SERVICES = dqoesd dqoes-agent dqoes-manager
UNITDIR ?= /etc/systemd/system
STATEDIR ?= /var/lib/dqoes
RUNDIR ?= /run/dqoes
DEFAULTDIR ?= /etc/default
# Where Docker finds the dqoes volume driver (dqoesd serves it on $(RUNDIR)/plugin.sock).
DOCKER_PLUGINS ?= /etc/docker/plugins
# What pip installs: this checkout, or a wheel built elsewhere (`pip wheel .`).
PACKAGE ?= $(ROOT)
PIP_FLAGS ?=
# Where pip puts the console scripts of $(PYTHON).
SCRIPTS := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
SYSTEMD_RUNNING = test -d /run/systemd/system

# The package for $(PYTHON), its scripts on $(PREFIX)/bin, the state directory, the units
# (ExecStart: the installed script), their options files and Docker's spec file of the
# volume driver; systemd creates $(RUNDIR). Nothing is enabled or started.
install: install-package install-unit
	! $(SYSTEMD_RUNNING) || systemctl daemon-reload
	@echo "dqoesd installed: systemctl enable --now dqoesd; options in $(DEFAULTDIR)/dqoesd"
	@echo "On a Swarm: systemctl enable --now dqoes-agent on every node, dqoes-manager on a" \
	    "manager node; options in $(DEFAULTDIR)/dqoes-agent, $(DEFAULTDIR)/dqoes-manager"

install-package:
	$(PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore \
	    $(PIP_FLAGS) $(PACKAGE)
	install -d -m 0755 $(PREFIX)/bin
	for s in dqoesd dqoesctl dqoes-agent dqoes-manager; do \
	    [ "$(SCRIPTS)" = "$(PREFIX)/bin" ] || ln -sf $(SCRIPTS)/$$s $(PREFIX)/bin/$$s; done
	install -d -m 0700 $(STATEDIR)

install-unit:
	install -d -m 0755 $(UNITDIR) $(DEFAULTDIR)
	set -e; for s in $(SERVICES); do \
	    sed "s|^ExecStart=[^ ]*|ExecStart=$(SCRIPTS)/$$s|" $(ROOT)/systemd/$$s.service \
	        > $(UNITDIR)/$$s.service.tmp; \
	    chmod 0644 $(UNITDIR)/$$s.service.tmp; \
	    mv $(UNITDIR)/$$s.service.tmp $(UNITDIR)/$$s.service; \
	    [ -e $(DEFAULTDIR)/$$s ] || \
	        install -m 0644 $(ROOT)/systemd/$$s.default $(DEFAULTDIR)/$$s; \
	done
	install -d -m 0755 $(DOCKER_PLUGINS)
	echo "unix://$(RUNDIR)/plugin.sock" > $(DOCKER_PLUGINS)/dqoes.spec

# Stop the services (dqoesd gives every container its limit back) and remove what install
# put in place; an options file that was edited is kept. One unit at a time: one that is
# not installed (an older install) does not keep the others running.
uninstall:
	! $(SYSTEMD_RUNNING) || for s in $(SERVICES); do \
	    systemctl disable --now $$s.service || true; done
	rm -f $(SERVICES:%=$(UNITDIR)/%.service)
	! $(SYSTEMD_RUNNING) || systemctl daemon-reload
	for s in dqoesd dqoesctl dqoes-agent dqoes-manager; do \
	    [ ! -L $(PREFIX)/bin/$$s ] || rm -f $(PREFIX)/bin/$$s; done
	for s in $(SERVICES); do \
	    ! cmp -s $(ROOT)/systemd/$$s.default $(DEFAULTDIR)/$$s || rm -f $(DEFAULTDIR)/$$s; done
	rm -f $(DOCKER_PLUGINS)/dqoes.spec
	# not into the ring volumes of containers still running (tmpfs mounts of their own)
	rm -rf --one-file-system $(STATEDIR) $(RUNDIR)
	$(PYTHON) -m pip uninstall -q -y --root-user-action=ignore dqoes-cg

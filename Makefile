# dqoes-cg: set-up, demo, tests and installation. Every target works on a fresh Debian 12 machine.
PYTHON ?= python3
PREFIX ?= /usr/local

.PHONY: deps demo test install uninstall

# System packages for the real-kernel guest, then the package itself (editable) with its extras.
deps:
	bash tests/guest/install-deps
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test,bench]'

demo: deps
	$(PYTHON) -m dqoes_cg.demo

test: deps
	$(PYTHON) -m pytest -q -rs

# make demo   - the main job end to end on the built-in sandbox host
# make check  - lint, unit tests, ansible-test sanity (the inner loop, a few minutes)
# make test   - all of it (what CI runs): the check tier, the Molecule scenarios and the integration
#               tests, two parts at a time by tools/test_suite.py from tests/parts.yml, ending with a
#               table of each part's wall time
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_HOME := $(CURDIR)/.ansible
# Ansible's per-run scratch folders outside the clone: `ansible-galaxy collection build` (lint, sanity) lists
# every file of the clone, and another part's run removing its folder meanwhile stopped the build
# ("Unknown error processing manifest directive: [Errno 2] No such file or directory").
export ANSIBLE_LOCAL_TEMP := $(or $(TMPDIR),/tmp)/gpu-fleet-ansible-local
export ANSIBLE_FORCE_COLOR ?= 0
STANDINS := build/standins
PYTEST_UNIT := tests/unit
# The collection's version, from galaxy.yml (the one place it is written).
VERSION := $(shell sed -n 's/^version: *//p' galaxy.yml)
EE_TAG ?= gpu-fleet-tf-hosts-ee:$(VERSION)
# The execution environment's base image (execution-environment.yml's, unless given).
EE_BASE_IMAGE ?=

.PHONY: help deps venv image standins sandbox demo demo-clean wheelhouse check lint unit sanity docs molecule integration test bench locks ee-context ee changelog release clean

help:
	@echo "make demo        provision and verify the sandbox host, print the fleet report"
	@echo "make demo-clean  remove the sandbox container"
	@echo "make check       lint, unit and sanity, with a table of their times (the inner loop)"
	@echo "make test        everything (what CI runs), two parts at a time, with a table of each part's time"
	@echo "make lint        yamllint, ansible-lint (production), ruff, antsibull-changelog lint"
	@echo "make unit        pytest tests/unit"
	@echo "make sanity      ansible-test sanity on the built and installed collection, under ansible-core 2.16 (tools/sanity.sh --core 2.21: the newest)"
	@echo "make molecule    the Molecule scenarios alone (tests/parts.yml), one after another"
	@echo "make integration the integration tests alone (collection, bad input, interrupted, reports, air-gap, ...)"
	@echo "make bench       timings on fresh sandbox hosts against the fleet targets (minutes; by hand)"
	@echo "make locks       the venvs' dependency locks in data/locks/ from data/locks/targets.yml (uv, PyPI)"
	@echo "make docs        the collection's docs site, as Ansible's docs site renders it, in build/docs/build/html"
	@echo "make changelog   at release: the fragments into changelogs/changelog.yaml and CHANGELOG.md"
	@echo "make release REPOSITORY=https://...  the tarball to publish (build/release), checked by Galaxy's importer"
	@echo "make ee-context  the execution environment's build context (ansible-builder create)"
	@echo "make ee          the AWX/Automation Platform execution environment image (needs podman)"
	@echo "make clean       remove build outputs, reports, Ansible's local state and the test hosts' snapshots"
	@echo "Building blocks (the targets above run them as needed):"
	@echo "make deps        apt packages: podman, runc, debootstrap, makeself, gcc, xz-utils, chromium, python3-venv; promtool"
	@echo "make venv        the controller's Python venv .venv with requirements.txt"
	@echo "make image       the sandbox's Debian 12 and Debian 13 images (debootstrap; once)"
	@echo "make standins    the stand-ins for NVIDIA's installers under build/ (the sandbox's of NVIDIA's real files)"
	@echo "make sandbox     start the sandbox container gpu-sandbox"
	@echo "make wheelhouse  the wheels of the locks the test hosts install, once (build/wheelhouse)"

deps:
	tools/install-host-deps.sh

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

venv: deps $(VENV)/.installed

image: deps
	tools/build-sandbox-image.sh
	tools/build-sandbox-image.sh localhost/gpu-sandbox-debian:13

# build/standins: the sandbox's, its CUDA 11.8.0 runfile and cuDNN 8.6.0.163 archive made of NVIDIA's
# real files (downloaded once per machine into the test cache, tests/fixtures/nvidia/nvidia_files.py);
# build/standins-small: the same names built from the stand-in sources, for the tests of the roles' logic.
standins: deps
	python3 tests/fixtures/nvidia/build_standins.py --out $(STANDINS) --nvidia-files
	python3 tests/fixtures/nvidia/build_standins.py --out $(STANDINS)-small --debs none
	python3 tests/fixtures/nvidia/build_standins.py --out $(STANDINS)-multi --debs none --driver 555.42.06 \
	    --cuda 11.8.0:520.61.05:11.8.89:11.8.20220929 --cuda 12.5.1:555.42.06:12.5.82 \
	    --cudnn 8.6.0.163:11 --cudnn 9.3.0.75:12

sandbox: image
	tools/sandbox.sh up

demo: venv standins sandbox
	$(BIN)/ansible-playbook site.yml -i inventories/sandbox
	@echo
	@cat reports/sandbox/latest/fleet-report.md
	@echo
	@echo "Fleet report (JSON, Markdown, HTML, JUnit): $(CURDIR)/reports/sandbox/$$(readlink reports/sandbox/latest)/"

demo-clean:
	tools/sandbox.sh down

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/antsibull-changelog lint
	tools/lint-collection-docs.sh

unit: venv standins
	$(BIN)/pytest -q $(PYTEST_UNIT)

sanity: venv
	tools/sanity.sh

# The docs site (antsibull-docs sphinx-init's layout): the reStructuredText from the collection as the
# clone's ansible.cfg finds it, then Sphinx. Links into Ansible's own docs resolve through intersphinx
# where docs.ansible.com answers; elsewhere they stay plain text (Sphinx warns).
DOCS := build/docs
DOCS_VENV := build/docs-venv
docs: venv
	test -x $(DOCS_VENV)/bin/sphinx-build || { python3 -m venv $(DOCS_VENV) && $(DOCS_VENV)/bin/pip install -q -r requirements-docs.txt; }
	rm -rf $(DOCS) && mkdir -p $(DOCS)
	$(DOCS_VENV)/bin/antsibull-docs sphinx-init --use-current --dest-dir $(DOCS) gpu_fleet.tf_hosts >/dev/null
	mkdir -p $(DOCS)/rst && chmod og-w $(DOCS)/rst
	cd $(DOCS) && $(CURDIR)/$(DOCS_VENV)/bin/antsibull-docs --config-file antsibull-docs.cfg collection \
	  --cleanup everything --use-current --dest-dir rst gpu_fleet.tf_hosts
	$(DOCS_VENV)/bin/sphinx-build -M html $(DOCS)/rst $(DOCS)/build -q -c $(DOCS) 2>$(DOCS)/sphinx-warnings.txt
	@echo "$$(grep -c WARNING $(DOCS)/sphinx-warnings.txt) Sphinx warnings (links into Ansible's own docs): $(DOCS)/sphinx-warnings.txt"
	@echo "docs site: $(CURDIR)/$(DOCS)/build/html/index.html"

SUITE := $(BIN)/python tools/test_suite.py

# The wheels of the locks the test hosts install, once per session (tests/wheelhouse.py).
wheelhouse: venv
	$(BIN)/python tests/wheelhouse.py

molecule: venv standins image wheelhouse
	$(SUITE) --jobs 1 --only 'molecule:*'

integration: venv standins image wheelhouse
	$(SUITE) --only 'integration:*'

check: venv standins
	$(SUITE) --tier check

test: venv standins image wheelhouse
	$(SUITE) --tier test

# Not part of `make test`: fresh containers, first provisioning on 1 and 4 hosts (many minutes).
# BENCH_ARGS=--quick for 1 host only; --keep leaves the containers.
bench: venv standins image
	$(BIN)/python tools/bench.py $(BENCH_ARGS)

# Not part of `make test` (it asks PyPI): every lock of data/locks/targets.yml, rewritten only when it
# changes; commit the locks. LOCKS_ARGS=--check compares instead of writing.
locks: venv
	$(BIN)/python tools/locks.py $(LOCKS_ARGS)

# At release, after galaxy.yml's version is raised: the fragments become that version's entry in
# changelogs/changelog.yaml and CHANGELOG.md is written again from it (docs/releasing.md).
changelog: venv
	$(BIN)/antsibull-changelog release

# At release, after `make changelog` and `make test`: the tarball to publish, in build/release, built from
# a copy of the clone whose galaxy.yml gets the public repository's address (galaxy.yml names none
# yet; Galaxy's importer requires one) and checked by Galaxy's own importer, galaxy-importer
# (tools/release.py; docs/releasing.md). REPOSITORY may also come from the environment.
REPOSITORY ?=
release: venv
	$(BIN)/python tools/release.py build $(if $(REPOSITORY),--repository "$(REPOSITORY)") --out build/release

# The collection tarball that execution-environment.yml installs, then the build context only.
ee-context: venv
	rm -rf build/ee && mkdir -p build/ee
	$(BIN)/ansible-galaxy collection build --output-path build/ee .
	mv build/ee/gpu_fleet-tf_hosts-$(VERSION).tar.gz build/ee/gpu_fleet-tf_hosts.tar.gz
	$(BIN)/ansible-builder create -f execution-environment.yml -c build/ee/context

ee: ee-context
	$(BIN)/ansible-builder build -f execution-environment.yml -c build/ee/context -t $(EE_TAG) \
		$(if $(EE_BASE_IMAGE),--build-arg EE_BASE_IMAGE=$(EE_BASE_IMAGE))

clean:
	-$(BIN)/python tests/snapshots.py clean
	rm -rf build reports .ansible

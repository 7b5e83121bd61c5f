# The README's two commands: `make site` provisions this machine (a DGX Spark), `make test` runs every test.
VENV ?= .venv
PYTHON ?= python3

.PHONY: site test demo lint clean

## site: create .venv if missing, install the pinned dependencies, run site.yml against inventories/local;
##       MODEL=RECIPE serves that recipe alone (e.g. make site MODEL=gpt-oss-120b; preflight checks the name)
site: $(VENV)/.site-requirements
	$(VENV)/bin/ansible-playbook site.yml $(if $(MODEL),-e 'sparkfleet_model=$(MODEL)')

$(VENV)/.site-requirements: requirements.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

## test: install what a fresh machine lacks (apt, Docker engine, images, fixtures), then lint, pytest, molecule
test:
	bash tests/run-all.sh

## demo: the whole flow on a simulated Spark (a container): site.yml, then a chat request through the endpoint
demo:
	bash tests/demo.sh

## lint: the linters alone (needs a venv made by `make test`)
lint:
	bash tests/run-all.sh lint

## clean: remove the virtual environment and the cached images' tarballs and fixtures
clean:
	rm -rf $(VENV) .cache

# wan22-cachedit: `make test` sets itself up on a fresh clone, then runs the whole suite.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test demo clean

setup:
	@bash devtools/setup.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) -m devtools.demo

clean:
	rm -rf .demo .pytest_cache

distclean: clean
	rm -rf .venv .comfyui

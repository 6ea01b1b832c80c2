# wan22-cachedit: `make test` sets itself up on a fresh clone, then runs the suite (`make test-slow`: the long
# as-shipped runs; `make test-fuzz`: the fuzz suites' long runs).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-slow test-fuzz demo bench quality clean distclean

setup:
	@bash devtools/setup.sh

# The suite runs in a network namespace with only loopback (devtools/offline.sh) where the machine allows it.
test: setup
	devtools/offline.sh $(PY) -m pytest $(PYTEST_ARGS)

# The long as-shipped runs (marker `slow`), left out of `make test`; CI runs both.
test-slow: setup
	devtools/offline.sh $(PY) -m pytest -m slow $(PYTEST_ARGS)

# The fuzz suites with their long example counts (marker `fuzz`; `make test` runs them bounded); CI runs it.
test-fuzz: setup
	devtools/offline.sh $(PY) -m pytest -m fuzz $(PYTEST_ARGS)

demo: setup
	$(PY) -m devtools.demo

# Benchmarks and the endurance run: not part of `make test`. Results under bench/results/. `make quality` builds
# the trained test beds once per machine (devtools/testbed/, cached outside the clone) and measures on them
# (bench.quality: the caches against the peers; bench.family: VACE-Fun's control under the cache).
BENCHES := bench.quality bench.family bench.run bench.endurance bench.few_steps bench.compile bench.parallel

# Every part runs even when one fails; the target fails at the end naming the parts that did.
bench: setup
	@failed=""; for part in $(BENCHES); do \
		echo "== $$part"; $(PY) -m $$part || failed="$$failed $$part"; \
	done; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed" >&2; exit 1; fi

quality: setup
	$(PY) -m bench.quality
	$(PY) -m bench.family

clean:
	rm -rf .demo .pytest_cache

distclean: clean
	rm -rf .venv .comfyui .frontends

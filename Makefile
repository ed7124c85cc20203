# nsacdrive: every target installs what it needs first (venv in .venv, CPU torch 2.13.0).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
NSAC := $(VENV)/bin/nsacdrive
STAMP := $(VENV)/.installed
export SDL_VIDEODRIVER ?= dummy
export SDL_AUDIODRIVER ?= dummy
export PYGAME_HIDE_SUPPORT_PROMPT = 1

.PHONY: install browser demo lint docs reference reference-check test test-fast bench bench-deps clean results results-check

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The report's browser test loads the page in headless Chromium from Debian's packages (sudo only
# when not root, never prompting). Never fails: without apt or permission the test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  if command -v apt-get >/dev/null 2>&1 && { $$SUDO apt-get update -qq && \
	     $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; then \
	    echo "installed chromium for the report's browser test"; \
	  else echo "chromium not installed (no apt-get or no permission): the report's browser test will be skipped"; fi; }

# The main job end to end on built-in defaults: collect → train NSAC → one DAgger round → recalibration
# and feature density → offline table with three held-out corruptions → closed loop, clean and with lens
# dirt → misbehaviour monitor → report.
# Every step resumes, so an interrupted demo continues where it stopped.
demo: install
	$(NSAC) collect --agent expert --seeds 0-31 --out data/demo --workers 2 --resume
	$(NSAC) collect --agent expert --seeds 0-27 --noise 0.2 --out data/demo --workers 2 --resume
	$(NSAC) collect --agent expert --seeds 30-31 --colour-preset shift-3 --out data/demo --workers 2 --resume
	$(NSAC) data info data/demo
	$(NSAC) train --data data/demo --out runs/demo-nsac --config configs/demo.json --resume
	$(NSAC) dagger --init runs/demo-nsac --rounds 1 --episodes-per-round 16 --lr 0.00025 --out runs/demo-dagger
	$(NSAC) calibrate runs/demo-dagger/runs/round-1 --data data/demo
	$(NSAC) evaluate-offline runs/demo-dagger/runs/round-1 --data data/demo --colour-preset shift-3 --corruptions fog-3,lens-dirt-4,camera-tilt-4 --out runs/demo-offline
	$(NSAC) eval runs/demo-dagger/runs/round-1 --seeds 42,1000-1001 --colour-preset default,shift-3 --corruption none,lens-dirt-4 --batch 3 --out runs/demo-closed-loop --resume
	$(NSAC) monitor runs/demo-closed-loop --threshold window-rate --out runs/demo-monitor
	$(NSAC) report runs/demo-closed-loop --offline runs/demo-offline --monitor runs/demo-monitor --out runs/demo-report

lint: install
	$(VENV)/bin/ruff check .

# The docs site (MkDocs + Material) into site/; --strict: a broken link or a missing page fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: install lint docs results-check reference-check browser
	$(PY) -m pytest -n 2 -q --durations=10

test-fast: install browser
	$(PY) -m pytest -n 2 -q -m "not slow"

# torch-nac (no license; never vendored) is only a timing/parity oracle: installed without its
# dependencies so it cannot pull a CUDA torch; the benchmark says so when it is unavailable.
bench-deps: install
	-$(PY) -m pip install -q --no-deps torch-nac==0.0.2 ncps==1.0.1

bench: install bench-deps
	$(PY) -m bench.run
	$(PY) -m bench.renderer
	$(PY) -m bench.front_camera
	$(PY) -m bench.nsac_speed
	$(PY) -m bench.levy_speed
	$(PY) -m bench.training_speed
	$(PY) -m bench.data_pipeline
	$(PY) -m bench.accelerator
	$(PY) -m bench.closed_loop_speed
	$(PY) -m bench.safety_cost
	$(PY) -m bench.targets

# The reference pages (every command and option, every config field) from the code itself.
reference: install
	$(PY) -m bench.reference render

reference-check: install
	$(PY) -m bench.reference check

results: install
	$(PY) -m bench.results render

results-check: install
	$(PY) -m bench.results check

clean:
	rm -rf data/demo runs/demo-nsac runs/demo-dagger runs/demo-offline runs/demo-closed-loop runs/demo-report bench/results site .pytest_cache

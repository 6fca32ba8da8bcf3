# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test lint examples docs clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

lint:
	scripts/lint.sh

# every primitive example in one 4-rank job, through the launcher (after `make test` or `make demo`)
examples:
	.venv/bin/python -m fsdist run --nproc-per-node 4 --dir $$(mktemp -d) examples/primitives/all.py

# render docs/ as a site at http://127.0.0.1:8000 (needs: pip install ".[docs]")
docs:
	mkdocs serve

clean:
	rm -rf .venv build dist *.egg-info

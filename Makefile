# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test lint bench clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

lint:
	scripts/lint.sh

# fsdist beside Gloo, default sizes and ops at 2 and 4 ranks on /dev/shm (< 5 min on 2 cores);
# writes fsdist-bench.csv/.json/.png (the plot needs matplotlib: pip install '.[plot]')
bench:
	.venv/bin/python -m fsdist bench $(if $(shell .venv/bin/python -c "import matplotlib" 2>/dev/null && echo y),--plot)

clean:
	rm -rf .venv build dist *.egg-info

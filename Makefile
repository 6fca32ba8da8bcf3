# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test lint clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

lint:
	scripts/lint.sh

clean:
	rm -rf .venv build dist *.egg-info

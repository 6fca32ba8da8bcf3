# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

clean:
	rm -rf .venv build dist *.egg-info

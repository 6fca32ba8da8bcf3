# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test test-gluster lint clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

# GlusterFS from scratch, ranks split across two mounts (root; ~2 min). Also part of `make test`.
test-gluster:
	FSDIST_REQUIRE_GLUSTER=1 scripts/test.sh test_gluster.py

lint:
	scripts/lint.sh

clean:
	rm -rf .venv build dist *.egg-info

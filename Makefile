# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test test-gluster test-nfs lint clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

# GlusterFS from scratch, ranks split across two mounts (root; ~2 min). Also part of `make test`.
test-gluster:
	FSDIST_REQUIRE_GLUSTER=1 scripts/test.sh test_gluster.py

# Kernel NFS v3 in a QEMU VM (root; several minutes of software emulation); result in
# /var/tmp/fsdist-nfs-vm/result.txt. Needs the .venv of `make test` (the VM runs it over 9p).
test-nfs:
	scripts/setup-venv.sh .venv test
	scripts/nfs-vm/run.sh

lint:
	scripts/lint.sh

clean:
	rm -rf .venv build dist *.egg-info

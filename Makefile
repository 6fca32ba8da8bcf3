# Everyday commands. `make demo` and `make test` are the README's two commands.
.PHONY: demo test test-scale test-fuzz test-restarts test-torch test-torch-versions test-frameworks test-gluster test-fs test-nfs lint examples docs bench clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

# worlds of 8 and 16 ranks, flat and in two tiers on simulated nodes (tests/scale; ~2.5 min on 2 cores)
test-scale:
	FSDIST_SCALE=1 scripts/test.sh scale

# every on-disk format's parser against 10,000 random, truncated, bit-flipped and oversized
# inputs per format (tests/test_fuzz.py; `make test` runs 200 each; ~2 min on 2 cores)
test-fuzz:
	FSDIST_FUZZ_EXAMPLES=10000 scripts/test.sh test_fuzz.py

# 20 trials of a 4-rank job (2 launchers x 2) with one rank killed at a random step and
# --max-restarts 3, each ending as an uninterrupted run, and torchrun --nnodes=1:2 through a
# node joining and leaving (tests/test_restarts.py; `make test` runs 1 trial; ~7 min on 2 cores)
test-restarts:
	FSDIST_RESTART_TRIALS=20 scripts/test.sh test_restarts.py

# torch's own distributed test suite, every test torch runs for Gloo (285, 91 run), on fsdist at
# world sizes 2 and 3: 12-30 min each on 2 cores (`make test` runs 20 of them, ~2 min). Tables and
# JUnit XML in torch-suite-results/; docs/torch-suite.md.
test-torch:
	scripts/test-torch.sh

# fsdist on each tested torch release (docs/torch-versions.md): a venv per release in .venv-torch/
# with that torch first and fsdist --no-deps, every collective x op x dtype at worlds 2 and 3, DDP
# against Gloo, the tools, the demo, part of torch's own suite. CUDA wheels from the package index:
# ~4 GB to download and ~5.5 GB on disk per release; ~5 min per release on 2 cores once downloaded,
# ~25 min for the four default ones (2.7.1 2.10.0 2.14.1 2.15.0). FSDIST_TORCH_VERSIONS picks others. Table in torch-versions-results/table.md.
test-torch-versions:
	scripts/test-torch-versions.sh

# Lightning, accelerate and the transformers Trainer on fsdist, compared bit for bit with Gloo
# (tests/frameworks; installs the `frameworks` extra: see docs/frameworks.md for the times)
test-frameworks:
	FSDIST_EXTRAS=test,frameworks FSDIST_FRAMEWORKS=1 scripts/test.sh frameworks

# GlusterFS from scratch, ranks split across two mounts (root; ~2 min). Also part of `make test`.
test-gluster:
	FSDIST_REQUIRE_GLUSTER=1 scripts/test.sh test_gluster.py

# MooseFS, JuiceFS, SeaweedFS, CephFS from packages, ranks split across two mounts, each setting safe
# or refused (root; docs/filesystems.md has the table and each one's run time). FS=a,b for several.
FS ?= moosefs
test-fs:
	FSDIST_FS=$(FS) scripts/test.sh test_filesystems.py -s

# Kernel NFS v3 and v4.2, then NFS-Ganesha, in a QEMU VM (root; software emulation: ~25 minutes
# for the kernel server, ~55 more for Ganesha, on a quiet host); result in
# /var/tmp/fsdist-nfs-vm/result.txt. Needs the .venv of `make test` (the VM runs it over 9p).
# Ends with the RPC count (NFS RPCs per small all_reduce/barrier per rank, by type);
# `make test-nfs FSDIST_NFS_CHECK=rpc` runs only that (FSDIST_NFS_RPC_OPS: ops per loop, 200);
# `FSDIST_NFS_CHECK=restart` runs only checked all_reduces while the NFS server restarts;
# `FSDIST_NFS_CHECK=torn` only the torn-read check of direct records (a full run makes it too);
# `FSDIST_NFS_CHECK=ganesha` only the NFS-Ganesha phases (userspace server; a full run makes them too;
# `FSDIST_NFS_GANESHA=3` or `4.2` only that version);
# `FSDIST_NFS_IO=direct|locked` sets FSDIST_IO for every rank in the VM (default auto);
# `FSDIST_NFS_WORK=DIR` another work folder (two runs at once each need their own).
test-nfs:
	scripts/setup-venv.sh .venv test
	FSDIST_NFS_CHECK=$(FSDIST_NFS_CHECK) FSDIST_NFS_RPC_OPS=$(FSDIST_NFS_RPC_OPS) FSDIST_NFS_IO=$(FSDIST_NFS_IO) FSDIST_NFS_GANESHA=$(FSDIST_NFS_GANESHA) \
	  scripts/nfs-vm/run.sh $(FSDIST_NFS_WORK)

lint:
	scripts/lint.sh

# every primitive example in one 4-rank job, through the launcher (after `make test` or `make demo`)
examples:
	.venv/bin/python -m fsdist run --nproc-per-node 4 --dir $$(mktemp -d) examples/primitives/all.py

# render docs/ as a site at http://127.0.0.1:8000 (needs: pip install ".[docs]")
docs:
	mkdocs serve
# fsdist beside Gloo, default sizes and ops at 2 and 4 ranks on /dev/shm (< 5 min on 2 cores);
# writes fsdist-bench.csv/.json/.png (the plot needs matplotlib: pip install '.[plot]')
bench:
	.venv/bin/python -m fsdist bench $(if $(shell .venv/bin/python -c "import matplotlib" 2>/dev/null && echo y),--plot)

clean:
	rm -rf .venv .venv-torch build dist *.egg-info

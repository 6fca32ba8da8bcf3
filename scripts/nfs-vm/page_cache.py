"""Which reads of a just-written message file go to the NFS server (FSDIST_NFS_CHECK=pages).

Why message files are written in place on network filesystems (fsdist/files/io.write_new): a
file published by rename is read back whole from the server even by a reader on its writer's
own client (the rename moved its ctime, and the client dropped the pages it cached), while a
file written in place under its final name is often read from the writer's page cache (how
often varies: 38-62 % of such files were fetched again in the VM). Each case
writes a fresh 4 MiB file through the first mount and reads it through the first (same client)
or second (other client) mount, in the read forms fsdist uses (pread with POSIX_FADV_RANDOM, a
private mapping), TRIALS times, and prints the share of the files' bytes that the reading mount
fetched from the server. PASS (guest.sh): the writer's client fetches less of a file written in
place than of one renamed into place.

    python page_cache.py DIR_A DIR_B LABEL    (DIR_A and DIR_B: one folder through two clients)
"""

from __future__ import annotations

import mmap
import os
import secrets
import sys

SIZE = 4 << 20
TRIALS = 8


def server_bytes_read(mount: str) -> int:
    """The mount's ``serverreadbytes`` (the 5th number of its mountstats ``bytes:`` line)."""
    inside = False
    with open("/proc/self/mountstats") as stats:
        for line in stats:
            if line.startswith("device "):
                inside = f" mounted on {mount} " in line
            elif inside and line.strip().startswith("bytes:"):
                return int(line.split()[5])
    raise SystemExit(f"page_cache: no NFS mount at {mount}")


def write(path: str, in_place: bool) -> None:
    target = path if in_place else f"{path}.tmp"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SIZE))
    finally:
        os.close(fd)
    if not in_place:
        os.rename(target, path)


def read(path: str, mapped: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        if mapped:
            with mmap.mmap(fd, SIZE, access=mmap.ACCESS_COPY) as view:
                assert len(bytes(view)) == SIZE
        else:
            assert len(os.pread(fd, SIZE, 0)) == SIZE
    finally:
        os.close(fd)


def main(dir_a: str, dir_b: str, label: str) -> None:
    mounts = {dir_a: os.path.dirname(dir_a), dir_b: os.path.dirname(dir_b)}
    cases: list[tuple[str, str, bool]] = [
        ("same client, pread", dir_a, False),
        ("same client, mapped", dir_a, True),
        ("other client, pread", dir_b, False),
    ]
    number = 0
    for in_place in (False, True):
        how = "in place" if in_place else "temp + rename"
        for case, reader, mapped in cases:
            fetched = 0
            for _ in range(TRIALS):  # (on v3 whether the pages stay varies from file to file)
                number += 1
                write(os.path.join(dir_a, f"m{number}"), in_place)
                before = server_bytes_read(mounts[reader])
                read(os.path.join(reader, f"m{number}"), mapped)
                fetched += server_bytes_read(mounts[reader]) - before
            share = fetched / SIZE / TRIALS
            print(f"pages ({label}) written {how}, read by the {case}: {share:.2f} files from the server (of {TRIALS})")


if __name__ == "__main__":
    main(*sys.argv[1:4])

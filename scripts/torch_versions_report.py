"""One row of make test-torch-versions' table: a release's pass counts per check, from JUnit XML.

    python scripts/torch_versions_report.py header
    python scripts/torch_versions_report.py row TORCH INSTALL DEMO PYTEST_EXIT RESULTS.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter

#: the checks of the table, by the test module their cases come from
CHECKS = {
    "test_collectives": "collectives × ops × dtypes, worlds 2, 3",
    "test_training": "DDP (vs one process, vs Gloo), FSDP2, DTensor, objects",
    "test_torch_tooling": "torch's tools (profiler, _get_backend, _dist2, ...)",
    "test_examples": "every example, 4 ranks",
    "torch_suite": "torch's distributed_test.py (CI part)",
}


def counts(path: str) -> dict[str, Counter[str]]:
    """Outcomes (passed, failed, skipped, xfailed) per check."""
    by_check: dict[str, Counter[str]] = {check: Counter() for check in CHECKS}
    for case in ET.parse(path).getroot().iter("testcase"):
        # (pytest's rootdir is the repo; a module that failed to import has only a name)
        module = (case.get("classname") or case.get("name", "")).removeprefix("tests.").split(".")[0]
        check = by_check.get(module)
        if check is None:
            continue
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        check[outcome] += 1
    return by_check


def cell(outcomes: Counter[str]) -> str:
    if not outcomes:
        return "not run"
    text = f"{outcomes['passed']} passed"
    for outcome in ("failed", "xfailed", "skipped"):
        if outcomes[outcome]:
            text += f", {outcomes[outcome]} {outcome}"
    return f"**{text}**" if outcomes["failed"] else text


def main(argv: list[str]) -> None:
    if argv[0] == "header":
        # pytest's exit status also counts what no single test shows (the suite's hygiene checks)
        print("| torch | pip install of fsdist | demo | pytest exit | " + " | ".join(CHECKS.values()) + " |")
        print("|---" * (4 + len(CHECKS)) + "|")
        return
    _, torch_version, install, demo, exit_status, path = argv
    cells = [cell(outcomes) for outcomes in counts(path).values()]
    status = exit_status if exit_status == "0" else f"**{exit_status}**"
    print(f"| {torch_version} | torch {install} | {demo} | {status} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])

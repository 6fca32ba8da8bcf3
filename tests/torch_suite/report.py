"""Tables from the torch suite's JUnit XML files: totals, and one row per test.

Usage: python tests/torch_suite/report.py LABEL=FILE.xml [LABEL=FILE.xml ...]
e.g.   python tests/torch_suite/report.py gloo-2=gloo-w2.xml fsdist-2=fsdist-w2.xml

Prints Markdown: a totals table (passed / skipped / failed and wall time per file) and a table with
one row per test and one column per file: ``pass``, ``skip: <torch's reason>`` or
``FAIL: <the exception the first failing rank raised>``.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failed|Timeout)\w*(: .*)?$")


@dataclass
class Outcome:
    status: str  # "pass", "skip", "FAIL" or "xfail" (a failure conftest.py expects)
    reason: str = ""

    def cell(self) -> str:
        status = "FAIL (expected)" if self.status == "xfail" else self.status
        text = status if not self.reason else f"{status}: {self.reason}"
        return text.replace("|", "\\|")


def short_reason(text: str) -> str:
    """The first failing rank's exception (torch reports 'Process N exited ... exception: <traceback>')."""
    # pytest prefixes the exception's lines with "E   "
    lines = [re.sub(r"^E\s+", "", line).strip() for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if re.match(r"^(RuntimeError: )?Process \d+ exited with", line)]
    if starts:
        section = lines[starts[0] + 1 :]
        for i, line in enumerate(section):
            if re.match(r"^(RuntimeError: )?Process \d+ exited with", line) or line.startswith("To execute this test"):
                section = section[:i]
                break
        candidates = [line for line in section if _EXCEPTION_LINE.match(line)]
        if candidates:
            return _clip(candidates[-1])
    timed_out = [line for line in lines if "terminated or timed out" in line]
    if timed_out:
        return _clip(timed_out[0].split("RuntimeError: ")[-1])
    candidates = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return _clip(candidates[-1] if candidates else (lines[0] if lines else "?"))


def _clip(line: str, width: int = 140) -> str:
    line = " ".join(line.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def read(path: str) -> tuple[dict[str, Outcome], float]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    outcomes: dict[str, Outcome] = {}
    wall = 0.0
    for suite in suites:
        wall += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            name = case.get("name", "?")
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            skipped = case.find("skipped")
            if failure is not None:
                outcomes[name] = Outcome("FAIL", short_reason(failure.text or failure.get("message") or ""))
            elif skipped is not None and skipped.get("type") == "pytest.xfail":
                outcomes[name] = Outcome("xfail", _clip(skipped.get("message") or "", 90))
            elif skipped is not None:
                outcomes[name] = Outcome("skip", _clip(skipped.get("message") or "", 90))
            else:
                outcomes[name] = Outcome("pass")
    return outcomes, wall


def main(argv: list[str]) -> int:
    if not argv or any("=" not in arg for arg in argv):
        print(__doc__)
        return 2
    columns = []
    for arg in argv:
        label, path = arg.split("=", 1)
        columns.append((label, *read(path)))
    print("| run | passed | skipped | failed | of which expected | wall time |")
    print("|---|---|---|---|---|---|")
    for label, outcomes, wall in columns:
        counts = {s: sum(o.status == s for o in outcomes.values()) for s in ("pass", "skip", "FAIL", "xfail")}
        failed = counts["FAIL"] + counts["xfail"]
        print(f"| {label} | {counts['pass']} | {counts['skip']} | {failed} | {counts['xfail']} | {wall / 60:.1f} min |")
    print()
    names = sorted({name for _, outcomes, _ in columns for name in outcomes})
    print("| test | " + " | ".join(label for label, _, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in names:
        cells = [outcomes.get(name, Outcome("—")).cell() for _, outcomes, _ in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

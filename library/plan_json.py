"""The frame of ``--dry_run --json``'s one JSON document: the plan, or why there is none.

A batch script that asks for JSON always gets one document on stdout: the plan with
``"status": "planned"``, or, when the run is refused or fails before its plan is made,
``"status": "refused"`` (exit code 2, bad input) or ``"failed"`` (any other exit code), the
message, and every problem with the file and key it concerns.
"""

from __future__ import annotations

import json

from library.errors import DifftuneError, exit_code_of, exit_reason_of

PLAN_FORMAT = "difftune-plan"
PLAN_VERSION = 1  # raised when a field of the JSON plan changes meaning or goes away


def plan_document(report: dict) -> str:
    """The plan (plan_report's fields) as the JSON document ``--dry_run --json`` prints."""
    frame = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "status": "planned"}
    return json.dumps({**frame, **report}, indent=2)


def failure_document(exc: BaseException) -> str:
    """The JSON document of a dry run that stopped with ``exc`` instead of a plan."""
    code = exit_code_of(exc)
    problems = [p.report() for p in exc.problems] if isinstance(exc, DifftuneError) else []
    first = problems[0] if problems else {"file": None, "key": None}
    document = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "status": "refused" if code == 2 else "failed",
        "exit_code": code,
        "error": exit_reason_of(exc),
        "file": first["file"],
        "key": first["key"],
        "problems": problems,
    }
    return json.dumps(document, indent=2)

"""One line for a document that failed its model: where the first problem is, and what it is."""

from __future__ import annotations

from pydantic import ValidationError


def first_problem(error: ValidationError, whole: str = "the document") -> str:
    """`field.path: message` of the first error (`whole` when it is the document itself)."""
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"]) or whole
    return f"{where}: {problem['msg'].removeprefix('Value error, ')}"

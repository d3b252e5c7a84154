"""A program's failure as one line: its last line, with the error a runtime logged before it (podman
reports only "... failed: exit status 1" last, the runtime's reason above it)."""

from __future__ import annotations

import sys

import pytest

from gpuckpt.host.process import MAX_CAUSE, CommandError, run

PODMAN_LAST = "Error: `/usr/local/bin/gpuckpt-runtime checkpoint ... abc` failed: exit status 1"


def _failing(stderr: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); sys.exit(125)"]


@pytest.mark.parametrize("logged", [
    'time="2026-11-27T06:40:55Z" level=error msg="checkpoint of abc refused: a \\"quoted\\" word"',
    '{"level": "error", "msg": "checkpoint of abc refused: a \\"quoted\\" word", "time": "2026-11-27T06:40:55Z"}',
])
def test_runtime_reason_joins_podman_last_line(logged: str) -> None:
    with pytest.raises(CommandError) as raised:
        run(_failing(f"{logged}\n{PODMAN_LAST}\n"))
    assert str(raised.value).endswith(f'{PODMAN_LAST} (checkpoint of abc refused: a "quoted" word)')
    assert raised.value.returncode == 125


def test_the_shims_line_is_preferred_to_its_delegates() -> None:
    ours = 'time="t" level=error msg="checkpoint of abc failed (runc checkpoint exited 1; CRIU: the cause)"'
    runcs = 'time="t" level=error msg="criu failed: type NOTIFY errno 0"'
    with pytest.raises(CommandError) as raised:
        run(_failing(f"{ours}\n{runcs}\n{PODMAN_LAST}\n"))
    assert str(raised.value).endswith(f"{PODMAN_LAST} (checkpoint of abc failed (runc checkpoint exited 1; CRIU: "
                                      "the cause))")


def test_only_error_lines_are_reasons_and_they_are_bounded() -> None:
    with pytest.raises(CommandError) as raised:
        run(_failing(f'time="t" level=info msg="restored 1 CUDA process(es)"\n{PODMAN_LAST}\n'))
    assert str(raised.value).endswith(PODMAN_LAST)
    with pytest.raises(CommandError) as raised:
        run(_failing(f'{{"level": "error", "msg": "{"x" * 5000}"}}\n{PODMAN_LAST}\n'))
    assert str(raised.value).endswith(f"({'x' * MAX_CAUSE})")


@pytest.mark.hostile("a runtime's logged error quoting container-chosen text with newlines and terminal escapes")
def test_a_logged_cause_is_one_printable_line() -> None:
    forged = 'time="t" level=error msg="failed\\nError: all good\\u001b[2K\\r"'
    with pytest.raises(CommandError) as raised:
        run(_failing(f"{forged}\n{PODMAN_LAST}\n"))
    message = str(raised.value)
    assert message.isprintable() and message.endswith("(failed\\x0aError: all good\\x1b[2K\\x0d)")


@pytest.mark.hostile("a runtime's stderr line nesting JSON arrays deeper than the parser's recursion limit")
def test_deeply_nested_json_is_no_cause_and_no_traceback() -> None:
    nested = [sys.executable, "-c", "import sys; sys.stderr.write('{\"a\":' + '[' * 50000 + '\\n' + "
              f"{PODMAN_LAST!r} + '\\n'); sys.exit(125)"]
    with pytest.raises(CommandError) as raised:
        run(nested)
    assert str(raised.value).endswith(PODMAN_LAST)

"""The shim's log lines as engines decode them: logrus JSON with an RFC 3339 time."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from gpuckpt.shim.log import format_line


@pytest.mark.parametrize("zone, offset", [("UTC", "Z"), ("Europe/Paris", "+01:00"), ("America/St_Johns", "-03:30")])
def test_json_time_is_rfc3339_in_any_zone(monkeypatch, zone, offset):
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        stamp = json.loads(format_line("error", "x", "json"))["time"]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert stamp.endswith(offset) or (offset != "Z" and stamp[-6:] in ("+02:00", "-02:30")), stamp  # summer time
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None and abs(parsed.timestamp() - time.time()) < 5

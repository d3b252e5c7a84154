"""`gpuckpt doctor`'s CRIU image definitions check: a node without them is told, with the fix."""

from __future__ import annotations

import pytest

from gpuckpt.cli import doctor
from gpuckpt.errors import ImageError


def test_missing_image_definitions_fail_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing():
        raise ImageError("cannot check CRIU images: CRIU's python bindings (python3-pycriu) are not installed")
    monkeypatch.setattr(doctor, "criu_messages", missing)
    with pytest.raises(doctor.CheckFailed, match="python3-pycriu") as failed:
        doctor.check_criu_image_definitions()
    assert "install Debian's python3-pycriu" in failed.value.fix

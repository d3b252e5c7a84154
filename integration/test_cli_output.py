"""`gpuckpt`'s results for people and scripts, with real podman: containers named as `podman ps` names them
(name and 12-hex ID), the --json documents of docs/cli-output.md, --name's container in import's line."""

from __future__ import annotations

import json
import os
import shutil

from bed import COUNTER_SOURCE, GPUCKPT, PODMAN_IMAGE, assert_continues, sh, wait_counter


def read_state(name: str):
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


def podman_id(name: str) -> str:
    return sh("podman", "inspect", "--format", "{{.Id}}", name).stdout.strip()


def test_export_json_then_import_under_another_name(runc_delegate, tmp_path) -> None:
    name = f"ops-json-{os.getpid()}"
    copy, archive = f"{name}-copy", tmp_path / "moved.tar.zst"
    sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    try:
        container_id = podman_id(name)
        before = wait_counter(read_state(name), minimum=3)
        exported = json.loads(sh(GPUCKPT, "export", "--json", name, "-o", str(archive)).stdout)
        assert {key: exported[key] for key in ("schema_version", "kind", "container", "container_id", "short_id",
                                               "output")} == {
            "schema_version": 1, "kind": "export", "container": name, "container_id": container_id,
            "short_id": container_id[:12], "output": str(archive)}
        assert exported["checkpoint_bytes"] > 16 << 20 and exported["signature"] == f"{archive}.sig"

        verified = json.loads(sh(GPUCKPT, "trust", "verify", "--json", str(archive)).stdout)
        assert verified["kind"] == "trust-verify" and verified["signed"] and verified["entries"] > 0
        shown = json.loads(sh(GPUCKPT, "inspect", "--json", str(archive)).stdout)
        assert shown["schema_version"] == 1 and shown["container"]["id"] == container_id

        sh("podman", "rm", "-f", name)
        imported = sh(GPUCKPT, "import", str(archive), "--name", copy).stdout
        new_id = podman_id(copy)
        # it said "restored NAME as ab53..." (the checkpointed name, a bare ID) when --name was given
        assert f"restored {copy} ({new_id[:12]}) from {archive} in " in imported, imported
        assert_continues(before, read_state(copy))
    finally:
        for each in (name, copy):
            sh("podman", "rm", "-f", "-t", "0", each, check=False)
        shutil.rmtree(tmp_path, ignore_errors=True)

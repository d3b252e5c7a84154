"""gpuckpt-manifest.json is data from wherever the image came from: every field that could reach a
command line, a config line, a path or a terminal is allow-listed or bounded by the model itself."""

from __future__ import annotations

import copy
import json

import pytest

from gpuckpt.errors import ImageError
from gpuckpt.oci.manifest import MANIFEST_NAME, Manifest, parse_manifest, read_manifest, write_manifest

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
VALID = {
    "schema_version": 1, "created": "2026-11-23T16:00:00Z", "container_id": "ctr-1",
    "driver_version": "580.159.04", "cuda_driver_version": 13000,
    "gpus": [{"index": 0, "uuid": UUID0, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 << 30}],
    "node_gpu_uuids": [UUID0],
    "processes": [{"host_pid": 4242, "container_pid": 1, "checkpointed_bytes": 1 << 30, "gpu_uuids": [UUID0]}],
    "delegate": "/usr/sbin/runc", "delegate_args": ["checkpoint", "--image-path", "/var/lib/x", "ctr-1"],
    "network": {"tcp_connected": ["10.0.0.1:80 -> 10.0.0.2:5000 state 1"], "added_options": ["--tcp-established"],
                "engine_options": ["--file-locks"], "network_lock": "nftables"},
    "criu_config": ["network-lock nftables", f"ghost-limit {6 << 20}", "link-remap"],
    "timings": {"lock_s": 0.001, "total_s": 12.5, "downtime_s": None},
}


def with_field(path: str, value) -> bytes:
    manifest = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    where = manifest
    for part in parents:
        where = where[int(part)] if isinstance(where, list) else where[part]
    if isinstance(where, list):
        where[int(last)] = value
    else:
        where[last] = value
    return json.dumps(manifest).encode()


def test_what_the_shim_writes_is_read_back() -> None:
    manifest = parse_manifest(json.dumps(VALID).encode(), "m.json")
    assert manifest.network.added_options == ["--tcp-established"] and manifest.processes[0].host_pid == 4242


@pytest.mark.hostile("gpuckpt-manifest.json fields that would reach a command line, config line, the driver or a "
                     "terminal")
@pytest.mark.parametrize("field, value, allowed", [
    ("network.added_options", ["--tcp-established", "--action-script=/tmp/x"],
     "network.added_options.1: Input should be '--tcp-established', '--ext-unix-sk' or '--file-locks'"),
    ("network.added_options", ["--log=/etc/cron.d/x"], "network.added_options.0: Input should be '--tcp-established'"),
    ("network.engine_options", ["--work-path"], "network.engine_options.0: Input should be '--tcp-established'"),
    ("network.network_lock", "skip", "network.network_lock: Input should be 'iptables' or 'nftables'"),
    ("criu_config", ["action-script /tmp/x"], "criu_config.0: allowed lines: 'ghost-limit N' (bytes), "
     "'network-lock iptables|nftables', 'link-remap'"),
    ("criu_config", ["ghost-limit 1\naction-script /tmp/x"], "criu_config.0: allowed lines"),
    ("criu_config", ["ghost-limit 9999999999999999"], "criu_config.0: allowed lines"),
    ("processes.0.host_pid", 0, "processes.0.host_pid: Input should be greater than or equal to 1"),
    ("processes.0.container_pid", 1 << 23, "processes.0.container_pid: Input should be less than or equal to 4194304"),
    ("processes.0.checkpointed_bytes", -1, "processes.0.checkpointed_bytes: Input should be greater than or equal to "
                                           "0"),
    ("processes.0.gpu_uuids", ["GPU-1"], "processes.0.gpu_uuids.0: String should match pattern '^GPU-"),
    ("node_gpu_uuids", ["GPU-11111111-2222-3333-4444-555555555555\x00"], "node_gpu_uuids.0: String should match"),
    ("gpus.0.uuid", "MIG-11111111-2222-3333-4444-555555555555", "gpus.0.uuid: String should match pattern"),
    ("gpus.0.memory_total_bytes", 1 << 60, "gpus.0.memory_total_bytes: Input should be less than or equal to"),
    ("gpus.0.name", "H100\x1b]0;owned\x07", "gpus.0.name: holds control characters"),
    ("container_id", "../../etc", "container_id: String should match pattern"),
    ("driver_version", "580; rm -rf /", "driver_version: String should match pattern"),
    ("created", "yesterday", "created: String should match pattern"),
    ("network.tcp_connected", ["x" * 161], "network.tcp_connected.0: String should have at most 160 characters"),
    ("delegate_args", ["a\nb"], "delegate_args.0: holds control characters"),
    ("timings.total_s", float("inf"), "timings.total_s: Input should be a finite number"),
    ("network.unix_external", -5, "network.unix_external: Input should be greater than or equal to 0"),
])
def test_a_field_out_of_its_allow_list_or_range_is_refused_with_one_line(field, value, allowed) -> None:
    with pytest.raises(ImageError) as raised:
        parse_manifest(with_field(field, value), "img/gpuckpt-manifest.json")
    message = str(raised.value)
    assert message.startswith(f"img/gpuckpt-manifest.json: {allowed}"), message
    assert "\n" not in message


@pytest.mark.hostile("gpuckpt-manifest.json with 100,000 processes")
def test_lists_are_bounded() -> None:
    many = [{"host_pid": 2, "container_pid": 1}] * 100_000
    with pytest.raises(ImageError, match="processes: List should have at most 4096 items"):
        parse_manifest(with_field("processes", many), "m.json")


@pytest.mark.hostile("gpuckpt-manifest.json injecting a restore option, read from an image directory")
def test_every_reader_gets_the_checks(tmp_path) -> None:
    (tmp_path / MANIFEST_NAME).write_bytes(
        with_field("network.added_options", ["--tcp-established", "--pidfile=/etc/x"])
    )
    with pytest.raises(ImageError, match="network.added_options.1: Input should be"):
        read_manifest(str(tmp_path))
    with pytest.raises(ValueError):  # and the writer cannot make one either
        Manifest.model_validate(json.loads(with_field("network.added_options", ["--pidfile=/etc/x"])))
    write_manifest(str(tmp_path), Manifest.model_validate(VALID))
    assert read_manifest(str(tmp_path)).criu_config == VALID["criu_config"]

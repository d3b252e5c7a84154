"""containerd's config.toml, as far as gpuckpt edits it: one CRI runtime handler running gpuckpt-runtime.

A handler is a runc v2 shim runtime whose runc binary is gpuckpt-runtime (options.BinaryName): pods name
it through a RuntimeClass whose `handler` is HANDLER. containerd 2.x reads config version 3, whose CRI
runtime plugin is 'io.containerd.cri.v1.runtime'; a version 2 file (containerd 1.7's, and what Debian's
package ships) keeps its layout, 'io.containerd.grpc.v1.cri', which containerd 2.x migrates when it
loads it. Edited with tomlkit (comments and the operator's other settings stay), backed up once before
a change, idempotent, as engines.py edits podman's and docker's files.
"""

from __future__ import annotations

import tomllib
from collections.abc import MutableMapping
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from ..errors import EngineConfigError
from .engines import Change, _write_with_backup, read_engine_file

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
HANDLER = "gpuckpt"
SHIM_RUNTIME_TYPE = "io.containerd.runc.v2"
# A pod's annotations reach its containers' specs (where gpuckpt-runtime reads its io.gpuckpt.* settings) only
# when the handler's pod_annotations name them (path.Match patterns, internal/cri/util GetPassthroughAnnotations).
POD_ANNOTATIONS = "io.gpuckpt.*"
# The CRI plugin holding `containerd.runtimes` in each config version containerd 2.x loads.
CRI_RUNTIME_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def _version(document: dict[str, Any], config_path: str, empty: bool) -> int:
    version = document.get("version", 3 if empty else 1)
    if version not in CRI_RUNTIME_PLUGIN:
        raise EngineConfigError(f"{config_path}: config version {version} (no `version` key is version 1): "
                                f"give version 2 or 3 (`containerd config migrate` writes version 3)")
    return int(version)


def handler_path(version: int) -> tuple[str, ...]:
    """The table keys of the handler's entry in a config of this version."""
    return ("plugins", CRI_RUNTIME_PLUGIN[version], "containerd", "runtimes", HANDLER)


def _table(parent: MutableMapping[str, Any], key: str, config_path: str, where: str,
           leaf: bool) -> MutableMapping[str, Any]:
    """parent[key], made if missing: a table above the handler's gets no header of its own (a table tomlkit
    found in pieces, a super table defined after its child, is a mapping too)."""
    if key not in parent:
        parent[key] = tomlkit.table(is_super_table=not leaf)
    child = parent[key]
    if not isinstance(child, MutableMapping):
        raise EngineConfigError(f"{config_path}: {where}.{key} must be a table")
    return child


def register_containerd(runtime_path: str, *, config_path: str = CONTAINERD_CONFIG) -> Change:
    """The HANDLER runtime (runc v2 shim, BinaryName = `runtime_path`, the pods' io.gpuckpt.* annotations passed
    to their containers) in containerd's CRI runtimes; the entry's other settings (SystemdCgroup, Root, ...) are
    kept. A missing or empty file becomes version 3."""
    old_text = read_engine_file(config_path)
    try:
        document = tomlkit.parse(old_text or "")
    except TOMLKitError as error:
        raise EngineConfigError(f"{config_path}: not valid TOML: {error}") from None
    empty = not document.value
    version = _version(document.value, config_path, empty)
    if empty:
        document["version"] = 3
    table: MutableMapping[str, Any] = document
    where = ""
    keys = handler_path(version)
    for key in keys:
        table = _table(table, key, config_path, where, leaf=key is keys[-1])
        where = f"{where}.{key}" if where else key
    table["runtime_type"] = SHIM_RUNTIME_TYPE
    passed = table.get("pod_annotations", [])
    if not isinstance(passed, list) or not all(isinstance(pattern, str) for pattern in passed):
        raise EngineConfigError(f"{config_path}: {where}.pod_annotations must be a list of strings")
    if POD_ANNOTATIONS not in passed:
        table["pod_annotations"] = [*passed, POD_ANNOTATIONS]
    options = table.get("options")
    if options is None:
        options = table["options"] = tomlkit.table()
    if not isinstance(options, MutableMapping):
        raise EngineConfigError(f"{config_path}: {where}.options must be a table")
    options["BinaryName"] = runtime_path
    new_text = tomlkit.dumps(document)
    if new_text == old_text:
        return Change(config_path, False, None)
    return Change(config_path, True, _write_with_backup(config_path, old_text, new_text))


def containerd_registration(config_path: str = CONTAINERD_CONFIG) -> tuple[str | None, str | None]:
    """The HANDLER entry's BinaryName and runtime_type (None, None if the file or the entry is absent)."""
    text = read_engine_file(config_path)
    if text is None:
        return None, None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise EngineConfigError(f"{config_path}: not valid TOML: {error}") from None
    entry: object = document
    for key in handler_path(_version(document, config_path, not document)):
        entry = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(entry, dict):
        return None, None
    options = entry.get("options")
    binary = options.get("BinaryName") if isinstance(options, dict) else None
    runtime_type = entry.get("runtime_type")
    return (binary if isinstance(binary, str) else None), (runtime_type if isinstance(runtime_type, str) else None)

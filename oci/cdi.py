"""CDI specs (github:cncf-tags/container-device-interface SPEC.md) as the engines find them: every `*.json` and
`*.yaml` in /etc/cdi and /var/run/cdi, read into the parts gpuckpt looks at: the kind, each device's name, and
the mounts (common and per device) whose host files carry the driver's version (oci/nvidia_paths.py).

JSON is read with json; YAML with a reader of the block style that nvidia-ctk (go-yaml) writes: mappings,
sequences, plain and quoted scalars. Anything else in a YAML spec (flow collections, anchors, multi-line
scalars) is refused by line, naming `nvidia-ctk cdi generate --format=json` as the way around.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ImageError
from ..host.safefiles import read_bounded
from .nvidia_paths import driver_file_version
from .problems import first_problem

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")  # the CDI spec's static and dynamic directories, in that order
SPEC_SUFFIXES = (".json", ".yaml")
MAX_SPEC_BYTES = 16 << 20


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the spec has more than gpuckpt reads


class CdiMount(_Part):
    hostPath: str
    containerPath: str
    options: list[str] = []


class CdiDeviceNode(_Part):
    path: str
    hostPath: str = ""


class ContainerEdits(_Part):
    deviceNodes: list[CdiDeviceNode] | None = None
    mounts: list[CdiMount] | None = None
    env: list[str] | None = None


class CdiDevice(_Part):
    name: str
    containerEdits: ContainerEdits = ContainerEdits()


class CdiSpec(_Part):
    cdiVersion: str
    kind: str
    devices: list[CdiDevice] = []
    containerEdits: ContainerEdits = ContainerEdits()

    def device_names(self) -> list[str]:
        """What an engine is given: `--device KIND=NAME`."""
        return [f"{self.kind}={device.name}" for device in self.devices]

    def mounts(self) -> list[CdiMount]:
        edits = [self.containerEdits, *(device.containerEdits for device in self.devices)]
        return [mount for edit in edits for mount in edit.mounts or []]

    def driver_versions(self) -> dict[str, str]:
        """version -> one host file of that driver the spec mounts (libcuda first)."""
        found: dict[str, str] = {}
        for mount in sorted(self.mounts(), key=lambda m: not os.path.basename(m.hostPath).startswith("libcuda.")):
            if (version := driver_file_version(mount.hostPath)) is not None:
                found.setdefault(version, mount.hostPath)
        return found


@dataclass(frozen=True)
class SpecFile:
    path: str
    spec: CdiSpec | None
    problem: str = ""  # why it could not be read


def spec_files(dirs: Sequence[str] = CDI_DIRS) -> Iterator[SpecFile]:
    """Every spec file in `dirs` (those that exist), by directory then name, each read or its problem named."""
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as error:
            yield SpecFile(directory, None, f"cannot list: {error.strerror}")
            continue
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(SPEC_SUFFIXES) and os.path.isfile(path):
                try:
                    yield SpecFile(path, read_spec_file(path))
                except ImageError as error:
                    yield SpecFile(path, None, str(error))


def read_spec_file(path: str) -> CdiSpec:
    text = read_bounded(path, MAX_SPEC_BYTES, path).decode("utf-8", "replace")
    try:
        raw = json.loads(text) if path.endswith(".json") else read_block_yaml(text)
    except ValueError as error:
        raise ImageError(f"{path}: {error}") from None
    try:
        return CdiSpec.model_validate(raw)
    except ValidationError as error:
        raise ImageError(f"{path}: not a CDI spec: {first_problem(error)}") from None


# -- the block YAML nvidia-ctk writes --------------------------------------------------------------

_UNSUPPORTED = ("&", "*", "!", "|", ">", "{", "[", "%", "@", "`")


def read_block_yaml(text: str) -> object:
    lines: list[tuple[int, str, int]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or (stripped == "---" and not lines):
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError(f"line {number}: a tab in the indentation")
        lines.append((len(raw) - len(raw.lstrip(" ")), stripped, number))
    if not lines:
        raise ValueError("empty")
    value, end = _block(lines, 0, lines[0][0])
    if end != len(lines):
        raise ValueError(f"line {lines[end][2]}: unexpected indentation")
    return value


def _block(lines: list[tuple[int, str, int]], at: int, indent: int) -> tuple[object, int]:
    if lines[at][1] == "-" or lines[at][1].startswith("- "):
        return _sequence(lines, at, indent)
    return _mapping(lines, at, indent)


def _sequence(lines: list[tuple[int, str, int]], at: int, indent: int) -> tuple[list[object], int]:
    items: list[object] = []
    while at < len(lines) and lines[at][0] == indent and (lines[at][1] == "-" or lines[at][1].startswith("- ")):
        rest, number = lines[at][1][1:].lstrip(" "), lines[at][2]
        if not rest:  # the item is the block below
            if at + 1 < len(lines) and lines[at + 1][0] > indent:
                item, at = _block(lines, at + 1, lines[at + 1][0])
            else:
                item, at = None, at + 1
        elif _key_of(rest) is not None:  # "- key: value": a mapping whose keys line up after the dash
            inner = indent + len(lines[at][1]) - len(rest)
            item, at = _mapping([*lines[:at], (inner, rest, number), *lines[at + 1:]], at, inner)
        else:
            item, at = _scalar(rest, number), at + 1
        items.append(item)
    return items, at


def _mapping(lines: list[tuple[int, str, int]], at: int, indent: int) -> tuple[dict[str, object], int]:
    found: dict[str, object] = {}
    while at < len(lines) and lines[at][0] == indent:
        text, number = lines[at][1], lines[at][2]
        key = _key_of(text)
        if key is None:
            raise ValueError(f"line {number}: expected 'key: value'")
        name, rest = key
        at += 1
        if rest:
            found[name] = _scalar(rest, number)
        elif at < len(lines) and (lines[at][0] > indent or (lines[at][0] == indent and (
                lines[at][1] == "-" or lines[at][1].startswith("- ")))):
            found[name], at = _block(lines, at, lines[at][0])
        else:
            found[name] = None
    return found, at


def _key_of(text: str) -> tuple[str, str] | None:
    """("key", "rest") for "key: rest" or "key:" (the key plain or quoted); None for a plain scalar."""
    if text[0] in "\"'":
        end = _quoted_end(text)
        if end is None or not text[end:].startswith(":"):
            return None
        return str(_scalar(text[:end], 0)), text[end + 1:].strip()
    colon = text.find(": ")
    if colon < 0:
        return (text[:-1], "") if text.endswith(":") else None
    return text[:colon], text[colon + 2:].strip()


def _quoted_end(text: str) -> int | None:
    quote, index = text[0], 1
    while index < len(text):
        if quote == '"' and text[index] == "\\":
            index += 2
            continue
        if text[index] == quote:
            if quote == "'" and text[index + 1:index + 2] == "'":
                index += 2
                continue
            return index + 1
        index += 1
    return None


def _scalar(text: str, number: int) -> object:
    if text in ("[]", "{}"):
        return [] if text == "[]" else {}
    if text[0] == '"':
        if _quoted_end(text) != len(text):
            raise ValueError(f"line {number}: a quoted scalar that does not end on its line")
        return json.loads(text)
    if text[0] == "'":
        if _quoted_end(text) != len(text):
            raise ValueError(f"line {number}: a quoted scalar that does not end on its line")
        return text[1:-1].replace("''", "'")
    if text[0] in _UNSUPPORTED or " #" in text:
        raise ValueError(f"line {number}: YAML this reader does not take ({text[:40]!r}); write the spec as JSON "
                         "(nvidia-ctk cdi generate --format=json)")
    return text

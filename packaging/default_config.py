"""The packages' /etc/gpuckpt/config.toml: every key of node/config.py's model, commented out with its default.

Phases: walk the model (sections in field order), take each key's default from the model and the
comment block written above its field in node/config.py, print TOML. Nothing here names a key: a
key added to the model appears in the next package, with its comment.
Usage: python3 default_config.py > config.toml (with gpuckpt importable).
"""

from __future__ import annotations

import ast
import inspect
import sys

import tomlkit
from pydantic import BaseModel

from gpuckpt.node import config

HEADER = """\
# gpuckpt's node configuration (node/config.py). Every key is shown commented out with its
# default; uncomment a line to change it. An unknown key or a bad value makes gpuckpt refuse to
# run with one line naming it. The file must be owned by root and writable by root only.
"""


def _comments_above(source_lines: list[str], line: int) -> list[str]:
    """The comment lines written directly above source line `line` (1-based), without their indentation."""
    block: list[str] = []
    index = line - 2
    while index >= 0 and source_lines[index].strip().startswith("#"):
        block.insert(0, source_lines[index].strip())
        index -= 1
    return block


def _field_lines(model: type[BaseModel]) -> dict[str, int]:
    """Each annotated field of `model`'s class body -> its line in the module's source."""
    module_tree = ast.parse(inspect.getsource(config))
    class_node = next(node for node in module_tree.body
                      if isinstance(node, ast.ClassDef) and node.name == model.__name__)
    return {node.target.id: node.lineno for node in class_node.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def _commented_key(key: str, default: object) -> str:
    """`#key = default` in TOML (a tuple as an array)."""
    if isinstance(default, dict):  # tomlkit writes a table, which has no one-line form: an inline one has
        value = tomlkit.inline_table()
        value.update(default)
        return f"#{key} = {value.as_string()}"
    return f"#{key} = {tomlkit.item(list(default) if isinstance(default, tuple) else default).as_string()}"


def _section(annotation: object) -> type[BaseModel] | None:
    """The section model a field holds (a TOML table), or None for a plain key."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def render(model: type[BaseModel] = config.Config) -> str:
    """The config file's text: `model`'s plain keys first, then one table per section."""
    source_lines = inspect.getsource(config).splitlines()
    out = [HEADER]
    sections: list[tuple[str, type[BaseModel]]] = []
    lines = _field_lines(model)
    for name, field in model.model_fields.items():
        section = _section(field.annotation)
        if section is not None:
            sections.append((field.alias or name, section))
            continue
        out.extend([*_comments_above(source_lines, lines[name]), _commented_key(field.alias or name, field.default)])
    for key, section in sections:
        out.extend(["", f"[{key}]"])
        section_lines = _field_lines(section)
        for name, field in section.model_fields.items():
            comments = _comments_above(source_lines, section_lines[name])
            if comments and not out[-1].startswith("["):
                out.append("")
            out.extend([*comments, _commented_key(field.alias or name, field.default)])
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())

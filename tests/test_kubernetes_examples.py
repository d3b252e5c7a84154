"""packaging/examples' Kubernetes files: the RuntimeClass names the handler `gpuckpt install --engine containerd`
writes, and CRI-O's drop-in is one CRI-O v1.36.3 accepts (pkg/config/config.go, RuntimeHandler.Validate)."""

import re
import tomllib
from pathlib import Path

from gpuckpt.node.containerd import HANDLER

EXAMPLES = Path(__file__).parent.parent / "packaging" / "examples"


def test_the_runtimeclass_names_the_containerd_handler() -> None:
    text = (EXAMPLES / "runtimeclass.yaml").read_text()
    assert re.search(r"^apiVersion: node\.k8s\.io/v1$", text, re.M) and re.search(r"^kind: RuntimeClass$", text, re.M)
    assert re.findall(r"^handler: (\S+)$", text, re.M) == [HANDLER]


def test_the_crio_dropin_has_the_handler_and_criu_and_no_annotation_crio_refuses() -> None:
    settings = tomllib.loads((EXAMPLES / "crio-gpuckpt.conf").read_text())["crio"]["runtime"]
    assert settings["enable_criu_support"] is True
    handler = settings["runtimes"][HANDLER]
    assert handler == {"runtime_path": "/usr/bin/gpuckpt-runtime", "runtime_type": "oci"}
    # CRI-O refuses to start with an allowed_annotations entry outside its own list (io.gpuckpt.* is not in it);
    # a pod's io.gpuckpt.* annotations reach the containers' specs without one.
    assert "allowed_annotations" not in handler

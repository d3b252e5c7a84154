"""The checkpoint OCI image gpuckpt writes (oci/image_layout.py), against what the CRI runtimes' restore code reads
from such an image, on paper: the keys below are taken from their source at the versions named.

- CRI-O v1.36.3, server/container_restore.go: `checkIfCheckpointOCIImage` takes an image for a checkpoint when its
  image status (the manifest's annotations) has CheckpointAnnotationName; `CRImportCheckpoint` then mounts the image
  and reads spec.dump and config.dump from it; spec.dump's `io.kubernetes.cri-o.Annotations` must be a JSON object
  (the container's annotations, restored), config.dump's rootfsImageName names the base image. The other keys of
  internal/annotations/checkpoint.go are defined there and read by nothing in the restore.
- containerd v2.1.9, internal/cri/server/container_checkpoint_linux.go: `checkIfCheckpointOCIImage` parses the
  image's target blob as an OCI index and wants checkpointctl's `org.criu.checkpoint.container.name` (checkpointctl
  lib v1.3.0, annotations.go) among its annotations; a restore from it also reads status.dump.
"""

from __future__ import annotations

import io
import json

import pytest
from podman_tars import CONFIG, PODMAN_LINUX, podman_tar

from gpuckpt.oci.image_layout import CheckpointImageWriter, read_layout
from gpuckpt.oci.podman_archive import check_podman_archive, copy_checked, described

CRIO_VERSION = "v1.36.3"
CRIO_PREFIX = "io.kubernetes.cri-o.annotations.checkpoint"
# internal/annotations/checkpoint.go: every key CRI-O defines for a checkpoint image, and its config.dump field
CRIO_DEFINED = {f"{CRIO_PREFIX}.name": "name", f"{CRIO_PREFIX}.rawImageName": "RawImageName",
                f"{CRIO_PREFIX}.rootfsImageID": "rootfsImageID", f"{CRIO_PREFIX}.rootfsImageName": "rootfsImageName",
                f"{CRIO_PREFIX}.cri-o.version": None, f"{CRIO_PREFIX}.criu.version": None}
# server/container_restore.go: the keys the restore reads from the image itself
CRIO_RESTORE_READS = {f"{CRIO_PREFIX}.name"}
# ... and from spec.dump inside it
CRIO_SPEC_DUMP_READS = "io.kubernetes.cri-o.Annotations"
CONTAINERD_VERSION = "v2.1.9"
CONTAINERD_RESTORE_READS = {"org.criu.checkpoint.container.name"}

# A container CRI-O made: its spec carries the container's annotations as one JSON object.
CRIO_SPEC = json.dumps({"ociVersion": "1.0.2", "linux": PODMAN_LINUX, "annotations": {
    CRIO_SPEC_DUMP_READS: json.dumps({"io.kubernetes.container.hash": "1a2b3c", "io.gpuckpt.checkpoint-every": "1h"}),
    "io.kubernetes.cri-o.ContainerType": "container"}}).encode()


def _image(tmp_path, spec: bytes = CRIO_SPEC):
    layout = tmp_path / "img"
    writer = CheckpointImageWriter(str(layout), "ckpt", threads=1)
    kept: dict[str, bytes] = {}
    copied = copy_checked(io.BytesIO(podman_tar(spec=spec)), writer.layer(), "checkpoint.tar", kept=kept)
    writer.finish(described("checkpoint.tar", kept, copied.names, copied.files, copied.bytes))
    return read_layout(str(layout), "ckpt")


def test_the_image_carries_what_crios_restore_reads_with_config_dumps_values(tmp_path) -> None:
    annotations = _image(tmp_path).manifest.annotations or {}
    config = json.loads(CONFIG)
    assert CRIO_RESTORE_READS <= annotations.keys(), f"CRI-O {CRIO_VERSION} would not take it for a checkpoint"
    written = {key for key in annotations if key.startswith(CRIO_PREFIX + ".")}
    # of CRI-O's keys, the ones config.dump holds a value for: the two versions of the node that checkpointed are
    # not written (nothing in CRI-O's restore reads them)
    assert written == {key for key, field in CRIO_DEFINED.items() if field}
    for key in written:
        assert annotations[key] == config[CRIO_DEFINED[key]], key


def test_spec_dump_reaches_crio_unchanged_with_the_containers_annotations(tmp_path) -> None:
    """CRI-O's restore reads the container's annotations from spec.dump: the image's layer keeps the file as the
    engine wrote it (a podman container's spec has no such key: CRI-O restores the checkpoints of CRI-O's own)."""
    image = _image(tmp_path)
    archive = check_podman_archive(image.layer_path)
    spec = json.loads(archive.spec_bytes)
    restored = json.loads(spec["annotations"][CRIO_SPEC_DUMP_READS])
    assert restored == {"io.kubernetes.container.hash": "1a2b3c", "io.gpuckpt.checkpoint-every": "1h"}
    assert archive.spec_bytes == CRIO_SPEC


@pytest.mark.xfail(strict=True, reason=f"containerd {CONTAINERD_VERSION}'s restore from an image wants "
                                       "org.criu.checkpoint.container.name (checkpointctl's key) on the image's "
                                       "target; gpuckpt writes podman's and CRI-O's keys only (and an image of a "
                                       "podman checkpoint also lacks the status.dump and config.dump rootfsImageRef "
                                       "that restore reads). containerd's own archive restores "
                                       "(integration/test_cri.py)")
def test_the_image_carries_what_containerds_restore_reads(tmp_path) -> None:
    image = _image(tmp_path)
    assert CONTAINERD_RESTORE_READS <= (image.manifest.annotations or {}).keys()

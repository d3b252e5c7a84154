"""Signed checkpoints moving between two "nodes" on this machine, with real podman, CRIU and a registry.

Node A is this machine's podman storage and /etc/gpuckpt; node B a second podman storage root
(CONTAINERS_STORAGE_CONF) with a trust directory and node key of its own (GPUCKPT_TRUST_DIR).
An archive exported on A is refused on B until B trusts A's key, then restored there and the
workload continues; a tampered archive, an unsigned one and an untrusted image are refused with
one line, nothing staged, podman never asked to restore.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import zstandard
from bed import (
    COUNTER_SOURCE,
    GPUCKPT,
    PODMAN_IMAGE,
    RUNTIME_ROOT,
    assert_continues,
    detached,
    make_bundle,
    runtime,
    sh,
    unsigned_allowed_on_node,
    wait_counter,
)

TRUST_LOG = Path("/var/log/gpuckpt/trust.log")


class NodeB:
    """A second podman storage root and trust directory: another node, as far as podman and gpuckpt know."""

    def __init__(self, tmp_path: Path, label: str) -> None:
        self.runroot = Path(f"/run/gck-sig-{os.getpid()}-{label}")  # podman wants a short runroot
        self.graphroot = tmp_path / "nodeb" / "storage"
        self.graphroot.mkdir(parents=True)
        storage_conf = tmp_path / "nodeb" / "storage.conf"
        storage_conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{self.graphroot}"\n'
                                f'runroot = "{self.runroot}"\n')
        self.env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage_conf),
                    "GPUCKPT_TRUST_DIR": str(tmp_path / "nodeb" / "etc")}
        self.made_dirs: list[Path] = []
        self.key_line = self.sh(GPUCKPT, "install", "--engine", "podman", "--default").stdout
        assert "made this node's signing key" in self.key_line
        # the base image, brought over from node A's storage
        sh("bash", "-c", f"podman save {PODMAN_IMAGE} | CONTAINERS_STORAGE_CONF={storage_conf} podman load")

    def sh(self, *argv: str, check: bool = True):
        return sh(*argv, check=check, env=self.env)

    def containers(self) -> str:
        return self.sh("podman", "ps", "-aq").stdout

    def read_state(self, name: str):
        return lambda: self.sh("podman", "exec", name, "cat", "/tmp/state").stdout

    def import_(self, archive: Path, check: bool = True):
        """`gpuckpt import` here. podman 4.3 keeps the archive's conmon pid file path, in node A's
        runroot (a real second node has the same default paths): its directory is made for the call."""
        plain = zstandard.ZstdDecompressor().decompressobj().decompress(archive.read_bytes())
        with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
            pid_dir = Path(json.loads(tar.extractfile("config.dump").read())["conmonPidFile"]).parent
        made = not pid_dir.exists()
        pid_dir.mkdir(parents=True, exist_ok=True)
        self.made_dirs += [pid_dir.parent] if made else []
        return self.sh(GPUCKPT, "import", str(archive), check=check)

    def staging_leftovers(self) -> list[str]:
        imports = Path("/run/gpuckpt/imports")
        return ([p for p in os.listdir(self.graphroot.parent) if p.startswith(".gpuckpt-import-")]
                + (os.listdir(imports) if imports.exists() else []))

    def remove(self) -> None:
        self.sh("podman", "rm", "-af", "-t", "0", check=False)
        self.sh("podman", "rmi", "-af", check=False)
        sh("rm", "-rf", str(self.runroot), *map(str, self.made_dirs), check=False)


@pytest.fixture
def node_b(tmp_path):
    node = NodeB(tmp_path, "b")
    yield node
    node.remove()


def start_counter(name: str):
    sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    return wait_counter(lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout, minimum=3)


def staging_leftovers() -> set[str]:
    imports = Path("/run/gpuckpt/imports")
    return ({p for p in os.listdir("/var/lib/containers") if p.startswith(".gpuckpt-import-")}
            | set(os.listdir(imports) if imports.exists() else []))


def podman_has(name: str) -> bool:
    """Whether podman knows a container of that name (other suites may run containers meanwhile)."""
    return sh("podman", "container", "exists", name, check=False).returncode == 0


def one_line_refusal(result, *needles: str) -> str:
    assert result.returncode == 3, result.stdout + result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for needle in needles:
        assert needle in message, message
    return message


@pytest.fixture
def exported(runc_delegate, tmp_path):
    """A counter checkpointed on node A into a signed archive (the container removed); its state before."""
    name = f"gpuckpt-sig-{os.getpid()}-{len(os.listdir(tmp_path))}"
    archive = tmp_path / f"{name}.tar.zst"
    try:
        before = start_counter(name)
        done = sh(GPUCKPT, "export", name, "-o", str(archive))
        assert "signed by key" in done.stdout and (tmp_path / f"{name}.tar.zst.sig").exists()
        sh("podman", "rm", "-f", name)
        yield name, archive, before
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def test_a_signed_archive_moves_to_a_node_that_trusts_the_signer(exported, node_b, tmp_path) -> None:
    name, archive, before = exported
    node_a_key = sh(GPUCKPT, "trust", "export-key").stdout.strip()
    refused = node_b.import_(archive, check=False)
    key_id = sh(GPUCKPT, "trust", "list").stdout.split()[1]
    one_line_refusal(refused, f"signed by key {key_id}, which this node does not trust", "gpuckpt trust add")
    assert node_b.containers() == "" and node_b.staging_leftovers() == []
    (tmp_path / "node-a.pub").write_text(node_a_key + "\n")
    node_b.sh(GPUCKPT, "trust", "add", "node-a", str(tmp_path / "node-a.pub"))
    imported = node_b.import_(archive)
    assert f"restored {name}" in imported.stdout
    assert_continues(before, node_b.read_state(name))
    assert node_b.staging_leftovers() == []
    assert sh("podman", "ps", "-aq", "--filter", f"name={name}").stdout == ""  # on node B only


def test_a_signed_archive_of_a_runc_container_restores_through_the_shim(runc_delegate, tmp_path) -> None:
    """Its dump is unsigned (plain runc made it): the shim restores it on the word of the import that
    verified the archive's signature, and only then."""
    name = f"gpuckpt-sigrunc-{os.getpid()}"
    archive = tmp_path / "runc.tar.zst"
    try:
        # runc by its path: podman's name "runc" is the shim on a node set up with install --default
        sh("podman", "run", "-d", "--runtime", shutil.which("runc") or "runc", "--name", name, "--network", "none",
           PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
        before = wait_counter(lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout, minimum=3)
        sh(GPUCKPT, "export", name, "-o", str(archive))
        sh("podman", "rm", "-f", name)
        imported = sh(GPUCKPT, "import", str(archive))
        assert "replaced by gpuckpt-runtime" in imported.stdout, imported.stdout
        assert "unsigned" not in imported.stdout
        assert_continues(before, lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout)
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def tamper_pages(archive: Path) -> str:
    """One byte of a pages entry changed and the archive compressed again, its signature kept."""
    plain = zstandard.ZstdDecompressor().decompressobj().decompress(archive.read_bytes())
    out, changed = io.BytesIO(), ""
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar, tarfile.open(fileobj=out, mode="w",
                                                                     format=tarfile.PAX_FORMAT) as again:
        for member in tar:
            data = tar.extractfile(member).read() if member.isfile() else None
            if not changed and member.name.startswith("checkpoint/pages-") and member.size:
                data, changed = bytes([data[0] ^ 0x01]) + data[1:], member.name
            again.addfile(member, io.BytesIO(data) if data is not None else None)
    assert changed, "no pages entry in the archive"
    archive.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))
    return changed


@pytest.mark.hostile("a signed archive with one byte of a pages entry changed and re-compressed")
def test_a_tampered_archive_is_refused_nothing_staged_podman_never_ran(exported) -> None:
    name, archive, _ = exported
    changed = tamper_pages(archive)
    before = staging_leftovers()
    refused = sh(GPUCKPT, "import", str(archive), check=False)
    one_line_refusal(refused, str(archive), f"entry '{changed}' does not match its signed sha256")
    assert not podman_has(name)  # podman never restored it
    assert staging_leftovers() <= before  # nothing staged stays (other suites' imports may come and go)


@pytest.mark.hostile("an unsigned archive (podman's own --export)")
def test_unsigned_is_refused_by_default_and_restored_under_an_explicit_logged_exception(runc_delegate,
                                                                                      tmp_path) -> None:
    name = f"gpuckpt-unsig-{os.getpid()}"
    archive = tmp_path / "podmans.tar.zst"
    source = f"archive:{tmp_path}/"
    try:
        before = start_counter(name)
        sh("podman", "container", "checkpoint", "--export", str(archive), name)
        sh("podman", "rm", "-f", name)
        refused = sh(GPUCKPT, "import", str(archive), check=False)
        one_line_refusal(refused, f"no signature ({archive}.sig)", f"gpuckpt trust allow-unsigned archive:{archive}")
        assert not podman_has(name)
        with unsigned_allowed_on_node(source, note="podman's own exports, test"):
            trust_line = next(line for line in sh(GPUCKPT, "doctor", check=False).stdout.splitlines()
                              if "trust:" in line)
            assert trust_line.startswith("warn ")  # an exception the operator made: not ok
            assert "UNSIGNED accepted (logged) from:" in trust_line and source in trust_line
            imported = sh(GPUCKPT, "import", str(archive))
        assert f"{archive} is unsigned: accepted because" in imported.stdout
        logged = [json.loads(line) for line in TRUST_LOG.read_text().splitlines()]
        assert {"what": str(archive), "source": source}.items() <= logged[-1].items()
        assert_continues(before, lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout)
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def rewrite_annotation(layout: Path, key: str, value: str) -> None:
    """The pulled image's manifest with one annotation changed, its digest and the index made to match."""
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].removeprefix("sha256:")).read_text())
    manifest["annotations"][key] = value
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    index["manifests"][0] |= {"digest": f"sha256:{digest}", "size": len(data)}
    (layout / "index.json").write_text(json.dumps(index))


@pytest.mark.hostile("a checkpoint image through a registry: signed by an untrusted key, then an annotation changed")
def test_the_image_signature_travels_through_the_registry(registry, runc_delegate, node_b,  # noqa: F811
                                                         tmp_path) -> None:
    name = f"gpuckpt-sigimg-{os.getpid()}"
    layout, pulled, remote = tmp_path / "layout", tmp_path / "pulled", f"{registry}/{name}-ckpt:1"
    try:
        before = start_counter(name)
        sh(GPUCKPT, "export", name, "-o", f"oci:{layout}:ckpt")  # kept on node A: see NodeB.import_
        sh("skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:ckpt", f"docker://{remote}")
        sh("skopeo", "copy", "--src-tls-verify=false", f"docker://{remote}", f"oci:{pulled}:ckpt")
        one_line_refusal(node_b.sh(GPUCKPT, "trust", "verify", f"oci:{pulled}:ckpt", check=False),
                         "which this node does not trust")
        (tmp_path / "node-a.pub").write_text(sh(GPUCKPT, "trust", "export-key").stdout)
        node_b.sh(GPUCKPT, "trust", "add", "node-a", str(tmp_path / "node-a.pub"))
        verified = node_b.sh(GPUCKPT, "trust", "verify", f"oci:{pulled}:ckpt").stdout
        assert "signed by node-a" in verified and "layer sha256:" in verified
        node_b.sh("podman", "pull", "--tls-verify=false", remote)  # and podman on node B restores it
        node_b.sh("podman", "container", "restore", remote)
        assert_continues(before, node_b.read_state(name))
        rewrite_annotation(pulled, "io.podman.annotations.checkpoint.name", "someone-else")
        one_line_refusal(node_b.sh(GPUCKPT, "trust", "verify", f"oci:{pulled}:ckpt", check=False),
                         "annotation 'io.podman.annotations.checkpoint.name' differs from the signed one")
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def edit_archive(archive: Path, edit) -> None:
    """podman's archive unpacked, `edit(member, data)` applied to each entry (None: dropped), packed again."""
    plain = zstandard.ZstdDecompressor().decompressobj().decompress(archive.read_bytes())
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar, tarfile.open(fileobj=out, mode="w",
                                                                     format=tarfile.PAX_FORMAT) as again:
        for member in tar:
            data = tar.extractfile(member).read() if member.isfile() else None
            for member, data in edit(member, data):
                again.addfile(member, io.BytesIO(data) if data is not None else None)
    archive.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))


def edit_descriptors(member, data):
    """runc's descriptors.json (the restored process's stdio) pointed elsewhere."""
    if member.name == "checkpoint/descriptors.json":
        data = data.replace(b"/dev/null", b"/dev/zero")
        member.size = len(data)
    yield member, data


def add_image(member, data):
    yield member, data
    if member.name == "checkpoint/inventory.img":
        extra = tarfile.TarInfo("checkpoint/ipcns-shm-99.img")
        extra.size = 4
        yield extra, b"evil"


@pytest.mark.hostile("podman's own --import of a shim-made archive with descriptors.json edited or a CRIU image added")
@pytest.mark.parametrize("edit, message", [
    (edit_descriptors, "descriptors.json does not match its sha256 signed at dump"),
    (add_image, "ipcns-shm-99.img is not among the files signed at dump"),
])
def test_the_shim_refuses_a_dump_changed_after_it_signed_it(runc_delegate, tmp_path, edit, message) -> None:
    name = f"gpuckpt-dumpsig-{os.getpid()}-{edit.__name__}"
    archive = tmp_path / "edited.tar.zst"
    try:
        start_counter(name)
        sh("podman", "container", "checkpoint", "--export", str(archive), name)  # through the shim: signed at dump
        sh("podman", "rm", "-f", name)
        edit_archive(archive, edit)
        refused = sh("podman", "container", "restore", "--import", str(archive), check=False)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
        assert sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip() != "running"
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


@pytest.mark.hostile("a checkpoint dumped by plain runc, restored through gpuckpt-runtime")
def test_a_plain_runc_dump_is_restored_only_under_restore_any(runc_delegate, rootfs, tmp_path) -> None:
    """podman will not restore an archive through another runtime than the one that made it, so at runc level."""
    container_id = f"gpuckpt-plainrunc-{os.getpid()}"
    bundle = make_bundle(rootfs, tmp_path)
    try:
        (rootfs / "tmp" / "state").unlink(missing_ok=True)
        detached("run", "-d", container_id, cwd=bundle)
        read_state = lambda: (rootfs / "tmp" / "state").read_text()  # noqa: E731
        before = wait_counter(read_state, minimum=3)
        images = tmp_path / "images"
        sh("runc", "--root", RUNTIME_ROOT, "checkpoint", "--image-path", str(images), container_id)  # plain runc
        restore = ["restore", "-d", "--bundle", str(bundle), "--image-path", str(images), container_id]
        refused = runtime(*restore, check=False)
        assert refused.returncode == 1 and "has no gpuckpt-dump.sig" in refused.stderr, refused.stderr
        assert "gpuckpt trust allow-unsigned restore:any" in refused.stderr
        assert runtime("state", container_id, check=False).returncode != 0  # nothing was restored
        with unsigned_allowed_on_node("restore:any", note="integration test: plain runc dumps"):
            detached(*restore, cwd=bundle)
        assert_continues(before, read_state)
        logged = [json.loads(line) for line in TRUST_LOG.read_text().splitlines()]
        assert any(entry["source"] == "restore:any" and container_id in entry["what"] for entry in logged[-5:])
    finally:
        runtime("delete", "-f", container_id, check=False)

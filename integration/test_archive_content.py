"""Host root through what podman unpacks before any runtime runs: a real export whose
rootfs-diff.tar, deleted.files or config.dump was edited.

podman applies `rootfs-diff.tar` and `deleted.files` to the container's root as root on the host
before it calls the runtime; podman 4.3 (Debian 12's) does it unconfined: a link the tar makes,
or one the image has (Debian's `/var/run -> /run`), is followed onto the host, and `/../..` in
deleted.files removes host files. Each attack is first shown to work through podman's own
`restore --import` (the path gpuckpt cannot check), then to fail through `gpuckpt import`, for the
reason it must, with nothing written on the host, no container left, nothing staged left.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from bed import (
    COUNTER_SOURCE,
    GPUCKPT,
    PODMAN_IMAGE,
    RUNTIME,
    ArchiveEdit,
    assert_continues,
    containers_named,
    edited_archive,
    edited_specs,
    sh,
    staging_leftovers,
    unsigned_allowed_on_node,
    wait_counter,
)

from gpuckpt.trust.dump_signature import DUMP_SIGNATURE


def podman_major() -> int:
    return int(sh("podman", "version", "--format", "{{.Client.Version}}").stdout.split(".")[0])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Iterator[tuple[Path, str]]:
    """A counter container's signed export (it changed /tmp/state and deleted /etc/issue.net), the
    container removed; the archive and the container's name."""
    directory = tmp_path_factory.mktemp("content")
    name = f"gpuckpt-content-{os.getpid()}"
    archive = directory / "counter.tar.zst"
    try:
        source = "import os\nos.remove('/etc/issue.net')\n" + COUNTER_SOURCE
        sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none", PODMAN_IMAGE,
           "python3", "-c", source)
        read_state = lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout  # noqa: E731
        wait_counter(read_state, 2)
        sh(GPUCKPT, "export", name, "-o", str(archive), "--leave-running")
        sh(GPUCKPT, "export", name, "-o", f"oci:{directory / 'image'}:v1")
        sh("podman", "rm", "-f", "-t", "0", name)
        yield archive, name
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


@pytest.fixture(scope="module")
def unsigned_allowed(exported) -> Iterator[None]:
    """Edited archives and images are unsigned: explicit exceptions while these tests run (archives
    in their directory, images by restore:any), so what refuses them is the content check."""
    with unsigned_allowed_on_node(f"archive:{exported[0].parent}/", "restore:any",
                                  note="integration test: archive content"):
        yield


def moved(archive: Path, out: str, edit: ArchiveEdit, added: tuple[str, ...] = (), form: str = "tar") -> str:
    """The export edited by `edit`, as `gpuckpt import` takes it: an archive, or (form "oci") the
    checkpoint image exported beside it with its layer edited (the signature, which no longer
    matches, left out); the argument to give import."""
    if form == "tar":
        return str(edited_archive(archive, archive.parent / f"{out}.tar.zst", edit, added))
    source, target = archive.parent / "image", archive.parent / f"{out}-image"
    sh("rm", "-rf", str(target))
    sh("cp", "-a", str(source), str(target))
    blobs = target / "blobs" / "sha256"
    index = json.loads((target / "index.json").read_text())
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    layer = manifest["layers"][0]
    layer_file = blobs / layer["digest"][7:]
    new_layer = edited_archive(layer_file, target / "layer.new", edit, added)
    layer["digest"], layer["size"] = blob(blobs, new_layer.read_bytes()), new_layer.stat().st_size
    new_layer.unlink()
    manifest["annotations"].pop("io.gpuckpt.signature", None)
    manifest_bytes = json.dumps(manifest).encode()
    index["manifests"][0]["digest"], index["manifests"][0]["size"] = blob(blobs, manifest_bytes), len(manifest_bytes)
    (target / "index.json").write_text(json.dumps(index))
    return f"oci:{target}:v1"


def blob(blobs: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}"




def with_diff_entries(diff: bytes, entries: list[tuple[str, str, str]]) -> bytes:
    """podman's rootfs-diff.tar with entries (name, "symlink"|"file", target or content) added at its end."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(diff)) as tar_in, tarfile.open(fileobj=out, mode="w",
                                                                          format=tarfile.PAX_FORMAT) as tar_out:
        for member in tar_in:
            tar_out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)
        for name, kind, value in entries:
            info = tarfile.TarInfo(name)
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, value
                tar_out.addfile(info)
            else:
                info.size, info.mode = len(value), 0o755
                tar_out.addfile(info, io.BytesIO(value.encode()))
    return out.getvalue()


def imported(archive: Path | str, name: str) -> str:
    """`gpuckpt import` expected to refuse: its one line; no container and nothing staged left."""
    result = sh(GPUCKPT, "import", str(archive), "--name", name, check=False)
    assert result.returncode == 3, result.stdout + result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert containers_named(name) == ""
    assert staging_leftovers() == []
    return line


def podman_import(archive: Path, name: str) -> None:
    """podman's own restore --import (whatever its outcome), the container removed after."""
    sh("podman", "container", "restore", "--import", str(archive), "--name", name, check=False, timeout=300)
    sh("podman", "rm", "-f", "-t", "0", name, check=False)






@pytest.fixture
def host_scratch(tmp_path) -> Iterator[Path]:
    """A host directory an attack aims at, outside every container root."""
    target = Path(f"/var/tmp/gpuckpt-content-{os.getpid()}-{time.monotonic_ns() % 10**8}")
    target.mkdir()
    yield target
    sh("rm", "-rf", str(target))


@pytest.mark.hostile("real export (archive or image) whose rootfs-diff.tar makes a link to a host directory and "
                     "writes a file through it")
@pytest.mark.parametrize("form", ["tar", "oci"])
def test_a_file_written_through_a_link_in_the_diff_is_refused(exported, unsigned_allowed, host_scratch, form) -> None:
    archive, name = exported
    attack = moved(archive, "link", lambda entry, data: with_diff_entries(
        data, [("tmp/out", "symlink", str(host_scratch)), ("tmp/out/planted", "file", "#!/bin/sh\nid\n")])
        if entry == "rootfs-diff.tar" else data, form=form)
    if form == "tar":  # podman 4.3 follows the link on the host: the attack is real; podman 5 confines it
        podman_import(Path(attack), f"{name}-podman")
        assert (host_scratch / "planted").exists() == (podman_major() < 5), "podman's exposure changed: docs too"
        (host_scratch / "planted").unlink(missing_ok=True)
    line = imported(attack, f"{name}-gpuckpt")
    assert "rootfs-diff.tar: entry 'tmp/out/planted' is written through the link 'tmp/out'" in line, line
    assert not (host_scratch / "planted").exists()


@pytest.mark.hostile("real export (archive or image) whose deleted.files names /../../../../var/tmp/VICTIM")
@pytest.mark.parametrize("form", ["tar", "oci"])
def test_a_deletion_outside_the_root_is_refused(exported, unsigned_allowed, host_scratch, form) -> None:
    archive, name = exported
    victim = host_scratch / "victim"
    victim.write_text("the host's")
    path = f"/../../../../../../..{victim}"
    attack = moved(archive, "deleted",
                   lambda entry, data: json.dumps(["/etc/issue.net", path]).encode() if entry == "deleted.files"
                   else data, added=("deleted.files",) if not has_entry(archive, "deleted.files") else (), form=form)
    if form == "tar":
        podman_import(Path(attack), f"{name}-podman")
        assert victim.exists() == (podman_major() >= 5), "podman's exposure changed: docs too"
        victim.write_text("the host's")
    line = imported(attack, f"{name}-gpuckpt")
    assert f"deleted.files: the path {path!r} is not a file inside the container's root" in line, line
    assert victim.read_text() == "the host's"


def has_entry(archive: Path, name: str) -> bool:
    with open(archive, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as source, \
            tarfile.open(fileobj=source, mode="r|") as tar:
        return any(member.name == name for member in tar)


@pytest.mark.hostile("real export whose rootfs-diff.tar writes var/run/NAME (the image's own var/run -> /run link) "
                     "and whose deleted.files removes var/run/VICTIM")
def test_the_images_own_links_lead_inside_the_root_only(exported, unsigned_allowed, tmp_path) -> None:
    archive, name = exported
    tag = f"gpuckpt-content-{os.getpid()}-{time.monotonic_ns() % 10**8}"
    planted, victim = Path("/run") / tag, Path("/run") / f"{tag}-victim"
    attack = edited_archive(archive, archive.parent / "image-link.tar.zst", lambda entry, data: (
        with_diff_entries(data, [(f"var/run/{tag}", "file", "planted\n")]) if entry == "rootfs-diff.tar"
        else json.dumps(["/etc/issue.net", f"/var/run/{tag}-victim"]).encode() if entry == "deleted.files"
        else data), added=("deleted.files",) if not has_entry(archive, "deleted.files") else ())
    victim.write_text("the host's")
    restored = f"{name}-inside"
    try:
        podman_import(attack, f"{name}-podman")
        exposed = podman_major() < 5
        assert (planted.exists(), victim.exists()) == (exposed, not exposed), "podman's exposure changed: docs too"
        planted.unlink(missing_ok=True)
        victim.write_text("the host's")
        result = sh(GPUCKPT, "import", str(attack), "--name", restored)
        assert "the archive's runtime" not in result.stdout
        # the files went where the container sees them, the host's /run untouched
        assert sh("podman", "exec", restored, "cat", f"/run/{tag}").stdout == "planted\n"
        assert sh("podman", "exec", restored, "test", "!", "-e", "/etc/issue.net", check=False).returncode == 0
        assert not planted.exists() and victim.read_text() == "the host's"
        read_state = lambda: sh("podman", "exec", restored, "cat", "/tmp/state").stdout  # noqa: E731
        assert_continues(wait_counter(read_state, 1), read_state)
        assert staging_leftovers() == []
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False)
        planted.unlink(missing_ok=True)
        victim.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def zstd_bomb() -> bytes:
    """A small zstd stream of 2 GiB of zeros (level 19: seconds of CPU), made once for both forms."""
    with io.BytesIO() as bomb:
        with zstandard.ZstdCompressor(level=19).stream_writer(bomb, closefd=False) as writer:
            chunk = bytes(64 << 20)
            for _ in range(32):
                writer.write(chunk)
        return bomb.getvalue()


@pytest.mark.hostile("real export (archive or image) whose rootfs-diff.tar is a small zstd stream of 2 GiB of zeros")
@pytest.mark.parametrize("form", ["tar", "oci"])
def test_a_compressed_diff_is_refused_before_it_expands(exported, unsigned_allowed, zstd_bomb, form) -> None:
    archive, name = exported
    data = zstd_bomb
    assert len(data) < 200_000
    attack = moved(archive, "bomb", lambda entry, old: data if entry == "rootfs-diff.tar" else old, form=form)
    started = time.monotonic()
    line = imported(attack, f"{name}-bomb")
    assert "rootfs-diff.tar: is compressed (zstd)" in line, line
    assert time.monotonic() - started < 60


@pytest.mark.hostile("real export (archive or image) whose config.dump names the runtime runc (podman would never "
                     "call the shim)")
@pytest.mark.parametrize("form", ["tar", "oci"])
def test_an_archive_naming_another_runtime_restores_through_the_shim(exported, unsigned_allowed, form) -> None:
    archive, name = exported

    def runc(entry: str, data: bytes | None) -> bytes | None:
        if entry != "config.dump" or data is None:
            return data
        return json.dumps({**json.loads(data), "runtime": "runc"}).encode()

    attack = moved(archive, "runc", runc, form=form)
    restored = f"{name}-runc"
    try:
        result = sh(GPUCKPT, "import", attack, "--name", restored)
        assert "the archive's runtime 'runc' replaced by gpuckpt-runtime" in result.stdout, result.stdout
        assert sh("podman", "inspect", "--format", "{{.OCIRuntime}}", restored).stdout.strip() == "gpuckpt-runtime"
        read_state = lambda: sh("podman", "exec", restored, "cat", "/tmp/state").stdout  # noqa: E731
        assert_continues(wait_counter(read_state, 1), read_state)
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False)


def criu_config_annotation(entry: str, data: bytes | None) -> bytes | None:
    """config.dump naming runc, and both specs annotated with a CRIU configuration of the archive's choosing."""
    if data is None or entry not in ("config.dump", "spec.dump"):
        return data
    document = json.loads(data)
    spec = document["spec"] if entry == "config.dump" else document
    spec.setdefault("annotations", {})["org.criu.config"] = "/etc/hostname"
    if entry == "config.dump":
        document["runtime"] = "runc"
    return json.dumps(document).encode()


@pytest.mark.hostile("real export whose config.dump names runc and whose spec carries an org.criu.config annotation, "
                     "through podman's own restore --import and gpuckpt import")
def test_an_archive_naming_runc_meets_the_shims_checks_under_podmans_own_import(exported, unsigned_allowed) -> None:
    archive, name = exported
    runtimes = tomllib.loads(Path("/etc/containers/containers.conf").read_text())["engine"]["runtimes"]
    shim = Path(runtimes["gpuckpt-runtime"][0]).resolve()
    assert [Path(path).resolve() for path in runtimes.get("runc", [])][:1] == [shim], \
        "podman's runc is not the shim: this node was not set up with `gpuckpt install --engine podman --default`"
    attack = edited_archive(archive, archive.parent / "criu-config.tar.zst", criu_config_annotation)
    restored = f"{name}-annotated"
    try:
        result = sh("podman", "container", "restore", "--import", str(attack), "--name", restored, check=False)
        assert result.returncode != 0
        assert "carries the annotation org.criu.config='/etc/hostname'" in result.stderr, result.stderr
        assert sh("podman", "inspect", "--format", "{{.State.Pid}}", restored).stdout.strip() == "0"  # never ran
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False)
    line = imported(attack, restored)
    assert "carries the annotation org.criu.config='/etc/hostname': a CRIU configuration chosen by the container " \
           "is refused" in line, line


@pytest.fixture(scope="module")
def podman_installed(tmp_path_factory) -> Iterator[dict[str, str]]:
    """podman's containers.conf as this node has it, a copy given `gpuckpt install --engine podman --default` afresh
    (this node's runc and crun, if it has them, linked to gpuckpt-runtime): the environment that has podman read it
    alone, and the table it holds."""
    conf = tmp_path_factory.mktemp("podman-conf") / "containers.conf"
    conf.write_text(Path("/etc/containers/containers.conf").read_text())
    result = sh(GPUCKPT, "install", "--engine", "podman", "--default", "--runtime-path", RUNTIME, "--config", str(conf))
    assert "now run" in result.stdout, result.stdout
    yield dict(os.environ, CONTAINERS_CONF=str(conf))


def test_install_links_each_runtime_the_node_has_to_the_shim(podman_installed) -> None:
    table = tomllib.loads(Path(podman_installed["CONTAINERS_CONF"]).read_text())["engine"]["runtimes"]
    for name in ("runc", "crun"):
        if shutil.which(name) is None:
            assert name not in table or Path(table[name][0]).resolve() != Path(RUNTIME).resolve()
            continue
        [link] = table[name]
        assert Path(link).name == name and Path(link).resolve() == Path(RUNTIME).resolve()


def with_runtime(runtime: str, annotated: bool = True) -> ArchiveEdit:
    """config.dump naming `runtime`; with `annotated`, both specs carrying a CRIU configuration of the archive's
    choosing."""
    def edit(entry: str, data: bytes | None) -> bytes | None:
        if data is None or entry not in ("config.dump", "spec.dump"):
            return data
        document = json.loads(data)
        spec = document["spec"] if entry == "config.dump" else document
        if annotated:
            spec.setdefault("annotations", {})["org.criu.config"] = "/etc/hostname"
        if entry == "config.dump":
            document["runtime"] = runtime
        return json.dumps(document).encode()
    return edit


@pytest.mark.hostile("real export whose config.dump names crun (another runtime this node has) and whose spec "
                     "carries an org.criu.config annotation, through podman's own restore --import as installed")
def test_an_archive_naming_crun_meets_the_shim_under_podmans_own_import(exported, podman_installed) -> None:
    if shutil.which("crun") is None:
        pytest.skip("no crun on this node: podman has no runtime of that name to run")
    archive, name = exported
    attack = edited_archive(archive, archive.parent / "crun-annotated.tar.zst", with_runtime("crun"))
    restored = f"{name}-crun-annotated"
    try:
        result = sh("podman", "container", "restore", "--import", str(attack), "--name", restored, check=False,
                    env=podman_installed, timeout=300)
        assert result.returncode != 0
        assert "carries the annotation org.criu.config='/etc/hostname'" in result.stderr, result.stderr
        pid = sh("podman", "inspect", "--format", "{{.State.Pid}}", restored, env=podman_installed).stdout.strip()
        assert pid == "0"  # never ran
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False, env=podman_installed)


@pytest.mark.hostile("real export whose config.dump names a runtime by path (a program of the archive's choosing), "
                     "through podman's own restore --import: run by podman 4.3 and 5.8 as named; refused by podman "
                     "itself when given --runtime gpuckpt-runtime")
def test_a_runtime_by_path_is_podmans_to_run_unless_told_which_runtime(exported, podman_installed, tmp_path) -> None:
    archive, name = exported
    program = tmp_path / "not-a-runtime"
    ran = tmp_path / "ran"
    program.write_text(f'#!/bin/sh\necho "$@" >> {ran}\nexit 1\n')
    program.chmod(0o700)
    attack = edited_archive(archive, archive.parent / "by-path.tar.zst", with_runtime(str(program), annotated=False))
    restored = f"{name}-by-path"
    try:
        told = sh("podman", "--runtime", "gpuckpt-runtime", "container", "restore", "--import", str(attack),
                  "--name", restored, check=False, env=podman_installed, timeout=300)
        assert told.returncode != 0 and not ran.exists()
        assert f"was created with runtime '{program}' and cannot be restored with runtime 'gpuckpt-runtime'" in \
            told.stderr, told.stderr
        assert containers_named(restored) == ""
        # without it, podman runs the archive's program as the runtime (libpod/runtime.go: a name starting with /)
        sh("podman", "container", "restore", "--import", str(attack), "--name", restored, check=False,
           env=podman_installed, timeout=300)
        assert ran.exists(), f"podman {podman_major()} did not run a runtime given by path"
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False, env=podman_installed)


def test_a_crun_container_restores_through_the_shim_with_crun(podman_installed, tmp_path) -> None:
    """The links keep what they stand in for: a container podman runs as crun is checkpointed and restored by
    the shim with crun as its delegate (crun's state, not runc's), through podman's own export and --import."""
    if shutil.which("crun") is None:
        pytest.skip("no crun on this node")
    name = f"gpuckpt-crun-{os.getpid()}"
    archive = tmp_path / "crun.tar.zst"
    podman = lambda *argv, **kwargs: sh("podman", *argv, env=podman_installed, **kwargs)  # noqa: E731
    try:
        podman("run", "-d", "--runtime", "crun", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c",
               COUNTER_SOURCE)
        read_state = lambda: podman("exec", name, "cat", "/tmp/state").stdout  # noqa: E731
        wait_counter(read_state, 2)
        container_id = podman("inspect", "--format", "{{.Id}}", name).stdout.strip()
        assert Path(f"/run/crun/{container_id}").is_dir() and not Path(f"/run/runc/{container_id}").exists()
        podman("container", "checkpoint", "--export", str(archive), name, timeout=300)
        assert has_entry(archive, f"checkpoint/{DUMP_SIGNATURE}")  # the shim's checkpoint, crun's dump under it
        podman("rm", "-f", "-t", "0", name)
        podman("container", "restore", "--import", str(archive), timeout=300)
        assert podman("inspect", "--format", "{{.OCIRuntime}}", name).stdout.strip() == "crun"
        assert Path(f"/run/crun/{container_id}").is_dir() and not Path(f"/run/runc/{container_id}").exists()
        assert_continues(wait_counter(read_state, 1), read_state)
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False, env=podman_installed)


@pytest.fixture(scope="module")
def exported_with_volume(tmp_path_factory) -> Iterator[tuple[Path, str, str]]:
    """A counter container with a named volume and files in it and in /dev/shm, exported; the container and
    its volume removed: the archive, the container's and the volume's names."""
    directory = tmp_path_factory.mktemp("content-volume")
    name, volume = f"gpuckpt-contentvol-{os.getpid()}", f"gpuckpt-contentvol-{os.getpid()}"
    archive = directory / "volume.tar.zst"
    source = ("open('/data/kept', 'w').write('in the volume\\n')\nopen('/dev/shm/kept', 'w').write('in shm\\n')\n"
              + COUNTER_SOURCE)
    try:
        sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
           "-v", f"{volume}:/data", PODMAN_IMAGE, "python3", "-c", source)
        wait_counter(lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout, 2)
        sh(GPUCKPT, "export", name, "-o", str(archive))
        sh("podman", "rm", "-f", "-t", "0", name)
        sh("podman", "volume", "rm", volume)
        yield archive, name, volume
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
        sh("podman", "volume", "rm", "-f", volume, check=False)


@pytest.fixture(scope="module")
def volume_archives_allowed(exported_with_volume) -> Iterator[None]:
    with unsigned_allowed_on_node(f"archive:{exported_with_volume[0].parent}/",
                                  note="integration test: archive content (volumes)"):
        yield


def test_volumes_and_dev_shm_come_back_applied_by_the_shim(exported_with_volume) -> None:
    archive, name, volume = exported_with_volume
    try:
        # its volume's bind of this node's volume directory is the volume, not a host bind: no --trust-config
        result = sh(GPUCKPT, "import", str(archive))
        assert f"restored {name}" in result.stdout
        assert sh("podman", "exec", name, "cat", "/data/kept").stdout == "in the volume\n"
        assert sh("podman", "exec", name, "cat", "/dev/shm/kept").stdout == "in shm\n"
        read_state = lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout  # noqa: E731
        assert_continues(wait_counter(read_state, 1), read_state)
        # the volume's name is this node's now: a second import naming it is refused before podman runs
        sh("podman", "rm", "-f", "-t", "0", name)
        refused = sh(GPUCKPT, "import", "--trust-config", str(archive), check=False)
        assert refused.returncode == 3 and containers_named(name) == "" and staging_leftovers() == []
        assert f"names the volume {volume}, which this node already has: refused" in refused.stderr, refused.stderr
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
        sh("podman", "volume", "rm", "-f", volume, check=False)


@pytest.mark.hostile("real export whose config.dump makes its named volume a bind of a host directory "
                     "(volume-opt=type=none,o=bind,device=DIR)")
def test_a_volume_bound_to_a_host_directory_is_refused(exported_with_volume, volume_archives_allowed,
                                                       host_scratch) -> None:
    archive, name, volume = exported_with_volume

    def bind(entry: str, data: bytes | None) -> bytes | None:
        if entry != "config.dump" or data is None:
            return data
        config = json.loads(data)
        config["namedVolumes"][0]["options"] = ["volume-opt=type=none", "volume-opt=o=bind",
                                                f"volume-opt=device={host_scratch}"]
        return json.dumps(config).encode()

    line = imported(edited_archive(archive, archive.parent / "bind.tar.zst", bind), f"{name}-bind")
    assert f"volume {volume} with options beyond mount flags (volume-opt=type=none" in line, line
    assert list(host_scratch.iterdir()) == []


def pax_then_gnu_name(python_name: str, go_name: str, data: bytes) -> bytes:
    """One entry whose PAX record names it `python_name` and whose GNU long name (after it) names it
    `go_name`: Python's tarfile applies the PAX record, Go's archive/tar the long name."""
    def extension(kind: bytes, name: str, payload: bytes) -> bytes:
        info = tarfile.TarInfo(name)
        info.type, info.size = kind, len(payload)
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict") + payload + bytes(-len(payload) % 512)
    record = f" path={python_name}\n".encode()
    length = len(record) + 1
    while len(str(length)) + len(record) != length:
        length += 1
    out = extension(tarfile.XHDTYPE, "././@PaxHeader", str(length).encode() + record)
    out += extension(tarfile.GNUTYPE_LONGNAME, "././@LongLink", go_name.encode() + b"\0")
    info = tarfile.TarInfo(python_name)
    info.size = len(data)
    return out + info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict") + data + bytes(-len(data) % 512)


@pytest.mark.hostile("real export whose devshm-checkpoint.tar links a to a host directory, then has an entry Python "
                     "reads as 'safe' and Go (podman's untar) as 'a/planted'")
def test_a_dev_shm_entry_two_readers_name_differently_is_refused(exported, unsigned_allowed, host_scratch) -> None:
    archive, name = exported
    link = tarfile.TarInfo("a")
    link.type, link.linkname = tarfile.SYMTYPE, str(host_scratch)
    shm = link.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict") + pax_then_gnu_name("safe", "a/planted", b"x\n")
    shm += bytes(1024 + (-(len(shm) + 1024) % 10240))
    attack = edited_archive(archive, archive.parent / "shm.tar.zst",
                    lambda entry, data: shm if entry == "devshm-checkpoint.tar" else data)
    podman_import(attack, f"{name}-podman")
    assert (host_scratch / "planted").exists() == (podman_major() < 5), "podman's exposure changed: docs too"
    (host_scratch / "planted").unlink(missing_ok=True)
    line = imported(attack, f"{name}-shm")
    assert "devshm-checkpoint.tar: an entry named by both a PAX record and a GNU long name: refused" in line, line
    assert not (host_scratch / "planted").exists()


@pytest.mark.hostile("real export whose named volume spec.dump no longer mounts (a volume of config.dump alone, "
                     "which the shim refused only after podman made the container and the volume)")
def test_a_volume_spec_dump_does_not_mount_is_refused_before_podman_acts(exported_with_volume, tmp_path) -> None:
    archive, name, volume = exported_with_volume

    def unmounted(spec: dict) -> dict:
        return {**spec, "mounts": [mount for mount in spec["mounts"] if mount["destination"] != "/data"]}

    edit = edited_specs(unmounted)
    attack = edited_archive(archive, archive.parent / "unmounted.tar.zst",
                            lambda entry, data: data if entry == "config.dump" else edit(entry, data))
    # the edit unsigned it: an exception of a trust directory of this test's own, the node's policy untouched
    env = dict(os.environ, GPUCKPT_TRUST_DIR=str(tmp_path / "trust"), GPUCKPT_TRUST_LOG=str(tmp_path / "trust.log"))
    sh(GPUCKPT, "trust", "allow-unsigned", f"archive:{archive.parent}/", "--note", "integration test", env=env)
    result = sh(GPUCKPT, "import", str(attack), "--trust-config", check=False, env=env)
    assert result.returncode == 3, result.stdout + result.stderr  # refused (cli/exit_codes.py)
    assert f"volume {volume} at /data, which spec.dump does not mount" in result.stderr, result.stderr
    assert containers_named(name) == "" and staging_leftovers() == []
    assert sh("podman", "volume", "exists", volume, check=False).returncode != 0  # podman never made it


# -- the second review: a signed dump's spec.dump edited (F9), a forged import placeholder (F8) --------------------

def with_hook_and_device(scratch: Path) -> ArchiveEdit:
    """spec.dump (and config.dump's spec) given a createRuntime hook that runs /bin/sh on the host and /dev/kmsg."""
    def change(spec: dict) -> dict:
        hooks = spec.setdefault("hooks", {})
        hooks.setdefault("createRuntime", []).append(
            {"path": "/bin/sh", "args": ["sh", "-c", f"id > {scratch}/hook-ran"]})
        spec.setdefault("linux", {}).setdefault("devices", []).append(
            {"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11, "fileMode": 438})
        return spec
    return edited_specs(change)


@pytest.mark.hostile("this node's own signed export whose spec.dump gains a host hook and /dev/kmsg, through "
                     "podman's own restore --import (the dump signature covers checkpoint/ only)")
def test_a_signed_dump_whose_spec_dump_grants_more_is_refused_under_podmans_own_import(exported, host_scratch) -> None:
    archive, name = exported
    attack = edited_archive(archive, archive.parent / "spec-grants.tar.zst", with_hook_and_device(host_scratch))
    restored = f"{name}-grants"
    try:
        result = sh("podman", "container", "restore", "--import", str(attack), "--name", restored, check=False,
                    timeout=300)
        assert result.returncode != 0
        assert "its spec grants hooks (createRuntime /bin/sh); device nodes (/dev/kmsg (c 1:11)), which the " \
               "checkpointed container did not have" in result.stderr, result.stderr
        assert not (host_scratch / "hook-ran").exists()  # runc never ran: the hook with it
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False)

    def host_root(spec: dict) -> dict:
        spec["mounts"].append({"destination": "/host", "type": "bind", "source": "/", "options": ["rbind", "rw"]})
        return spec
    attack = edited_archive(archive, archive.parent / "spec-bind.tar.zst", edited_specs(host_root))
    try:
        result = sh("podman", "container", "restore", "--import", str(attack), "--name", restored, check=False,
                    timeout=300)
        assert result.returncode != 0 and "its spec grants bind mounts (/host <- / rw)" in result.stderr, result.stderr
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False)


@pytest.mark.hostile("an unsigned dump whose archive carries gpuckpt's import placeholder, its token a path to a "
                     "record of the archive's own, through podman's own restore --import")
def test_a_forged_import_placeholder_vouches_for_nothing(exported, host_scratch) -> None:
    archive, name = exported
    token = f"../../../../..{host_scratch}/x-{'c' * 32}"
    (host_scratch / f"x-{'c' * 32}.json").write_text(json.dumps(
        {"token": "c" * 32, "pages_dir": str(host_scratch), "pages": [], "created": "2026-11-28T00:00:00Z",
         "volume_destinations": {}, "volume_directories": {}, "storage": "", "vouched": "forged"}))
    hooked = with_hook_and_device(host_scratch)

    def forged(entry: str, data: bytes | None) -> bytes | None:
        if entry == f"checkpoint/{DUMP_SIGNATURE}":
            return None  # unsigned: only a vouching record would let it restore
        if entry == "checkpoint/gpuckpt-import.json":
            return json.dumps({"kind": "gpuckpt-staged-import", "token": token}).encode()
        return hooked(entry, data)

    attack = edited_archive(archive, archive.parent / "forged.tar.zst", forged,
                            added=("checkpoint/gpuckpt-import.json",))
    restored = f"{name}-forged"
    try:
        result = sh("podman", "container", "restore", "--import", str(attack), "--name", restored, check=False,
                    timeout=300)
        assert result.returncode != 0
        assert "not a gpuckpt import placeholder" in result.stderr, result.stderr
        assert not (host_scratch / "hook-ran").exists()
    finally:
        sh("podman", "rm", "-f", "-t", "0", restored, check=False)

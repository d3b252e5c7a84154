"""podman's checkpoint archive and the checkpoint OCI image layout: read, re-emitted and written
streaming; every hostile or damaged input refused with one line, nothing written outside."""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import stat
import tarfile

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from podman_tars import CONFIG, MANIFEST, PODMAN_LINUX, SPEC, podman_tar

from gpuckpt.cli import inspect
from gpuckpt.cli.main import main
from gpuckpt.errors import ImageError, UsageError
from gpuckpt.node.hook_entry import STAGES, spec_entry
from gpuckpt.oci import image_layout
from gpuckpt.oci.image_layout import CheckpointImageWriter, parse_target, read_layout, verify_layer
from gpuckpt.oci.podman_archive import ArchiveWriter, check_podman_archive, copy_checked, described
from gpuckpt.policy.archive_import import import_refusals, volume_refusals


@pytest.mark.parametrize("compress", [zstandard.ZstdCompressor().compress, gzip.compress, lambda data: data])
def test_podmans_archive_is_read_in_any_of_its_compressions(tmp_path, compress) -> None:
    path = tmp_path / "podman.tar"
    path.write_bytes(compress(podman_tar()))
    archive = check_podman_archive(str(path))
    assert (archive.config.name, archive.config.rootfsImageName) == ("web", "localhost/app:1")
    assert archive.manifest.container_id == "c1" and archive.files == 5
    assert archive.bytes == sum(len(d) for d in (b"inv", MANIFEST, CONFIG, SPEC)) + 4096 * 8


def test_copy_re_emits_every_entry_owned_by_root_and_keeps_the_small_files() -> None:
    out, kept, source = io.BytesIO(), {}, podman_tar()
    copied = copy_checked(io.BytesIO(source), out, "podman.tar", kept=kept)
    assert set(kept) == {"config.dump", "spec.dump", "checkpoint/gpuckpt-manifest.json"}
    out.seek(0)
    with tarfile.open(fileobj=out) as again, tarfile.open(fileobj=io.BytesIO(source)) as original:
        assert [m.name for m in again] == [m.name for m in original] == copied.names
        assert all(m.uid == 0 and m.uname == "root" for m in again)
        assert (
            again.extractfile("checkpoint/pages-1.img").read() == original.extractfile("checkpoint/pages-1.img").read()
        )


@pytest.mark.parametrize("extra, message", [
    ([("checkpoint/../../x", b"1")], "escapes"),
    ([("config.dump", CONFIG)], "appears twice"),
    ([("/etc/x", b"1")], "escapes|absolute"),
])
def test_hostile_entries_are_named_with_the_archive(tmp_path, extra, message) -> None:
    path = tmp_path / "podman.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(podman_tar(extra)))
    with pytest.raises(ImageError, match=message) as refused:
        check_podman_archive(str(path))
    assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)


def test_not_podmans_layout_or_bad_config_is_refused(tmp_path) -> None:
    path = tmp_path / "a.tar"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("config.dump")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"{bad}"))
    path.write_bytes(out.getvalue())
    with pytest.raises(ImageError, match="not a podman checkpoint archive: no spec.dump, checkpoint/inventory.img"):
        check_podman_archive(str(path))
    copied, kept = copy_checked(io.BytesIO(out.getvalue()), None, "a.tar", kept={}), {"config.dump": b"{bad}"}
    with pytest.raises(ImageError, match="config.dump or spec.dump is not valid"):
        described("a.tar", kept | {"spec.dump": b"{}"}, copied.names + ["spec.dump", "checkpoint/inventory.img"], 1, 5)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1), garbage=st.binary(min_size=1, max_size=64), cut=st.booleans())
def test_fuzzed_podman_archives_are_read_or_refused_in_one_line(tmp_path_factory, position, garbage, cut) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    data = bytearray(zstandard.ZstdCompressor().compress(podman_tar()))
    at = int(position * (len(data) - 1))
    path = base / "a.tar.zst"
    path.write_bytes(bytes(data[:at]) if cut else bytes(data[:at] + garbage + data[at + len(garbage):]))
    try:
        archive = check_podman_archive(str(path))
        assert archive.config.name  # what passed is a whole podman archive
    except ImageError as error:
        assert "\n" not in str(error)
    assert sorted(p.name for p in base.iterdir()) == ["a.tar.zst"]  # the reader writes nothing


def test_archive_writer_is_root_only_and_leaves_nothing_when_discarded(tmp_path) -> None:
    path = tmp_path / "out.tar.zst"
    writer = ArchiveWriter(str(path), threads=2)
    copy_checked(io.BytesIO(podman_tar()), writer.layer(), "podman.tar")
    writer.finish(None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and check_podman_archive(str(path)).config.name == "web"
    failed = ArchiveWriter(str(tmp_path / "failed.tar.zst"))
    failed.layer().write(b"half")
    failed.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tar.zst"]


def write_image(directory, tag: str = "ckpt") -> None:
    writer = CheckpointImageWriter(str(directory), tag, threads=2)
    kept = {}
    copied = copy_checked(io.BytesIO(podman_tar()), writer.layer(), "podman.tar", kept=kept)
    writer.finish(described("podman.tar", kept, copied.names, copied.files, copied.bytes))


def blob(directory, digest: str):
    return directory / "blobs" / "sha256" / digest.removeprefix("sha256:")


def test_image_layout_round_trip_with_podmans_annotations_and_true_digests(tmp_path) -> None:
    layout = tmp_path / "img"
    write_image(layout)
    assert stat.S_IMODE(layout.stat().st_mode) == 0o700
    image = read_layout(str(layout), "ckpt")
    annotations = image.manifest.annotations
    assert annotations["io.podman.annotations.checkpoint.name"] == "web"
    assert annotations["io.podman.annotations.checkpoint.rootfsImageName"] == "localhost/app:1"
    assert annotations["io.kubernetes.cri-o.annotations.checkpoint.name"] == "web"  # what CRI-O reads
    layer = blob(layout, image.layer.digest).read_bytes()
    assert image.layer.digest == f"sha256:{hashlib.sha256(layer).hexdigest()}"
    config = json.loads(blob(layout, image.manifest.config.digest).read_bytes())
    diff_id = hashlib.sha256(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(layer)).read()).hexdigest()
    assert config["rootfs"]["diff_ids"] == [f"sha256:{diff_id}"]  # what skopeo and podman verify
    assert check_podman_archive(image.layer_path).config.name == "web"
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["annotations"] == {"org.opencontainers.image.ref.name": "ckpt"}
    assert "annotations" not in json.loads(blob(layout, image.manifest.config.digest).read_bytes())


def tamper_manifest(layout, change) -> None:
    """Rewrite the image manifest through `change` and point the index at the new blob."""
    index = json.loads((layout / "index.json").read_text())
    old = index["manifests"][0]
    manifest = json.loads(blob(layout, old["digest"]).read_bytes())
    change(manifest)
    data = json.dumps(manifest).encode()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    blob(layout, digest).write_bytes(data)
    old.update(digest=digest, size=len(data))
    (layout / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("change, message", [
    (lambda m: m["layers"][0].update(digest="sha256:../../../../etc/shadow"), "is not sha256:<64 hex digits>"),
    (lambda m: m["layers"][0].update(size=m["layers"][0]["size"] + 1), "declared"),
    (lambda m: m["layers"][0].update(digest="sha256:" + "0" * 64), "is missing"),
    (lambda m: m.update(annotations={}), "no io.podman.annotations.checkpoint"),
    (lambda m: m["layers"].append(m["layers"][0]), "one tar layer"),
    (lambda m: m["layers"][0].update(mediaType="application/x-evil"), "one tar layer"),
])
def test_hostile_image_layouts_are_refused(tmp_path, change, message) -> None:
    layout = tmp_path / "img"
    write_image(layout)
    tamper_manifest(layout, change)
    with pytest.raises(ImageError, match=message):
        read_layout(str(layout), "ckpt")


def test_a_manifest_blob_that_does_not_match_its_digest_or_an_absent_tag_is_refused(tmp_path) -> None:
    layout = tmp_path / "img"
    write_image(layout)
    with pytest.raises(ImageError, match="tag other wanted; the layout holds: ckpt"):
        read_layout(str(layout), "other")
    digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    data = bytearray(blob(layout, digest).read_bytes())
    data[-2] ^= 1
    blob(layout, digest).write_bytes(bytes(data))
    with pytest.raises(ImageError, match="does not match its digest"):
        read_layout(str(layout))


def test_oci_targets_and_existing_directories(tmp_path) -> None:
    assert parse_target(f"oci:{tmp_path}/x") == (f"{tmp_path}/x", "latest")
    assert parse_target(f"oci:{tmp_path}/x:v1.2") == (f"{tmp_path}/x", "v1.2")
    assert parse_target("/var/ckpt.tar.zst") is None
    with pytest.raises(UsageError, match="oci:DIRECTORY"):
        parse_target("oci:/x:bad/tag")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine")
    with pytest.raises(UsageError, match="already exists"):
        CheckpointImageWriter(str(tmp_path / "full"), "t")
    assert (tmp_path / "full" / "keep").read_text() == "mine"


@pytest.mark.parametrize("cut", [1, 4, 40, 5000])
def test_a_zstd_stream_cut_anywhere_is_refused(tmp_path, cut) -> None:
    """python-zstandard's reader ends quietly at a cut; the frame walk does not (even a lost checksum)."""
    data = zstandard.ZstdCompressor(write_checksum=True, threads=2).compress(podman_tar())
    path = tmp_path / "cut.tar.zst"
    path.write_bytes(data[:-cut])
    with pytest.raises(ImageError, match="truncated or corrupt archive"):
        check_podman_archive(str(path))


def test_a_plain_tar_without_its_end_blocks_is_refused(tmp_path) -> None:
    data = podman_tar()
    path = tmp_path / "cut.tar"
    path.write_bytes(data[:data.rindex(SPEC) + -(-len(SPEC) // 512) * 512])  # cut after the last entry's data
    with pytest.raises(ImageError, match="ends before the end-of-archive blocks"):
        check_podman_archive(str(path))



def test_an_unknown_gpu_manifest_version_inside_is_refused(tmp_path) -> None:
    future = json.dumps({"schema_version": 99, "created": "2030-01-01T00:00:00Z", "container_id": "c1"}).encode()
    path = tmp_path / "future.tar"
    path.write_bytes(podman_tar(manifest=future))
    with pytest.raises(ImageError, match="schema"):
        check_podman_archive(str(path))



def test_an_os_error_is_one_line_from_the_cli(tmp_path, capsys, node, monkeypatch) -> None:
    def disk_full(path):
        raise OSError(errno.ENOSPC, "No space left on device", "/var/lib/containers/.gpuckpt-import-x")

    monkeypatch.setattr(inspect, "_summary", disk_full)
    assert main(["inspect", str(tmp_path)]) == 1
    assert capsys.readouterr().err == ("gpuckpt inspect: /var/lib/containers/.gpuckpt-import-x: "
                                       "No space left on device\n")


PODMAN_ID = "ab" * 32
USERDATA = f"/var/lib/containers/storage/overlay-containers/{PODMAN_ID}/userdata"


def podman_spec(**changes) -> dict:
    """The spec.dump of an ordinary `podman run`: podman's own bind mounts from the container's userdata."""
    spec = {"ociVersion": "1.0.2",
            "process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_CHOWN"]}},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/etc/hosts", "type": "bind", "source": f"{USERDATA}/hosts",
                        "options": ["bind", "private"]},
                       {"destination": "/dev/shm", "type": "bind", "source": f"{USERDATA}/shm", "options": ["bind"]}],
            "linux": PODMAN_LINUX}
    spec.update(changes)
    return spec


@pytest.mark.parametrize("config_changes, spec_changes, refusal", [
    ({}, {}, None),
    ({"privileged": True}, {}, "a privileged container"),
    ({"runtime": "/tmp/x/gpuckpt-runtime"}, {}, None),  # never asked: podman is given gpuckpt-runtime
    ({"id": "../../x"}, {}, "a container ID that is not podman's"),
    ({}, {"hooks": {"prestart": [{"path": "/tmp/evil"}]}}, "OCI hooks in spec.dump (prestart)"),
    ({}, {"process": {"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}}, "capabilities beyond podman's default"),
    ({}, {"linux": PODMAN_LINUX | {"devices": [{"path": "/dev/hostdisk", "type": "b", "major": 254, "minor": 0}]}},
     "host devices in spec.dump (/dev/hostdisk (b 254:0)"),
    # this node (its /dev below) has no GPU: NVIDIA's numbers are no one's (tests/test_device_identity.py: a node with)
    ({}, {"linux": PODMAN_LINUX | {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                                               {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]}},
     "host devices in spec.dump (/dev/nvidia0 (c 195:0), /dev/nvidiactl (c 195:255)"),
    ({"rootfs": "/"}, {}, "a root filesystem given by path (/)"),
    ({}, {"linux": PODMAN_LINUX | {"namespaces": [{"type": "mount"}, {"type": "ipc"}, {"type": "uts"}]}},
     "the host's network, pid namespace(s) in spec.dump"),
    ({}, {"linux": PODMAN_LINUX | {"namespaces": [*PODMAN_LINUX["namespaces"][1:],
                                                  {"type": "pid", "path": "/proc/1/ns/pid"}]}},
     "namespaces joined by path in spec.dump (pid)"),
    ({}, {"linux": {k: v for k, v in PODMAN_LINUX.items() if k != "seccomp"}}, "no seccomp filter in spec.dump"),
    ({}, {"linux": PODMAN_LINUX | {"maskedPaths": []}}, "paths podman masks left visible in spec.dump (/proc/acpi"),
    ({}, {"linux": PODMAN_LINUX | {"readonlyPaths": ["/proc/bus"]}},
     "paths podman makes read-only left writable in spec.dump (/proc/asound, /proc/fs, /proc/irq)"),
    ({}, {"mounts": [{"destination": "/host", "type": "bind", "source": "/", "options": ["rbind"]}]},
     "host bind mounts in spec.dump (/)"),
    ({}, {"mounts": [{"destination": "/x", "source": f"{USERDATA}/../../../../../../etc", "options": ["bind"]}]},
     "host bind mounts in spec.dump (/var/lib/containers/storage/overlay-containers/"),
])
def test_import_refuses_what_gives_the_container_more_of_the_node(tmp_path, node, monkeypatch, config_changes,
                                                                   spec_changes, refusal) -> None:
    (tmp_path / "dev").mkdir()
    monkeypatch.setenv("GPUCKPT_DEV_DIR", str(tmp_path / "dev"))
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()} | config_changes
    path = tmp_path / "a.tar"
    path.write_bytes(
        podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec(**spec_changes)).encode())
    )
    refusals = import_refusals(check_podman_archive(str(path)))
    assert refusals == [] if refusal is None else any(r.startswith(refusal) for r in refusals), refusals


OWN_HOOK = "/usr/local/bin/gpuckpt-hook"


@pytest.mark.hostile("an archive whose spec.dump hooks imitate gpuckpt-hook's entries with another path, "
                     "argument, env or stage")
@pytest.mark.parametrize(("hooks", "refused"), [
    ({stage: [spec_entry(OWN_HOOK, stage)] for stage in STAGES}, False),  # podman wrote this node's own hook
    ({"createRuntime": [{**spec_entry(OWN_HOOK, "createRuntime"), "env": []}]}, False),
    ({"createRuntime": [spec_entry("/tmp/gpuckpt-hook", "createRuntime")]}, True),
    ({"createRuntime": [{**spec_entry(OWN_HOOK, "createRuntime"), "args": ["gpuckpt-hook", "poststop", "-x"]}]}, True),
    ({"createRuntime": [{**spec_entry(OWN_HOOK, "createRuntime"), "env": ["LD_PRELOAD=/x.so"]}]}, True),
    ({"prestart": [spec_entry(OWN_HOOK, "prestart")]}, True),
    ({"createRuntime": [spec_entry(OWN_HOOK, "createRuntime"), {"path": "/bin/sh"}]}, True),
])
def test_import_accepts_only_this_nodes_own_hook_entries(tmp_path, hooks, refused) -> None:
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec(hooks=hooks)).encode()))
    refusals = import_refusals(check_podman_archive(str(path)), frozenset({OWN_HOOK}))
    assert bool(refusals) == refused and all(r.startswith("OCI hooks in spec.dump") for r in refusals), refusals


def test_layouts_of_another_schema_or_a_huge_manifest_or_a_wrong_layer_are_refused(tmp_path, monkeypatch) -> None:
    layout = tmp_path / "img"
    write_image(layout)
    image = read_layout(str(layout))
    index = json.loads((layout / "index.json").read_text())
    (layout / "index.json").write_text(json.dumps(index | {"schemaVersion": 99}))
    with pytest.raises(ImageError, match="schemaVersion 99; 2 is supported"):
        read_layout(str(layout))
    # the index points its manifest at the (large) layer blob: refused before it is read
    index["manifests"][0].update(digest=image.layer.digest, size=image.layer.size)
    (layout / "index.json").write_text(json.dumps(index))
    monkeypatch.setattr(image_layout, "MAX_JSON_BYTES", 1024)  # the test layer is small; JSON blobs are smaller
    with pytest.raises(ImageError, match=f"declares {image.layer.size} bytes, more than 1024"):
        read_layout(str(layout))
    monkeypatch.undo()
    data = bytearray(blob(layout, image.layer.digest).read_bytes())
    data[len(data) // 2] ^= 1
    blob(layout, image.layer.digest).write_bytes(bytes(data))
    with pytest.raises(ImageError, match="the layer does not match its digest"):
        verify_layer(image)


NETNS = {"type": "network", "path": "/run/netns/netns-1f0c4b9e-5a1d-2b3c-8d7e-0a1b2c3d4e5f"}


@pytest.mark.parametrize(("create_net_ns", "refused"), [(True, False), (False, True), (None, True)])
def test_podmans_own_network_namespace_path_is_accepted_only_where_podman_replaces_it(tmp_path, create_net_ns,
                                                                                       refused) -> None:
    # `podman run` with its default network writes the netns it made into spec.dump (seen in podman
    # 4.3's export on the CI machine); on restore podman puts the new container's own netns there
    # (addNetworkNamespace, config.dump createNetNS). Without createNetNS the path is the one joined.
    namespaces = [*(n for n in PODMAN_LINUX["namespaces"] if n["type"] != "network"), NETNS]
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()}
    if create_net_ns is not None:
        config["createNetNS"] = create_net_ns
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(),
                                spec=json.dumps(podman_spec(linux=PODMAN_LINUX | {"namespaces": namespaces})).encode()))
    refusals = import_refusals(check_podman_archive(str(path)))
    assert refusals == (["namespaces joined by path in spec.dump (network)"] if refused else []), refusals


RUN_ROOT = "/run/containers/storage"
OWN_PID_FILE = f"{RUN_ROOT}/overlay-containers/{PODMAN_ID}/userdata/conmon.pid"


@pytest.mark.hostile("config.dump fields podman's --import keeps from the archive (not in any spec): conmon's and the "
                     "container's pid files, written by root wherever they point, and another container's namespaces")
@pytest.mark.parametrize(("config_changes", "refusal"), [
    ({"conmonPidFile": OWN_PID_FILE, "pid_file": f"{RUN_ROOT}/overlay-containers/{PODMAN_ID}/userdata/pidfile"},
     None),  # podman 4.3's own, under this node's run root: podman's restore sets its own instead
    ({"conmonPidFile": "/etc/shadow"}, "pid files podman would write on this node (/etc/shadow)"),
    ({"pid_file": "/tmp/x/overlay-containers/" + PODMAN_ID + "/userdata/pidfile"}, "pid files podman would write"),
    ({"conmonPidFile": "/var/run/containers/storage/x"}, "pid files podman would write"),
    ({"pidNsCtr": "cd" * 32}, "the namespaces of another container (pidNsCtr"),
    ({"netNsCtr": "cd" * 32, "createNetNS": False}, "the namespaces of another container (netNsCtr"),
])
def test_import_refuses_config_dump_fields_podman_acts_on(tmp_path, config_changes, refusal) -> None:
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()} | config_changes
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec()).encode()))
    refusals = import_refusals(check_podman_archive(str(path)), run_root=RUN_ROOT)
    assert refusals == [] if refusal is None else any(r.startswith(refusal) for r in refusals), refusals


def test_the_pid_files_podman_gives_this_very_container_pass_under_another_run_root(tmp_path) -> None:
    """An archive from a node with root's default run root, imported where podman has another (the signed-move
    test's node B): podman keeps those paths, in its own root-only directory named by the archive's own ID."""
    own = {"conmonPidFile": OWN_PID_FILE, "pid_file": f"{RUN_ROOT}/overlay-containers/{PODMAN_ID}/userdata/pidfile"}
    other_id = {"conmonPidFile": f"{RUN_ROOT}/overlay-containers/{'cd' * 32}/userdata/conmon.pid"}
    for changes, refused in ((own, False), (other_id, True)):
        config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()} | changes
        path = tmp_path / "a.tar"
        path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec()).encode()))
        refusals = import_refusals(check_podman_archive(str(path)), run_root="/var/tmp/node-b/run")
        assert bool(refusals) == refused, refusals


@pytest.mark.hostile("config.dump's pid files at podman's default run root for an ID whose userdata directory there "
                     "is another container's (imported where podman has another run root): conmon would replace them")
def test_the_pid_files_of_an_id_another_container_holds_there_are_refused(tmp_path) -> None:
    """Under another run root podman never makes the default one's userdata directory: one with files in it
    belongs to another container (CRI-O's, a second store's) with the ID the archive chose, whose conmon.pid
    and pidfile conmon and the runtime would replace, as root. Absent or empty, nothing of another's is there."""
    default_root, userdata = tmp_path / "run", tmp_path / f"run/overlay-containers/{PODMAN_ID}/userdata"
    own = {"conmonPidFile": f"{default_root}/overlay-containers/{PODMAN_ID}/userdata/conmon.pid"}
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()} | own
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec()).encode()))
    archive = check_podman_archive(str(path))

    def refusals() -> list[str]:
        return import_refusals(archive, run_root="/var/tmp/node-b/run", default_run_root=str(default_root))

    assert refusals() == []  # no such directory
    userdata.mkdir(parents=True)
    assert refusals() == []  # empty
    (userdata / "conmon.pid").write_text("4242")  # another container's, running
    assert any(r.startswith("pid files podman would write") for r in refusals()), refusals()
    (userdata / "conmon.pid").unlink()
    userdata.rmdir()
    userdata.symlink_to(tmp_path)
    assert any(r.startswith("pid files podman would write") for r in refusals()), refusals()


@pytest.mark.hostile("a bind mount whose source only holds podman's userdata words: a local user's link there "
                     "(/tmp/x/overlay-containers/ID/userdata -> a root-only directory) was mounted read-write at the "
                     "container's next start after a real podman 4.3 restore --import; or a second entry for a "
                     "destination podman's import drops only once")
@pytest.mark.parametrize(("mount", "refused"), [
    ({"destination": "/etc/hostname", "source": f"{USERDATA}/hostname"}, False),
    ({"destination": "/run/.containerenv", "source": f"{USERDATA}/.containerenv"}, False),
    ({"destination": "/hostdir", "source": f"/tmp/x/overlay-containers/{PODMAN_ID}/userdata"}, True),
    ({"destination": "/data", "source": f"{USERDATA}/artifacts"}, True),
    ({"destination": "/etc/hosts", "source": f"/tmp/x/overlay-containers/{PODMAN_ID}/userdata/hosts"}, True),
])
def test_only_the_bind_mounts_podmans_import_drops_are_accepted(tmp_path, mount, refused) -> None:
    spec = podman_spec()
    spec["mounts"] = [*spec["mounts"], mount | {"type": "bind", "options": ["rbind", "rw"]}]
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
    refusals = import_refusals(check_podman_archive(str(path)))
    assert any(r.startswith("host bind mounts in spec.dump") for r in refusals) == refused, refusals


def test_a_bind_behind_another_mount_of_a_dropped_destination_is_kept_and_refused(tmp_path) -> None:
    # podman's RemoveMount drops the first mount at /etc/hosts (here a tmpfs); the bind after it stays
    spec = podman_spec(mounts=[{"destination": "/etc/hosts", "type": "tmpfs", "source": "tmpfs"},
                               {"destination": "/etc/hosts", "type": "bind", "source": "/etc/shadow",
                                "options": ["bind"]}])
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
    assert "host bind mounts in spec.dump (/etc/shadow)" in import_refusals(check_podman_archive(str(path)))


@pytest.mark.hostile("config.dump keys Go's encoding/json folds onto podman's fields (PIDNsCtr, ConmonPidFile, "
                     "CreateNetNS) that the checks above would not see")
@pytest.mark.parametrize("key", ["PIDNsCtr", "ConmonPidFile", "Pid_File", "CreateNetNS", "NetNSCtr"])
def test_a_config_dump_key_spelled_otherwise_than_podmans_is_refused(tmp_path, key) -> None:
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec(), key: "cd" * 32}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec()).encode()))
    with pytest.raises(ImageError, match="spelled otherwise"):
        check_podman_archive(str(path))


PODMAN_KERNEL_MOUNTS = [  # podman 4.3's own, from a real export on the CI machine
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "newinstance"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["rprivate", "nosuid", "ro"]},
]


@pytest.mark.hostile("a second proc mount in spec.dump (/hostproc): none of podman's masked or read-only paths "
                     "cover it; after a real podman 4.3 restore --import and the container's next start, "
                     "/hostproc/sys/kernel/core_pattern was writable from the container (a program the host runs)")
@pytest.mark.parametrize(("mount", "refusal"), [
    (None, None),
    ({"destination": "/hostproc", "type": "proc", "source": "proc"}, "kernel filesystems podman run does not mount"),
    ({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid"]},
     "kernel filesystems podman run does not mount"),
    ({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["rw"]},
     "kernel filesystems podman run does not mount"),
    ({"destination": "/x", "type": "overlay", "source": "overlay", "options": ["lowerdir=/etc:/root"]},
     "kernel filesystems podman run does not mount"),
    ({"destination": "/x", "type": "ext4", "source": "/dev/sda1"}, "kernel filesystems podman run does not mount"),
    ({"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["rw"]}, None),
])
def test_import_refuses_kernel_filesystems_podman_run_does_not_mount(tmp_path, mount, refusal) -> None:
    spec = podman_spec()
    spec["mounts"] = [*PODMAN_KERNEL_MOUNTS, *spec["mounts"][1:], *([mount] if mount else [])]
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
    refusals = import_refusals(check_podman_archive(str(path)))
    assert refusals == [] if refusal is None else any(r.startswith(refusal) for r in refusals), refusals


@pytest.mark.hostile("a seccomp filter that lets every call through (defaultAction SCMP_ACT_ALLOW, no rules) "
                     "passed as 'a seccomp filter'; a listenerPath has runc hand the filter's fd to a host socket")
@pytest.mark.parametrize(("seccomp", "refused"), [
    ({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}, False),
    ({"defaultAction": "SCMP_ACT_ALLOW"}, True),
    ({"defaultAction": "SCMP_ACT_LOG", "syscalls": []}, True),
    ({"defaultAction": "SCMP_ACT_ERRNO", "listenerPath": "/run/some.sock"}, True),
])
def test_a_seccomp_filter_that_filters_nothing_is_refused(tmp_path, seccomp, refused) -> None:
    spec = podman_spec(linux=PODMAN_LINUX | {"seccomp": seccomp})
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
    refusals = import_refusals(check_podman_archive(str(path)))
    assert any(r.startswith("no seccomp filter in spec.dump") for r in refusals) == refused, refusals


@pytest.mark.hostile("config.dump naming podman secrets: podman's --import copies each named secret of this node into "
                     "the container's storage, and its next start mounts them (/run/secrets) or sets them as env")
@pytest.mark.parametrize("config_changes", [
    {"secrets": [{"name": "db-password", "id": "ab" * 12, "UID": 0, "GID": 0, "Mode": 420, "Target": ""}]},
    {"secret_env": {"PASSWORD": {"name": "db-password", "id": "ab" * 12}}},
])
def test_import_refuses_an_archive_that_names_podman_secrets(tmp_path, config_changes) -> None:
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()} | config_changes
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec()).encode()))
    assert any(r.startswith("this node's podman secrets (db-password")
               for r in import_refusals(check_podman_archive(str(path)))), config_changes


@pytest.mark.hostile("config.dump overlay volumes (podman run -v SRC:DEST:O): not in any spec, podman mounts them from "
                     "the host path at the container's next start (a root-only directory read from the container "
                     "after a real podman 4.3 restore --import)")
@pytest.mark.parametrize(("config_changes", "refusal"), [
    ({"overlayVolumes": [{"dest": "/hostdir", "source": "/etc"}]}, "host directories as overlay volumes (/etc)"),
    ({"overlayVolumes": [{"dest": "/d", "source": "/srv", "options": ["U", "upperdir=/srv/u"]}]},
     "host directories as overlay volumes (/srv)"),
])
def test_import_refuses_overlay_volumes(tmp_path, config_changes, refusal) -> None:
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec()} | config_changes
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(podman_spec()).encode()))
    assert refusal in import_refusals(check_podman_archive(str(path)))


REF = "org.opencontainers.image.ref.name"


def test_a_layouts_image_names_are_shown_only_as_tags(tmp_path) -> None:
    """An index's names are the layout's bytes: a name with a terminal's escapes and a line of its own was
    printed whole (100 KB) in the one line saying which tag was wanted."""
    layout = tmp_path / "img"
    write_image(layout)
    index = json.loads((layout / "index.json").read_text())
    hostile = {REF: "a\x1b]0;x\x07\nrestored" + "B" * 100_000}
    index["manifests"] += [dict(index["manifests"][0], annotations=hostile)]
    index["manifests"] += [dict(index["manifests"][0], annotations={REF: f"t{n:02}"}) for n in range(25)]
    (layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(ImageError) as refused:
        read_layout(str(layout), "other")
    message = str(refused.value)
    assert message.isprintable() and len(message) < 1000 and "and 7 more" in message and "ckpt" in message
    index["manifests"] = index["manifests"][1:2]
    (layout / "index.json").write_text(json.dumps(index))
    assert read_layout(str(layout)).tag == ""


@pytest.mark.hostile("an archive whose named volume is bound from a host directory in spec.dump, or carries "
                     "volume-opt options, imported with and without --trust-config")
def test_a_named_volume_is_its_own_directory_on_this_node_only(tmp_path) -> None:
    graph = "/var/lib/containers/storage"
    volume = {"volumeName": "data", "dest": "/data", "options": ["rw"]}

    def refusals(source: str, options: list[str]) -> list[str]:
        config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec(),
                                       "namedVolumes": [volume | {"options": options}]}
        spec = podman_spec(mounts=[{"destination": "/data", "type": "bind", "source": source,
                                    "options": ["rbind"]}])
        path = tmp_path / "a.tar"
        path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
        archive = check_podman_archive(str(path))
        return import_refusals(archive, graph_root=graph) + volume_refusals(archive.config)

    assert refusals(f"{graph}/volumes/data/_data", ["rw"]) == []
    assert any(r.startswith("host bind mounts in spec.dump (/etc)") for r in refusals("/etc", ["rw"]))
    assert any("volume data with options beyond mount flags (volume-opt=device=/etc)" in r
               for r in refusals(f"{graph}/volumes/data/_data", ["volume-opt=device=/etc"]))


@pytest.mark.hostile("an archive whose config.dump names a volume spec.dump does not mount (podman would make the "
                     "container and the volume before the shim refused it), imported with and without --trust-config")
def test_a_volume_of_config_dump_alone_is_refused_before_podman_acts(tmp_path) -> None:
    graph = "/var/lib/containers/storage"
    directory = f"{graph}/volumes/data/_data"

    def archive_with(mounts: list[dict[str, object]]):
        config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": podman_spec(),
                                       "namedVolumes": [{"volumeName": "data", "dest": "/data/", "options": []}]}
        path = tmp_path / "a.tar"
        path.write_bytes(podman_tar(config=json.dumps(config).encode(),
                                    spec=json.dumps(podman_spec(mounts=mounts)).encode()))
        return check_podman_archive(str(path))

    def bind(destination: str, source: str) -> dict[str, object]:
        return {"destination": destination, "type": "bind", "source": source, "options": ["rbind"]}

    alone = archive_with([bind("/other", directory)])
    expected = f"volume data at /data, which spec.dump does not mount (a volume of config.dump alone; allowed: " \
               f"spec.dump binds {directory} there)"
    assert volume_refusals(alone.config, alone.spec, graph) == [expected]  # what --trust-config keeps
    assert expected in import_refusals(alone, graph_root=graph)
    elsewhere = archive_with([bind("/data", directory), bind("/data", "/var/tmp/x")])  # the last bind wins
    assert volume_refusals(elsewhere.config, elsewhere.spec, graph) == [
        f"volume data at /data, which spec.dump mounts from /var/tmp/x (allowed: the volume's directory on this "
        f"node, {directory})"]
    mounted = archive_with([bind("/data", directory)])
    assert volume_refusals(mounted.config, mounted.spec, graph) == []
    assert volume_refusals(alone.config) == []  # without a spec and a storage, the name and options only

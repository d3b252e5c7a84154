"""Benchmark of the GPU checkpoint engine on the GPU machine, baseline in the same run.

1. A container holding ~16 GB of GPU memory: checkpoint+restore by the plain
   sequence done by hand (driver lock+checkpoint, `runc checkpoint`; `runc
   restore`, driver restore+unlock) and through gpuckpt-runtime, per phase.
2. One CUDA process of ~4 GiB against four of ~4 GiB each, through the shim.
3. The same 16 GB checkpoint through the shim with transparent hugepages
   `always` (host memory policy; the node's setting is put back after).
Each restored workload must verify its device data. Writes OUT/engine.json.
Usage (root, repository root): python3 integration/gpu/bench_engine.py OUT_DIR [GIB]

`peer` mode: the shim against the peer users would pick instead, runc + CRIU with its CUDA
plugin (criu_peer.py), same run: one CUDA process (3 rounds, the order alternating, each round
two fresh containers) and four processes in one container (once each); checkpoint and restore
to /dev/shm, each restored workload verified. Writes OUT/engine-peer.json; exits non-zero, with
what it had and CRIU's log tails, when a step fails. Needs a pack made with GPUCKPT_CARRY_PEER=1.
Usage: python3 integration/gpu/bench_engine.py OUT_DIR peer [GIB [always|leave]]
(GIB of device data per process, default 2; the shim's cuda.host_hugepages, default always,
the shim's own default)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from criu_peer import (  # noqa: E402
    PeerContainer,
    assert_no_plugin,
    gpu_total_bytes,
    log_tails,
    plugin_phases,
    preflight,
)
from harness import (  # noqa: E402
    RUNTIME_ROOT,
    SITE,
    Bundle,
    assert_continues,
    image_bytes,
    install,
    log,
    manifest,
    wait_counters,
)

# gpuckpt is importable on the GPU machine only from harness.install()'s SITE, with its wheels
sys.path.insert(0, str(SITE))
from gpuckpt.cuda.discovery import find_cuda_pids  # noqa: E402
from gpuckpt.cuda.driver import load_driver  # noqa: E402
from gpuckpt.cuda.suspend import checkpointed_pids as driver_checkpointed  # noqa: E402
from gpuckpt.host.procfs import descendants  # noqa: E402

COUNTER = ["python3", "/work/gpu_counter.py"]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def cuda_pids_of(bundle: Bundle) -> list[int]:
    return find_cuda_pids(descendants(bundle.state()["pid"]))


def checkpointed_pids(driver, bundle: Bundle) -> list[int]:
    """After `runc restore` the processes hold no device file: ask the driver which are checkpointed."""
    return driver_checkpointed(driver, descendants(bundle.state()["pid"]))


def plain_sequence(gib: str, images: Path) -> dict:
    """By hand: the driver calls one process at a time, runc directly, no shim."""
    driver = load_driver()
    bundle = Bundle("plain", COUNTER, {"GIB": gib})
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=600)
        pids = cuda_pids_of(bundle)
        phases: dict[str, float] = {}
        started = time.monotonic()
        for pid in pids:
            driver.lock(pid, 10_000)
        phases["lock_s"] = time.monotonic() - started
        mark = time.monotonic()
        for pid in pids:
            driver.checkpoint(pid)
        phases["device_checkpoint_s"] = time.monotonic() - mark
        mark = time.monotonic()
        subprocess.run(["runc", "--root", RUNTIME_ROOT, "checkpoint", "--image-path", str(images), bundle.name],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        phases["dump_s"] = time.monotonic() - mark
        phases["checkpoint_total_s"] = time.monotonic() - started
        started = time.monotonic()
        with open(os.devnull, "r+b") as null:
            subprocess.run(["runc", "--root", RUNTIME_ROOT, "restore", "-d", "--bundle", str(bundle.dir),
                            "--image-path", str(images), bundle.name], check=True, cwd=bundle.dir,
                           stdin=null, stdout=null, stderr=null)
        phases["runc_restore_s"] = time.monotonic() - started
        mark = time.monotonic()
        driver.init()
        restored = checkpointed_pids(driver, bundle)
        for pid in restored:
            driver.restore(pid)
        phases["device_restore_s"] = time.monotonic() - mark
        mark = time.monotonic()
        for pid in restored:
            driver.unlock(pid)
        phases["unlock_s"] = time.monotonic() - mark
        phases["restore_total_s"] = time.monotonic() - started
        assert_continues(bundle, before)
        return phases
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def shim_sequence(gib: str, procs: int, images: Path) -> dict:
    bundle = Bundle(f"shim{procs}", COUNTER, {"GIB": gib, "PROCS": str(procs)})
    try:
        bundle.start()
        before = wait_counters(bundle, procs, 3, timeout_s=600)
        checkpoint_s, _ = bundle.checkpoint(images)
        timings = manifest(images)["timings"]
        restore_s = bundle.restore(images)
        restore_phases = [line for line in bundle.last_messages.splitlines() if "restored" in line]
        assert_continues(bundle, before)
        return {"checkpoint_total_s": checkpoint_s, "restore_total_s": restore_s, **timings,
                "restore_phases": restore_phases[-1][-300:] if restore_phases else ""}
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def rounded(values: dict) -> dict:
    return {key: round(value, 3) if isinstance(value, float) else value for key, value in values.items()}


PEER_ROUNDS = 3
PEER_BUDGET_S = 300  # the whole peer mode, install included, on an H100
PEER_IMAGES = {"peer": Path("/dev/shm/gpuckpt-bench-peer"), "shim": Path("/dev/shm/gpuckpt-bench-shim")}
PEER_GOALS = {"one_proc_checkpoint_over_peer": ("<=", 1.0), "one_proc_restore_over_peer": ("<=", 1.0),
              "four_proc_peer_over_shim_total": (">=", 1.3)}


def restore_phases(messages: str) -> dict[str, float]:
    """The shim's 'restored N CUDA process(es): check_s 0.041, delegate_restore_s 9.768, ...' line."""
    lines = [line for line in messages.splitlines() if "CUDA process(es):" in line]
    return {name: float(value) for name, value in re.findall(r"(\w+_s) ([\d.]+)", lines[-1])} if lines else {}


def shim_cycle(bundle: Bundle, procs: int, images: Path) -> dict:
    """Checkpoint and restore through the shim (it handles the GPU; CRIU loads no plugin)."""
    before = wait_counters(bundle, procs, 3, timeout_s=300)
    checkpoint_s, _ = bundle.checkpoint(images)
    info = manifest(images)
    plugin_checked = assert_no_plugin(images)
    dumped = image_bytes(images)
    restore_s = bundle.restore(images)
    assert_continues(bundle, before)
    shutil.rmtree(images, ignore_errors=True)
    phases = {f"checkpoint.{k}": v for k, v in info["timings"].items() if isinstance(v, float)}
    phases |= {f"restore.{k}": v for k, v in restore_phases(bundle.last_messages).items()}
    return {"checkpoint_s": round(checkpoint_s, 3), "restore_s": round(restore_s, 3), "phases": rounded(phases),
            "device_bytes": [p["checkpointed_bytes"] for p in info["processes"]], "image_bytes": dumped,
            "no_plugin_in_dump_log": plugin_checked}


def peer_cycle(peer: PeerContainer, procs: int, images: Path) -> dict:
    """Checkpoint and restore by runc alone, CRIU's CUDA plugin moving the GPU state."""
    before = wait_counters(peer.bundle, procs, 3, timeout_s=300)
    checkpoint_s = peer.checkpoint(images)
    dumped = image_bytes(images)
    restore_s = peer.restore(images)
    assert_continues(peer.bundle, before)
    phases = plugin_phases(images)
    shutil.rmtree(images, ignore_errors=True)
    return {"checkpoint_s": round(checkpoint_s, 3), "restore_s": round(restore_s, 3),
            "phases_from_criu_log": phases, "image_bytes": dumped}


def tmpfs_write_gbps(size: int = 2 << 30) -> float:
    """/dev/shm's write rate into fresh pages, as CRIU writes its images there (the dump's floor)."""
    path, block = Path("/dev/shm/gpuckpt-bench-floor"), b"\1" * (16 << 20)
    started = time.monotonic()
    with open(path, "wb") as sink:
        for _ in range(size // len(block)):
            sink.write(block)
    elapsed = time.monotonic() - started
    path.unlink()
    return round(size / elapsed / 1e9, 2)


def phase_medians(cycles: list[dict], key: str) -> dict[str, float]:
    names = sorted({name for cycle in cycles for name in cycle[key]})
    return {name: round(statistics.median(c[key][name] for c in cycles if name in c[key]), 3) for name in names}


class PeerBench:
    """The peer mode's run: its result (saved after every step), the containers still alive."""

    def __init__(self, out: Path, gib: str, result: dict) -> None:
        self.out, self.gib, self.result = out, gib, result
        self.started = time.monotonic()
        self.live: list[Bundle | PeerContainer] = []

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.started, 1)
        (self.out / "engine-peer.json").write_text(json.dumps(self.result, indent=2))

    def start(self, *containers: Bundle | PeerContainer) -> None:
        for container in containers:
            self.live.append(container)
            container.start()

    def retire(self, *containers: Bundle | PeerContainer) -> None:
        for container in containers:
            container.destroy()
            self.live.remove(container)

    def one_process(self) -> None:
        """Rounds of a fresh peer and a fresh shim container, started together, measured in turn."""
        rounds: list[dict] = []
        one: dict = {"rounds": rounds}
        self.result["one_proc"] = one
        for index in range(PEER_ROUNDS):
            peer = PeerContainer(f"peer1-{index}", COUNTER, {"GIB": self.gib})
            shim = Bundle(f"shim1-{index}", COUNTER, {"GIB": self.gib})
            self.start(peer, shim)
            order = ("peer", "shim") if index % 2 == 0 else ("shim", "peer")
            record: dict = {"order": list(order), "node_thp": THP.read_text().strip()}
            rounds.append(record)  # saved as it fills: a failure keeps the half round
            for column in order:
                record[column] = (peer_cycle(peer, 1, PEER_IMAGES["peer"]) if column == "peer"
                                  else shim_cycle(shim, 1, PEER_IMAGES["shim"]))
                log(f"one process, round {index + 1}, {column}: {record[column]}")
                self.save()
            self.retire(peer, shim)
        for verb in ("checkpoint", "restore"):
            for column in ("peer", "shim"):
                one[f"{column}_{verb}_s"] = [r[column][f"{verb}_s"] for r in rounds]
                one[f"{column}_{verb}_median_s"] = round(statistics.median(one[f"{column}_{verb}_s"]), 3)
            self.result[f"one_proc_{verb}_over_peer"] = round(
                one[f"shim_{verb}_median_s"] / one[f"peer_{verb}_median_s"], 3)
        self.result["floor"] |= {
            "one_proc_device_bytes": max(b for r in rounds for b in r["shim"]["device_bytes"]),
            "one_proc_shim_phases": phase_medians([r["shim"] for r in rounds], "phases"),
            "one_proc_peer_phases_from_criu_log": phase_medians([r["peer"] for r in rounds], "phases_from_criu_log"),
        }
        self.save()

    def four_processes(self) -> None:
        """One container of four CUDA processes per column, once each; both started at once where
        eight such processes fit the GPU with room to spare."""
        together = 8 * (self.result["floor"]["one_proc_device_bytes"] + (1 << 30)) < 0.9 * gpu_total_bytes()
        four: dict = {"started_together": together, "node_thp": THP.read_text().strip()}
        self.result["four_proc"] = four
        peer = PeerContainer("peer4", COUNTER, {"GIB": self.gib, "PROCS": "4"})
        shim = Bundle("shim4", COUNTER, {"GIB": self.gib, "PROCS": "4"})
        self.start(*((peer, shim) if together else (peer,)))
        four["peer"] = peer_cycle(peer, 4, PEER_IMAGES["peer"])
        log(f"four processes, peer: {four['peer']}")
        self.save()
        self.retire(peer)
        if not together:
            self.start(shim)
        four["shim"] = shim_cycle(shim, 4, PEER_IMAGES["shim"])
        log(f"four processes, shim: {four['shim']}")
        self.retire(shim)
        totals = {column: four[column]["checkpoint_s"] + four[column]["restore_s"] for column in ("peer", "shim")}
        four |= {f"{column}_total_s": round(total, 3) for column, total in totals.items()}
        self.result["four_proc_peer_over_shim_total"] = round(totals["peer"] / totals["shim"], 3)
        self.result["floor"] |= {"four_proc_shim_phases": four["shim"]["phases"],
                                 "four_proc_peer_phases_from_criu_log": four["peer"]["phases_from_criu_log"]}

    def keep_failure(self, error: Exception) -> None:
        """What it had, the error, CRIU's log tails (and the logs themselves, runc's too) into OUT."""
        self.result["error"] = f"{type(error).__name__}: {error}"[-4000:]
        self.result["criu_log_tails"] = {column: log_tails(images) for column, images in PEER_IMAGES.items()}
        for column, images in PEER_IMAGES.items():
            for criu_log in images.glob("*.log") if images.is_dir() else []:
                shutil.copy(criu_log, self.out / f"peer-mode-{column}-{criu_log.name}")
        for container in self.live:
            runtime_log = container.runc_log if isinstance(container, PeerContainer) else container.dir / "runtime.log"
            if runtime_log.exists():
                shutil.copy(runtime_log, self.out / f"peer-mode-{runtime_log.parent.name}-{runtime_log.name}")
        self.save()

    def clean(self) -> None:
        for container in list(self.live):
            self.retire(container)
        for images in PEER_IMAGES.values():
            shutil.rmtree(images, ignore_errors=True)


def peer_main(out: Path, gib: str, hugepages: str) -> int:
    harness.OUT = out  # the shim's failed steps copy CRIU's logs there
    bench = PeerBench(out, gib, {"mode": "peer", "gib": float(gib), "shim_host_hugepages": hugepages,
                                 "goals": {name: f"{op} {bound}" for name, (op, bound) in PEER_GOALS.items()},
                                 "budget_s": PEER_BUDGET_S})
    out.mkdir(parents=True, exist_ok=True)
    bench.clean()  # a warm machine may keep an earlier run's images
    facts = install()
    bench.result |= {"machine": facts["nvidia_smi"], "facts": facts,
                     "image_dirs": {column: str(images) for column, images in PEER_IMAGES.items()},
                     "containers": "each one-process round starts a fresh peer and a fresh shim container "
                                   "together: the other column's container idles, alive, while one is measured"}
    config = Path("/etc/gpuckpt/config.toml")
    plain_config = config.read_text()
    config.write_text(plain_config + f'[cuda]\nhost_hugepages = "{hugepages}"\n')
    try:
        bench.result["peer_facts"] = preflight(facts["criu"])
        bench.result["floor"] = {"tmpfs_write_gbps": tmpfs_write_gbps()}
        bench.save()
        log(f"--- peer mode: {json.dumps(bench.result['peer_facts'])}; "
            f"tmpfs {bench.result['floor']['tmpfs_write_gbps']} GB/s")
        bench.one_process()
        bench.four_processes()
        bench.result["goals_met"] = {name: bench.result[name] <= bound if op == "<=" else bench.result[name] >= bound
                                     for name, (op, bound) in PEER_GOALS.items()}
    except Exception as error:
        bench.keep_failure(error)
        log(f"peer mode FAILED: {bench.result['error'][-1500:]}")
        return 1
    finally:
        bench.clean()
        config.write_text(plain_config)
    bench.save()
    if bench.result["elapsed_s"] > PEER_BUDGET_S:
        log(f"peer mode took {bench.result['elapsed_s']} s, over its budget of {PEER_BUDGET_S} s")
    print(json.dumps({k: v for k, v in bench.result.items() if not isinstance(v, dict)}, indent=1))
    print(json.dumps(bench.result["goals_met"]))
    return 0


def main() -> int:
    out = Path(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "peer":
        hugepages = sys.argv[4] if len(sys.argv) > 4 else "always"
        if hugepages not in ("always", "leave"):
            raise SystemExit(f"bench_engine.py: cuda.host_hugepages {hugepages!r}: always or leave")
        return peer_main(out, sys.argv[3] if len(sys.argv) > 3 else "2", hugepages)
    gib = sys.argv[2] if len(sys.argv) > 2 else "16"
    facts = install()
    config = Path("/etc/gpuckpt/config.toml")
    plain_config = config.read_text()
    # The shim's own rows leave the node's THP setting alone, as the plain sequence does; the hugepages
    # row below sets it (the default since cuda.host_hugepages became "always")
    config.write_text(plain_config + '[cuda]\nhost_hugepages = "leave"\n')
    images = Path("/dev/shm/gpuckpt-bench")
    result: dict = {"machine": facts["nvidia_smi"], "facts": facts, "gib": float(gib), "image_dir": str(images)}

    def save() -> None:
        (out / "engine.json").write_text(json.dumps(result, indent=2))

    log(f"--- plain sequence, {gib} GiB")
    result["plain"] = rounded(plain_sequence(gib, images))
    save()
    log(f"plain: {result['plain']}")
    log(f"--- shim, {gib} GiB")
    result["shim"] = rounded(shim_sequence(gib, 1, images))
    save()
    log(f"shim: {result['shim']}")
    result["plain_checkpoint_s"] = result["plain"]["checkpoint_total_s"]
    result["shim_checkpoint_s"] = result["shim"]["checkpoint_total_s"]
    result["plain_restore_s"] = result["plain"]["restore_total_s"]
    result["shim_restore_s"] = result["shim"]["restore_total_s"]
    result["shim_overhead_checkpoint_pct"] = round(
        100 * (result["shim_checkpoint_s"] / result["plain_checkpoint_s"] - 1), 1
    )
    result["shim_overhead_restore_pct"] = round(100 * (result["shim_restore_s"] / result["plain_restore_s"] - 1), 1)
    save()
    log("--- one vs four processes of 4 GiB")
    one = rounded(shim_sequence("4", 1, images))
    four = rounded(shim_sequence("4", 4, images))
    result.update(one_proc=one, four_proc=four, one_proc_checkpoint_s=one["checkpoint_total_s"],
                  four_proc_checkpoint_s=four["checkpoint_total_s"],
                  four_over_one_device_checkpoint=round(four["device_checkpoint_s"] / one["device_checkpoint_s"], 2),
                  four_over_one_total=round(four["checkpoint_total_s"] / one["checkpoint_total_s"], 2))
    save()
    log(f"one: {one}; four: {four}")
    before_mode = THP.read_text().strip()
    try:
        config.write_text(plain_config + '[cuda]\nhost_hugepages = "always"\n')
        log(f"--- shim, {gib} GiB, cuda.host_hugepages = always (node: {before_mode})")
        result["shim_thp_always"] = rounded(shim_sequence(gib, 1, images))
    finally:
        config.write_text(plain_config)
    result["thp_setting_restored"] = THP.read_text().strip() == before_mode
    result["shim_thp_checkpoint_s"] = result["shim_thp_always"]["checkpoint_total_s"]
    result["shim_thp_restore_s"] = result["shim_thp_always"]["restore_total_s"]
    save()
    log(f"shim THP always: {result['shim_thp_always']}")
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

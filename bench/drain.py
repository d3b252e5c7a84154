"""Drain of 4 CPU containers of 1 GiB each through gpuckptd (issue #13): parallel vs serial in the
same run, then the restore of what each drained (the service started again with restore_at_start,
timed until READY, as parallel as the drain), and `gpuckpt drain --deadline 30` standing in for a
preemption notice with 30 s left.

The installed gpuckptd (`bash packaging/install.sh` first) runs as a plain process with a config of
this script's own (archive directory under /var/tmp, socket and inventory under /run, drain_on_stop
and restore_at_start off) and is started again for each case with its drain_parallel. Each case gets
4 fresh podman containers (gpuckpt-runtime, --network none, io.gpuckpt.inventory=true) holding
--mib of os.urandom bytes (touched, incompressible) and a counter; `gpuckpt drain --json` is timed,
each event stamped as it arrives. The inventory is a private one (GPUCKPT_STATE_DIR, given to
gpuckpt-hook through a hooks directory of this script's): a drain takes every recorded container,
and others' test containers on the same machine must not be drained with these.

Where the time goes, per container: the export's seconds (the service's figure: `gpuckpt export`,
i.e. podman's checkpoint through the shim, then podman's tar streamed through our checks, zstd and
sha256 into the archive, then the signature), the shim's own time (manifest timings: policy and
runc's CRIU dump) and CRIU's stats-dump (frozen, memdump, memwrite); per program, CPU seconds from
/proc sampled every 0.1 s during the drain; and, in the same run, what zstd (the archive writer's
compressor) and sha256 cost alone on --mib of random bytes.

Others' tests may share the machine: each drain waits (up to 3 min) for a quiet 2 s (under 15 % busy)
and records the CPU seconds that went to programs not its own (`cpu_s_others`); a run where those
weigh is not one to commit. About 4 to 5 minutes on the 2-core CI VM (4 x 1 GiB, 2 rounds).

Usage (root, on a set-up node): python3 bench/drain.py [--containers 4] [--mib 1024] [--deadline 30]
Writes results/bench/drain.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

from archive import WORKLOAD, machine, run  # the archive benchmark's workload, all of it random bytes

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "drain.json"
IMAGE = "localhost/gpuckpt-test:latest"
VENV_PYTHON = "/opt/gpuckpt/venv/bin/python3"
SAMPLE_S = 0.1
QUIET_SHARE = 0.15  # others' tests share this machine: a case starts once it is this idle (or waited long enough)
QUIET_WAIT_S = 180
# The archive writer's compressor and the signature's hash, alone, on random bytes in 1 MiB writes.
CALIBRATE = """
import hashlib, json, os, sys, time
from gpuckpt.oci.archive import zstd_compressor
data = memoryview(os.urandom(int(sys.argv[1]) << 20))
class Sink:
    def write(self, chunk):
        return len(chunk)
def timed(write, close):
    started = time.monotonic()
    for at in range(0, len(data), 1 << 20):
        write(data[at:at + (1 << 20)])
    close()
    return round(time.monotonic() - started, 2)
figures = {}
for threads in (0, 1):
    writer = zstd_compressor(threads).stream_writer(Sink())
    figures[f"zstd_threads_{threads or os.cpu_count()}_s"] = timed(writer.write, writer.close)
digest = hashlib.sha256()
figures["sha256_s"] = timed(digest.update, digest.hexdigest)
print(json.dumps(figures))
"""


def hooks_dir(private: Path) -> Path:
    """gpuckpt-hook's two stages, as `gpuckpt install` writes them, recording into the private inventory."""
    directory = private / "hooks.d"
    directory.mkdir(mode=0o700)
    for stage in ("createRuntime", "poststop"):
        hook = {"path": shutil.which("gpuckpt-hook") or "/usr/local/bin/gpuckpt-hook", "args": ["gpuckpt-hook", stage],
                "env": [f"GPUCKPT_STATE_DIR={private / 'state'}"], "timeout": 10}
        (directory / f"gpuckpt-{stage}.json").write_text(json.dumps(
            {"version": "1.0.0", "hook": hook, "when": {"always": True}, "stages": [stage]}))
    return directory


class Service:
    """The installed gpuckptd with this script's config; READY read from its notify socket."""

    def __init__(self, private: Path, archive_dir: Path) -> None:
        self.private, self.archive_dir = private, archive_dir
        self.config = private / "config.toml"
        self.env = dict(os.environ, GPUCKPT_CONFIG=str(self.config), GPUCKPT_STATE_DIR=str(private / "state"),
                        NOTIFY_SOCKET=str(private / "notify"))
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(private / "notify"))
        self.notify.settimeout(120)
        self.process: subprocess.Popen | None = None

    def start(self, parallel: int, restore_at_start: bool = False) -> float:
        """Started with `parallel`; the seconds until READY (a restore at start comes before it)."""
        self.config.write_text(f'[service]\narchive_dir = "{self.archive_dir}"\nsocket = "{self.private / "sock"}"\n'
                               f"drain_parallel = {parallel}\ndrain_on_stop = false\n"
                               f"restore_at_start = {str(restore_at_start).lower()}\n")
        self.config.chmod(0o644)
        daemon = shutil.which("gpuckptd") or "/usr/local/bin/gpuckptd"
        # The restore imports through podman, whose runtime claims the pages the import staged under the
        # node's state directory: the private one (the drain's inventory) must not reach that import.
        env = {key: value for key, value in self.env.items() if key != "GPUCKPT_STATE_DIR"} \
            if restore_at_start else self.env
        started = time.monotonic()
        self.process = subprocess.Popen([daemon], env=env, stderr=open(self.private / "gpuckptd.log", "ab"))
        while "READY=1" not in self.notify.recv(4096).decode():
            pass
        return time.monotonic() - started

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)


class CpuSampler:
    """CPU seconds per program while a drain runs: /proc/PID/stat of every process, every SAMPLE_S
    (a process's last < SAMPLE_S before it exits is not seen), and the whole machine's from /proc/stat."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.seen: dict[tuple[int, int], list] = {}  # (pid, start time) -> [program, first, last, comm]
        self.started = False  # the first sample is the drain's start
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def program(pid: int, comm: str) -> str:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return f"other: {comm}"
        names = [os.path.basename(arg.decode(errors="replace")) for arg in argv]
        if not argv[0]:
            return "kernel threads"
        if pid == os.getpid():
            return "this bench (its /proc sampler)"
        if len(argv) > 2 and argv[2].startswith(WORKLOAD.encode()[:40]):
            # CRIU's parasite runs inside the process it dumps: its page splicing shows here
            return "the dumped processes (CRIU's parasite)"
        if any(name == "criu" or name.startswith("criu:") for name in names):
            return "criu"  # the test bed's runs through its libc's loader; CRIU sets its title "criu: dump ..."
        if "gpuckpt" in names[:3]:
            return "gpuckpt export (tar checks, zstd, sha256)" if b"export" in argv else "gpuckpt CLI"
        for name in ("gpuckpt-runtime", "gpuckptd", "gpuckpt-hook"):
            if name in names[:3]:
                return name + (" (shim)" if name == "gpuckpt-runtime" else "")
        if names[0] in ("podman", "conmon", "runc"):  # podman re-executed as /proc/self/exe included
            return names[0]
        return f"other: {comm}"

    def _sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / self.tick
            key = (int(entry.name), int(fields[19]))
            if key in self.seen:
                self.seen[key][2] = cpu_s
                if self.seen[key][3] != comm:  # it exec'd since (runc's child becoming criu): named again
                    self.seen[key][0], self.seen[key][3] = self.program(key[0], comm), comm
            else:
                first = 0.0 if self.started else cpu_s  # one from before the drain counts from now
                self.seen[key] = [self.program(key[0], comm), first, cpu_s, comm]
        self.started = True

    @staticmethod
    def machine_ticks() -> dict[str, int]:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
        return {"busy": user + nice + system + irq + softirq, "iowait": iowait, "idle": idle, "steal": steal}

    def _loop(self) -> None:
        while not self.stop_event.wait(SAMPLE_S):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self.ticks = self.machine_ticks()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_event.set()
        self.thread.join()
        self._sample()
        ended = self.machine_ticks()
        self.machine_s = {key: round((ended[key] - self.ticks[key]) / self.tick, 2) for key in ended}
        by_program: dict[str, float] = {}
        for program, first, last, _ in self.seen.values():
            by_program[program] = by_program.get(program, 0.0) + last - first
        for program, seconds in list(by_program.items()):
            if program.startswith("other: ") and seconds < 0.1:  # named only where it weighs
                by_program["other: the rest"] = by_program.get("other: the rest", 0.0) + by_program.pop(program)
        self.by_program = {name: round(seconds, 2) for name, seconds in
                           sorted(by_program.items(), key=lambda item: -item[1]) if seconds >= 0.01}


def wait_for_quiet() -> float:
    """The machine's busy share over 2 s, once under QUIET_SHARE or after QUIET_WAIT_S."""
    given_up = time.monotonic() + QUIET_WAIT_S
    while True:
        before = CpuSampler.machine_ticks()["busy"]
        time.sleep(2)
        share = (CpuSampler.machine_ticks()["busy"] - before) / os.sysconf("SC_CLK_TCK") / (2 * (os.cpu_count() or 1))
        if share < QUIET_SHARE or time.monotonic() > given_up:
            return round(share, 2)


def start_containers(names: list[str], hooks: Path, mib: int) -> None:
    for name in names:
        run("podman", "--hooks-dir", str(hooks), "run", "-d", "--name", name, "--runtime", "gpuckpt-runtime",
            "--network", "none", "--annotation", "io.gpuckpt.inventory=true", "-e", f"MIB={mib}", "-e", "RANDOM=1",
            "-e", "ZERO=0", IMAGE, "python3", "-c", WORKLOAD)
    deadline = time.monotonic() + 600
    for name in names:  # the counter runs once the memory is filled
        while subprocess.run(["podman", "exec", name, "cat", "/tmp/state"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: the workload did not start within 600 s")
            time.sleep(0.5)


def archive_phases(path: str) -> dict[str, float]:
    """The shim's timings (its manifest) and CRIU's dump statistics (stats-dump), read from the archive."""
    def member(name: str) -> bytes:
        return subprocess.run(["tar", "--zstd", "--occurrence=1", "-xOf", path, name], capture_output=True,
                              check=True).stdout
    timings = json.loads(member("checkpoint/gpuckpt-manifest.json"))["timings"]
    stats = json.loads(subprocess.run(["crit", "decode"], input=member("stats-dump"), capture_output=True,
                                      check=True).stdout)["entries"][0]["dump"]
    return {"shim_total_s": round(timings["total_s"], 2), "criu_frozen_s": round(stats["frozen_time"] / 1e6, 2),
            "criu_memdump_s": round(stats["memdump_time"] / 1e6, 2),
            "criu_memwrite_s": round(stats["memwrite_time"] / 1e6, 2), "criu_pages_written": stats["pages_written"]}


def drain(service: Service, deadline_s: float | None) -> dict:
    """`gpuckpt drain --json`, its events stamped as they come; per-container figures and CPU by program."""
    argv = [shutil.which("gpuckpt") or "/usr/local/bin/gpuckpt", "drain", "--json"]
    if deadline_s is not None:
        argv += ["--deadline", f"{deadline_s:g}"]
    run("sync")  # no dirty pages of the case before
    busy_before = wait_for_quiet()
    with CpuSampler() as cpu:
        started = time.monotonic()
        client = subprocess.Popen(argv, env=service.env, stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None
        stamped = [(time.monotonic() - started, json.loads(line)) for line in client.stdout]
        client.wait()
        wall_s = time.monotonic() - started
    containers: dict[str, dict] = {}
    for at, event in stamped:
        if event["event"] != "container":
            continue
        figures = containers.setdefault(event["id"], {"id": event["id"][:12]})
        figures["state"] = event["state"]
        if event["state"] == "started":
            figures["started_at_s"] = round(at, 2)
        elif event["state"] == "done":
            figures.update(finished_at_s=round(at, 2), export_s=event["seconds"], bytes=event["bytes"],
                           **archive_phases(event["message"]))
            figures["after_dump_s"] = round(figures["export_s"] - figures["shim_total_s"], 2)
        else:
            figures["message"] = event["message"]
    result = stamped[-1][1] if stamped and stamped[-1][1]["event"] == "result" else {"message": "no result"}
    return {"wall_s": round(wall_s, 2), "message": result["message"], "containers": list(containers.values()),
            "cpu_s_by_program": cpu.by_program, "machine_cpu_s": cpu.machine_s,
            "machine_busy_share": round(cpu.machine_s["busy"] / ((os.cpu_count() or 1) * wall_s), 2),
            "machine_busy_share_before": busy_before,
            "cpu_s_others": round(sum(s for name, s in cpu.by_program.items() if name.startswith("other: ")), 2)}


def restore(service: Service, parallel: int) -> dict:
    """The service started again with restore_at_start: its seconds until READY, the restore before it."""
    service.stop()
    run("sync")
    wait_for_quiet()
    ready_s = service.start(parallel, restore_at_start=True)
    log = (service.private / "gpuckptd.log").read_text(errors="replace")
    results = [line for line in log.splitlines() if "restore: " in line and " done, " in line]
    failures = [line for line in log.splitlines() if "restore failed" in line]
    return {"restore_wall_s": round(ready_s, 2), "restore_message": results[-1] if results else "no result",
            "restore_failures": failures}


def one_case(label: str, parallel: int, deadline_s: float | None, service: Service, hooks: Path,
             names: list[str], mib: int) -> dict:
    """Fresh containers, the service started with `parallel`, one drain (and, without a deadline, the
    restore of what it drained, with the same parallelism); everything removed after."""
    try:
        start_containers(names, hooks, mib)
        service.start(parallel)
        figures = drain(service, deadline_s)
        if deadline_s is None:
            figures.update(restore(service, parallel))
    finally:
        service.stop()
        subprocess.run(["podman", "rm", "-f", "-t", "0", *names], capture_output=True)
        for path in service.archive_dir.iterdir():
            path.unlink()
        # podman runs no poststop hook for a container it restored: its record would be the next case's
        shutil.rmtree(service.private / "state" / "containers", ignore_errors=True)
    figures.update(case=label, drain_parallel=parallel, deadline_s=deadline_s)
    if deadline_s is not None:
        done = [c for c in figures["containers"] if c["state"] == "done"]
        figures.update(checkpointed=len(done), skipped=sum(c["state"] == "skipped" for c in figures["containers"]),
                       failed=sum(c["state"] == "failed" for c in figures["containers"]),
                       finished_within_deadline=sum(c["finished_at_s"] <= deadline_s for c in done))
    restored = f"; restore {figures['restore_wall_s']:.1f} s ({figures['restore_message']})" \
        if "restore_wall_s" in figures else ""
    print(f"{label}: {figures['message']}; wall {figures['wall_s']:.1f} s{restored}", flush=True)
    return figures


def per_container(cases: list[dict], label: str) -> dict[str, float]:
    """Medians over the done containers of every drain of that case."""
    done = [c for case in cases if case["case"] == label for c in case["containers"] if c["state"] == "done"]
    keys = ("export_s", "shim_total_s", "criu_frozen_s", "criu_memdump_s", "criu_memwrite_s", "after_dump_s")
    return {key: round(statistics.median(c[key] for c in done), 2) for key in keys}


def calibrate(mib: int) -> dict[str, float]:
    return json.loads(run(VENV_PYTHON, "-c", CALIBRATE, str(mib)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=4)
    parser.add_argument("--mib", type=int, default=1024, help="memory each container holds (default 1024)")
    parser.add_argument("--parallel", type=int, default=4, help="drain_parallel of the parallel case (default 4)")
    parser.add_argument("--deadline", type=float, default=30.0, help="the preemption case's deadline (default 30)")
    parser.add_argument("--rounds", type=int, default=2, help="parallel and serial drains, alternated (default 2)")
    parser.add_argument("--out", default=str(RESULTS))
    options = parser.parse_args()
    private = Path(f"/run/gpuckpt-bench-drain-{os.getpid()}")
    work = Path(f"/var/tmp/gpuckpt-bench-drain-{os.getpid()}")
    private.mkdir(mode=0o700)
    work.mkdir(mode=0o700)
    archive_dir = work / "archive"
    archive_dir.mkdir(mode=0o700)
    numbers = itertools.count()
    plan = [("parallel", options.parallel, None), ("serial", 1, None)] * options.rounds + [
        (f"deadline, drain_parallel {parallel}", parallel, options.deadline) for parallel in (options.parallel, 1)]
    began = time.monotonic()
    try:
        hooks = hooks_dir(private)
        service = Service(private, archive_dir)
        wait_for_quiet()
        alone = calibrate(options.mib)
        cases = [one_case(label, parallel, deadline_s, service, hooks,
                          [f"gpuckpt-bench-drain-{os.getpid()}-{next(numbers)}" for _ in range(options.containers)],
                          options.mib) for label, parallel, deadline_s in plan]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    parallel_s = round(statistics.median(case["wall_s"] for case in cases if case["case"] == "parallel"), 2)
    serial_s = round(statistics.median(case["wall_s"] for case in cases if case["case"] == "serial"), 2)
    restore_parallel_s = round(statistics.median(c["restore_wall_s"] for c in cases if c["case"] == "parallel"), 2)
    restore_serial_s = round(statistics.median(c["restore_wall_s"] for c in cases if c["case"] == "serial"), 2)
    result = {"machine": machine(), "podman": run("podman", "--version").strip(), "containers": options.containers,
              "container_mib": options.mib, "content": "os.urandom (incompressible)", "rounds": options.rounds,
              "parallel_wall_s": parallel_s, "serial_wall_s": serial_s,
              "parallel_over_serial": round(parallel_s / serial_s, 2),
              "restore_parallel_wall_s": restore_parallel_s, "restore_serial_wall_s": restore_serial_s,
              "deadline": [{key: case[key] for key in ("drain_parallel", "deadline_s", "checkpointed", "skipped",
                                                       "failed", "finished_within_deadline", "wall_s")}
                           for case in cases if case["deadline_s"] is not None],
              "per_container_parallel": per_container(cases, "parallel"),
              "per_container_serial": per_container(cases, "serial"),
              "alone_per_container": alone, "bench_s": round(time.monotonic() - began), "cases": cases}
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(result, indent=2) + "\n")
    report(result)


def report(result: dict) -> None:
    print(f"\n{'case':32}{'wall s':>8}{'done':>6}{'skip':>6}{'<=dl':>6}  per container export s (shim s)")
    for case in result["cases"]:
        done = [c for c in case["containers"] if c["state"] == "done"]
        within = case.get("finished_within_deadline", "")
        per = " ".join(f"{c['export_s']:.1f}({c['shim_total_s']:.1f})" for c in done)
        print(f"{case['case']:32}{case['wall_s']:>8.1f}{len(done):>6}{len(case['containers']) - len(done):>6}"
              f"{within!s:>6}  {per}")
    print(f"parallel / serial: {result['parallel_wall_s']:.1f} s / {result['serial_wall_s']:.1f} s = "
          f"{result['parallel_over_serial']:.2f}")
    print(f"restore of what they drained, parallel / serial: {result['restore_parallel_wall_s']:.1f} s / "
          f"{result['restore_serial_wall_s']:.1f} s")
    print(f"per container, median (s):\n{'':10}" + "".join(f"{key:>16}" for key in result["per_container_serial"]))
    for label in ("parallel", "serial"):
        print(f"{label:10}" + "".join(f"{value:>16.2f}" for value in result[f"per_container_{label}"].values()))
    print(f"alone, {result['container_mib']} MiB of random bytes: {result['alone_per_container']}")
    for case in result["cases"]:
        print(f"CPU s, {case['case']}: machine {case['machine_cpu_s']} ({case['machine_busy_share']:.0%} busy, "
              f"{case['cpu_s_others']} s of it not the drain's); "
              f"{case['cpu_s_by_program']}")


if __name__ == "__main__":
    main()

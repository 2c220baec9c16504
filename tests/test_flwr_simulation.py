"""``fl-sim run`` on Flower's supported path, ``flwr run`` with the simulation runtime
(:mod:`fl_sim.apps.flwr_simulation`): which scenarios run there and which keep
``run_simulation``, a tiny federation end to end with its audit, a failed run and Ctrl-C, each
checked to leave no SuperLink (nor any process it started) behind."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fl_sim import cli, rundir
from fl_sim.apps.flwr_simulation import FlwrRunError, FlwrSimulation
from fl_sim.apps.runtime import RuntimeChoiceError, choose_runtime, legacy_reasons
from fl_sim.apps.superlink import (
    RUN_FOLDER_PREFIX,
    stale_runs,
    stop_superlink,
    superlink_pids,
)
from fl_sim.config import parse_scenario
from fl_sim.proctree import descendants, stop_trees
from fl_sim.run import RunStoppedError, run_scenario
from tests.processes import TWO_CLIENTS, ctrl_c_reachable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TINY = 'name = "tiny"\n' + TWO_CLIENTS
# Flower's set-up and INFO lines, which go to run.log, never to the terminal.
FLOWER_LINES = ("Starting logstream", "INFO", "Successfully started run", "SuperLink", "\x1b[")


def _raw(**tables: Any) -> dict[str, Any]:
    raw = tomllib.loads(TINY)
    raw["clients"]["count"] = 3  # SecAgg+'s default shares need three
    raw.update(copy.deepcopy(tables))
    return raw


def _processes_naming(path: Path) -> list[str]:
    """The live processes whose command line or environment names ``path``: the private
    FLWR_HOME of a run lies under it, and every process Flower and its Ray start inherits
    the environment that names it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (str(path) in args or f"={path}" in environ):
            found.append(f"{entry.name}: {args.replace(chr(0), ' ')[:200]}")
    return found


def _env(tmp: Path) -> dict[str, str]:
    """fl-sim's environment with its temporary folders (the private FLWR_HOME, Ray's session)
    under ``tmp``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: Ray puts its session's sockets under $TMPDIR, and
    a socket's path must fit in 107 bytes (pytest's tmp_path does not)."""
    path = Path(tempfile.mkdtemp(prefix="fls-", dir="/tmp"))
    yield path
    _stop_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


def _stop_leftovers(path: Path) -> None:
    """Stop, by pid, what a failed test may have left of the processes naming ``path``."""
    stop_trees([int(line.split(":")[0]) for line in _processes_naming(path)])


def test_flwr_runs_what_it_can_and_legacy_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    plain = parse_scenario(_raw())
    assert legacy_reasons(plain) == []
    assert choose_runtime(plain) == "flwr" and choose_runtime(plain, "legacy") == "legacy"
    secagg = parse_scenario(_raw(federation={"secagg": {}}))
    assert choose_runtime(secagg) == "legacy" and choose_runtime(secagg, "legacy") == "legacy"
    with pytest.raises(
        RuntimeChoiceError,
        match=r"--runtime flwr cannot run scenario 'tiny': \[federation.secagg\] \(SecAgg\+\) "
        r"needs client mods .*Allowed for it: --runtime legacy \(or auto",
    ):
        choose_runtime(secagg, "flwr")
    central_dp = parse_scenario(_raw(federation={"central_dp": {"noise_multiplier": 1.0}}))
    assert choose_runtime(central_dp) == "legacy"
    with pytest.raises(RuntimeChoiceError, match=r"\[federation.central_dp\] needs client mods"):
        choose_runtime(central_dp, "flwr")
    cluster = parse_scenario(_raw(cluster={"address": "10.0.0.1:6379"}))
    assert choose_runtime(cluster) == "legacy"
    with pytest.raises(RuntimeChoiceError, match=r"a Ray cluster \(10.0.0.1:6379"):
        choose_runtime(cluster, "flwr")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert legacy_reasons(plain) == [
        "a Ray cluster (10.0.0.2:6379, [cluster] address or $RAY_ADDRESS): Flower's "
        "federation config takes no Ray address, and fl-sim has not tried flwr run on one"
    ]
    half = parse_scenario(_raw(resources={"client_cpus": 0.5}))
    with pytest.raises(RuntimeChoiceError, match="whole CPUs per client"):
        choose_runtime(half, "flwr")
    with pytest.raises(RuntimeChoiceError, match="allowed are auto, flwr, legacy"):
        choose_runtime(plain, "ray")


def test_forcing_flwr_on_a_secagg_scenario_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tmp_path / "secagg.toml"
    config.write_text(TINY.replace("count = 2", "count = 3") + "[federation.secagg]\n")
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"fl-sim run: --runtime flwr cannot run scenario"):
        cli.main(["-q", "run", str(config), "--out", str(out), "--runtime", "flwr"])
    assert not out.exists()
    with pytest.raises(SystemExit):  # argparse names the choices
        cli.main(["run", str(config), "--runtime", "ray"])


@pytest.mark.slow
def test_a_failed_run_is_detected_and_its_superlink_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ServerApp fails at its start (its scenario cannot be read): ``flwr run`` exits 0,
    the launcher reads the run's status and raises; nothing it started is left."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the private FLWR_HOME goes there
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def broken(run_dir: Path, *_: Any) -> None:
        rundir.write_json(run_dir / rundir.SCENARIO, {"resolved": {"rounds": "many"}})

    monkeypatch.setattr("fl_sim.run.write_scenario", broken)
    raw = tomllib.loads(TINY)
    try:
        with pytest.raises(RunStoppedError) as stopped:
            run_scenario(parse_scenario(raw), raw, tmp_path / "run", show_progress=False)
        assert not _processes_naming(tmp)
    finally:
        _stop_leftovers(tmp)
    assert stopped.value.exit_code == 1
    assert "ended finished:failed" in str(stopped.value), stopped.value
    log = (tmp_path / "run" / rundir.RUN_LOG).read_text()
    assert "Successfully started run" in log and "rounds" in log  # the ServerApp's error


@pytest.mark.slow
def test_fl_sim_run_on_flwr_run_end_to_end(tmp_path: Path, short_tmp: Path) -> None:
    """The quickstart's path with two clients and two rounds: the audit, the report and the
    terminal as under run_simulation; Flower's lines in run.log only; no SuperLink left."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    run_dir = tmp_path / "run"
    tmp = short_tmp
    done = subprocess.run(
        [sys.executable, "-m", "fl_sim.cli", "run", str(config), "--out", str(run_dir)],
        env=_env(tmp),
        cwd=tmp_path,  # not the project's root: the app flwr run ships is fl-sim's package
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-3000:]
    assert not _processes_naming(tmp)
    assert "on flwr run (simulation runtime)" in done.stderr
    assert not [x for x in FLOWER_LINES if x in shown], shown
    assert "round 2/2  test acc" in done.stderr and "audit 4/4 attacks done" in done.stderr
    assert "Leakage audit" in done.stdout and f"run directory: {run_dir}" in done.stdout
    records = rundir.read_jsonl(run_dir / rundir.AUDIT)
    assert sorted((r["round"], r["client"]) for r in records) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    # The first round's fresh model: both FedSGD batches recovered exactly.
    assert [r["status"] for r in records if r["round"] == 1] == ["exact", "exact"], records
    assert all((run_dir / r["grid"]).is_file() for r in records)
    assert [r["round"] for r in rundir.read_jsonl(run_dir / rundir.ROUNDS)] == [0, 1, 2]
    assert rundir.read_json(run_dir / rundir.SCENARIO)["runtime"] == "flwr"
    assert "data:image/png" in (run_dir / rundir.REPORT).read_text()
    for name in (rundir.MODEL, rundir.ACCURACY_PLOT, rundir.CLIENTS, rundir.DATA):
        assert (run_dir / name).is_file(), name
    log = (run_dir / rundir.RUN_LOG).read_text()
    assert "Successfully started run" in log and "Starting logstream" in log
    assert "\x1b[" not in log


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_its_superlink(tmp_path: Path, short_tmp: Path) -> None:
    """Ctrl-C after round 1: the ServerApp stops at its next wait, the command prints the
    summary, builds the report and exits 130; nothing Flower started is left."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.replace("rounds = 2", "rounds = 20"))
    run_dir = tmp_path / "run"
    tmp = short_tmp
    with ctrl_c_reachable():
        proc = subprocess.Popen(
            [sys.executable, "-m", "fl_sim.cli", "run", str(config), "--out", str(run_dir)],
            env=_env(tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # as on a terminal: SIGINT to fl-sim's own process group
        )
    try:
        deadline = time.monotonic() + 600
        while rundir.last_round(run_dir) < 1 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        # What the check below looks for is there while the run goes: the SuperLink, its
        # SuperExec, the simulation and its Ray.
        running = _processes_naming(tmp)
        assert len(running) >= 3, running
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "fl-sim run: interrupted (Ctrl-C) after round" in err
    last = rundir.last_round(run_dir)
    assert 1 <= last < 20 and "Leakage audit" in out
    assert f"Rounds: {last} of 20 (the run stopped early)" in (run_dir / "report.html").read_text()
    assert not _processes_naming(tmp)
    assert "asked the ServerApp to stop" in (run_dir / rundir.RUN_LOG).read_text()
    records = rundir.read_jsonl(run_dir / rundir.AUDIT)
    assert {r["round"] for r in records} <= set(range(1, last + 2))


# A stand-in for a SuperLink: named flower-superlink with its FLWR_HOME in its command line, a
# child leading a session of its own (as flower-superexec does) and, in that session, an
# orphan whose parent exited (as Ray's workers outlive their raylet).
# The orphan's parent: starts it and exits at once.
_ORPHANS_PARENT = (
    "import subprocess, sys; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])"
)
_LEADER = (
    "import os, subprocess, sys, time\n"
    f"subprocess.Popen([sys.executable, '-c', {_ORPHANS_PARENT!r}])\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:  # ends with its parent, as flower-superexec does\n"
    "    time.sleep(0.1)\n"
)
_FAKE_SUPERLINK = (
    "import subprocess, sys, time\n"
    f"subprocess.Popen([sys.executable, '-c', {_LEADER!r}], start_new_session=True)\n"
    "time.sleep(120)\n"
)


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_stop_superlink_stops_its_own_tree_and_sessions_and_nothing_else(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-c", _FAKE_SUPERLINK, "flower-superlink", "--log-file"),
                str(home / "local-superlink" / "superlink.log"),
            ]
        )
        for home in (mine, other)
    ]
    try:
        assert superlink_pids(mine) == [procs[0].pid]
        # Wait for the session leader's orphan: the leader and it share the leader's session.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            leaders = [p for p in descendants(procs[0].pid) if _session(p) == p]
            members = [
                int(e.name)
                for e in Path("/proc").iterdir()
                if e.name.isdigit() and leaders and _session(int(e.name)) == leaders[0]
            ]
            orphans = [p for p in members if _alive(p) and p not in descendants(procs[0].pid)]
            if orphans:
                break
            time.sleep(0.2)
        assert orphans, "the stand-in's orphan never appeared"
        stopped = stop_superlink(mine)
        assert procs[0].pid in stopped and set(orphans) <= set(stopped) and leaders[0] in stopped
        procs[0].wait(timeout=30)
        assert not [p for p in stopped if _alive(p)]
        assert procs[1].poll() is None and _alive(procs[1].pid)  # another's: left alone
    finally:
        for home in (mine, other):
            stop_superlink(home)
        for proc in procs:
            proc.wait(timeout=30)


class _Exited:
    """A finished ``flwr run`` process, as far as the launcher's check reads it."""

    def __init__(self, returncode: int) -> None:
        self.returncode = returncode


def test_the_check_after_flwr_run_trusts_neither_its_exit_status_nor_the_run_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flwr run`` exits 0 for a failed run: the run's status decides, then the global
    model the ServerApp saves last."""
    launcher = FlwrSimulation(parse_scenario(_raw()), tmp_path, None)
    env: dict[str, str] = {}
    with pytest.raises(FlwrRunError, match="exited with status 0 without starting the run"):
        launcher._check(_Exited(0), env)  # type: ignore[arg-type]
    launcher.run_id = 7
    with pytest.raises(FlwrRunError, match="exited with status 1 without finishing the run"):
        launcher._check(_Exited(1), env)  # type: ignore[arg-type]
    status = ("finished:failed", "Simulation failed with exception: boom")
    monkeypatch.setattr(FlwrSimulation, "_status", lambda self, env: status)
    with pytest.raises(FlwrRunError, match=r"run 7 ended finished:failed \(Simulation failed"):
        launcher._check(_Exited(0), env)  # type: ignore[arg-type]
    status = ("finished:completed", "N/A")
    with pytest.raises(FlwrRunError, match="ServerApp ended without the global model"):
        launcher._check(_Exited(0), env)  # type: ignore[arg-type]
    (tmp_path / rundir.MODEL).write_bytes(b"")
    launcher._check(_Exited(0), env)  # type: ignore[arg-type]


def test_the_watchdog_stops_the_superlink_once_fl_sim_is_killed(tmp_path: Path) -> None:
    """``kill -9`` of ``fl-sim run`` leaves its SuperLink (a session of its own) running but for
    the watchdog, which stops it and what it started, then leaves."""
    home = tmp_path / "home"
    log_file = str(home / "local-superlink" / "superlink.log")
    superlink = subprocess.Popen(
        [sys.executable, "-c", _FAKE_SUPERLINK, "flower-superlink", "--log-file", log_file]
    )
    fl_sim_run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "fl_sim.apps.superlink", str(fl_sim_run.pid), str(home)],
        start_new_session=True,
    )
    try:
        time.sleep(2)
        assert superlink.poll() is None and watchdog.poll() is None  # fl-sim lives: left alone
        fl_sim_run.kill()
        fl_sim_run.wait()
        superlink.wait(timeout=30)
        assert watchdog.wait(timeout=30) == 0 and not superlink_pids(home)
    finally:
        stop_superlink(home)
        for proc in (fl_sim_run, superlink, watchdog):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def test_processes_an_earlier_run_left_are_named_at_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run folder whose processes no watchdog looks after is stale (an older fl-sim's, or
    one whose watchdog was killed too); a live run's, with its watchdog, is not."""
    stale = tmp_path / f"{RUN_FOLDER_PREFIX}old"
    live = tmp_path / f"{RUN_FOLDER_PREFIX}live"
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    procs = [
        subprocess.Popen([*sleep, "flower-superlink", "--database", str(stale / "home" / "db")]),
        subprocess.Popen([*sleep, "run", str(stale / "app"), "fl-sim"]),
        subprocess.Popen([*sleep, "flower-superlink", "--database", str(live / "home" / "db")]),
    ]
    procs.append(
        subprocess.Popen([*sleep, "fl_sim.apps.superlink", str(os.getpid()), str(live / "home")])
    )
    try:
        time.sleep(1)
        found = stale_runs()
        assert found[str(stale)] == sorted(p.pid for p in procs[:2])
        assert str(live) not in found
        launcher = FlwrSimulation(parse_scenario(_raw()), tmp_path / "run", None)
        monkeypatch.setattr(tempfile, "TemporaryDirectory", _no_run_folder)
        with caplog.at_level(logging.WARNING), pytest.raises(_StopHereError):
            launcher.run()
        warned = [r.getMessage() for r in caplog.records if str(stale) in r.getMessage()]
        assert warned and f"kill {procs[0].pid} {procs[1].pid}` stops them" in warned[0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


class _StopHereError(Exception):
    """The launcher stopped where the run would begin."""


def _no_run_folder(*args: object, **kwargs: object) -> None:
    raise _StopHereError

"""The cold→warm benchmark: hubspoke's spoke beside nginx's slice cache, in one run.

    python -m loadtest.bench [--quick] [--out reports/bench] [--profile]

Starts on 127.0.0.1, over a generated dataset (a big file for random ranges, "stream"
shards for sequential reads, "dataset" shards of 16 KiB samples for the replay):

* a hub (the "data is local" baseline, read directly);
* Toxiproxy with 60 ms of latency: one proxy in front of the hub per cache under test
  (they never share a link), and one more with nothing behind it but the hub, to show
  what the link alone carries;
* a hubspoke spoke behind its proxy (``--capacity`` = 2 × the data);
* nginx (Debian's, :mod:`loadtest.nginx`) with ``slice 4m`` + ``proxy_cache`` behind its
  proxy, also serving the same files straight from disk as ``/file/`` (the ceiling of the
  load generator on this machine).

Then it measures, with one load generator per kind of test for every side:

1. warm random ranged reads with ``wrk`` (``loadtest/wrk/random_range.lua``): 4 MiB ×
   16 connections and 64 KiB × 64 connections, rounds interleaved across servers so
   that background load hits every side alike; medians are reported;
2. cold reads through 60 ms with empty caches (each cache restarted empty before each
   test): whole-shard sequential streaming by a few concurrent readers, and every 4 MiB
   range of the big file once, in random order, by 16 concurrent readers (an asyncio
   client: a cold test must read each chunk once, which wrk cannot);
3. the training replay (:mod:`loadtest.replay`) against the hub, then a cold spoke;
4. batched multi-range reads (``loadtest/wrk/multi_range.lua``): 32 × 64 KiB samples per
   request against one request per sample.

It prints the Markdown report and writes ``report.md``, ``report.json`` and
``warmup.png`` to ``--out``. Every process it starts is stopped by PID and its temp
directories are removed, also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from loadtest.bench_figures import evaluate
from loadtest.bench_report import render
from loadtest.bench_settings import FULL, QUICK, MiB, Settings
from loadtest.dataset import SAMPLE_BYTES, Shard, generate
from loadtest.lab import Lab
from loadtest.meter import CpuMeter, process_tree, rss_bytes
from loadtest.nginx import Nginx, nginx_binary, nginx_version, start_nginx
from loadtest.procs import Process
from loadtest.replay import (
    Epoch,
    ReplayResult,
    ReplaySummary,
    Second,
    concat,
    plot,
    replay,
    summarize,
)
from protocol.headers import CACHE_HEADER
from spoke.config import AFFINITIES

WRK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrk")


# --------------------------------------------------------------------------- wrk


@dataclass
class WrkRun:
    target: str
    test: str
    conns: int
    seconds: float
    requests: int
    bytes: int
    errors: int
    req_s: float
    bytes_s: float
    samples_s: float  # requests/s × ranges per request
    p50_ms: float
    p99_ms: float
    bytes_per_request: float
    wrk_cores: float
    server_cores: float
    background_cores: float  # machine CPU not used by this benchmark's processes

    @property
    def gb_s(self) -> float:
        return self.bytes_s / 1e9


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def wrk_version() -> str:
    binary = wrk_binary()
    if binary is None:
        return "missing"
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    return (out.stdout + out.stderr).splitlines()[0].split(" Copyright")[0].strip()


def run_wrk(target: str, test: str, url: str, script: str, script_args: list[str], conns: int,
            seconds: float, ranges_per_request: int, server_pid: int | None,
            threads: int = 2) -> WrkRun:
    """One wrk run; the process is waited for with wait4 so its CPU time is known."""
    binary = wrk_binary()
    if binary is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    threads = max(1, min(threads, conns))
    cmd = [binary, "-t", str(threads), "-c", str(conns), "-d", f"{max(1, round(seconds))}s",
           "--timeout", "30s", "-s", os.path.join(WRK_DIR, script), url, "--",
           *script_args]
    with tempfile.TemporaryFile() as out, CpuMeter(server_pid) as meter:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + seconds + 45
        rusage = None
        while rusage is None:
            pid, _status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rusage = usage
                proc.returncode = 0
                break
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
                _pid, _status, rusage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                break
            time.sleep(0.05)
        out.seek(0)
        text = out.read().decode(errors="replace")
    line = next((ln for ln in text.splitlines() if ln.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary for {url}:\n{text[-2000:]}")
    data: dict[str, Any] = json.loads(line.removeprefix("WRK_JSON "))
    wrk_cpu = rusage.ru_utime + rusage.ru_stime
    duration = data["duration_us"] / 1e6
    errors = sum(int(data[k]) for k in data if k.startswith("errors_"))
    requests = int(data["requests"])
    background = max(0.0, meter.machine - meter.ours - wrk_cpu)
    return WrkRun(
        target=target, test=test, conns=conns, seconds=duration, requests=requests,
        bytes=int(data["bytes"]), errors=errors, req_s=requests / duration,
        bytes_s=int(data["bytes"]) / duration,
        samples_s=requests * ranges_per_request / duration,
        p50_ms=data["latency_p50_us"] / 1000, p99_ms=data["latency_p99_us"] / 1000,
        bytes_per_request=int(data["bytes"]) / requests if requests else 0.0,
        wrk_cores=wrk_cpu / duration, server_cores=meter.cores(meter.server),
        background_cores=background / meter.seconds if meter.seconds else 0.0,
    )


def median_run(runs: list[WrkRun]) -> dict[str, Any]:
    """Per-metric medians of several rounds of the same (target, test)."""
    first = runs[0]
    out: dict[str, Any] = {"target": first.target, "test": first.test, "conns": first.conns,
                           "rounds": len(runs)}
    for key in ("req_s", "bytes_s", "samples_s", "p50_ms", "p99_ms", "bytes_per_request",
                "wrk_cores", "server_cores", "background_cores"):
        out[key] = statistics.median(getattr(r, key) for r in runs)
    out["gb_s"] = out["bytes_s"] / 1e9
    out["errors"] = sum(r.errors for r in runs)
    out["requests"] = sum(r.requests for r in runs)
    out["all_req_s"] = [round(r.req_s, 1) for r in runs]
    return out


# --------------------------------------------------------------------------- asyncio client


@dataclass
class ClientRun:
    target: str
    test: str
    objects: int
    bytes: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    hub_egress: int | None = None
    server_cores: float = 0.0
    client_cores: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def gb_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


async def _read_all(session: aiohttp.ClientSession, url: str,
                    headers: dict[str, str]) -> tuple[int, int]:
    async with session.get(url, headers=headers) as resp:
        n = 0
        async for block in resp.content.iter_any():
            n += len(block)
        return resp.status, n


async def fetch_many(base: str, jobs: list[tuple[str, int, int | None]], concurrency: int,
                     timeout_s: float) -> tuple[int, float, int, list[float]]:
    """GET ``base/path`` for each (path, offset, length or None = whole object), once each.

    ``concurrency`` requests are in flight at a time.

    Returns (bytes, seconds, errors, latencies). A job whose answer has the wrong
    status or length is an error (its bytes still count as transferred).
    """
    queue = iter(jobs)
    latencies: list[float] = []
    totals = {"bytes": 0, "errors": 0}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency + 1)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                     auto_decompress=False) as session:

        async def worker() -> None:
            for path, offset, length in queue:
                headers = {}
                if length is not None:
                    headers["Range"] = f"bytes={offset}-{offset + length - 1}"
                t0 = time.perf_counter()
                try:
                    status, n = await _read_all(session, f"{base}/{path}", headers)
                    want = 206 if length is not None else 200
                    ok = status == want and (length is None or n == length)
                except (aiohttp.ClientError, TimeoutError):
                    n, ok = 0, False
                latencies.append(time.perf_counter() - t0)
                totals["bytes"] += n
                totals["errors"] += not ok

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))),
                               timeout=timeout_s)
        seconds = time.perf_counter() - started
    return totals["bytes"], seconds, totals["errors"], latencies


def client_run(target: str, test: str, base: str, jobs: list[tuple[str, int, int | None]],
               concurrency: int, server_pid: int | None, hub_url: str,
               timeout_s: float) -> ClientRun:
    egress0 = hub_bytes_sent(hub_url)
    with CpuMeter(server_pid) as meter:
        nbytes, seconds, errors, lat = asyncio.run(
            fetch_many(base, jobs, concurrency, timeout_s))
    egress1 = hub_bytes_sent(hub_url)
    return ClientRun(
        target=target, test=test, objects=len(jobs), bytes=nbytes, seconds=seconds,
        errors=errors, p50_ms=_pct(lat, 0.5), p99_ms=_pct(lat, 0.99),
        hub_egress=(egress1 - egress0) if egress0 is not None and egress1 is not None else None,
        server_cores=meter.cores(meter.server), client_cores=meter.cores(meter.self_cpu),
    )


def hub_bytes_sent(hub_url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{hub_url}/metrics", timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("hub_bytes_sent_total"):
                    return int(float(line.split()[1]))
    except OSError:
        return None
    return None


def probe(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """One request: status, Content-Type, Content-Length and X-Cache (the body is not read)."""
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            h = reply.headers
            return {"status": reply.status, "content_type": h.get("Content-Type", ""),
                    "content_length": int(h.get("Content-Length") or -1),
                    "x_cache": h.get(CACHE_HEADER)}
    except urllib.error.HTTPError as err:
        return {"status": err.code, "content_type": err.headers.get("Content-Type", ""),
                "content_length": int(err.headers.get("Content-Length") or -1),
                "x_cache": err.headers.get(CACHE_HEADER)}
    except OSError as err:
        return {"status": None, "error": str(err)}


# --------------------------------------------------------------------------- the servers


@dataclass
class Bench:
    """Everything running: hub, links, spoke, nginx; restarts caches empty."""

    settings: Settings
    work: str
    lab: Lab
    hub: Process
    spoke_upstream: str
    nginx: Nginx
    bare_link: str  # the hub through 60 ms, no cache
    spoke: Process | None = None
    spoke_dirs: int = 0

    def start_spoke(self) -> Process:
        self.spoke_dirs += 1
        cache_dir = os.path.join(self.work, f"spoke-cache-{self.spoke_dirs}")
        os.makedirs(cache_dir)
        self.spoke = self.lab.spoke(
            self.spoke_upstream, cache_dir,
            "--capacity", str(2 * self.settings.data_bytes), *self.settings.spoke_flags,
        )
        return self.spoke

    def stop_spoke(self) -> None:
        if self.spoke is not None:
            self.lab.stop(self.spoke)
            self.spoke = None
            shutil.rmtree(os.path.join(self.work, f"spoke-cache-{self.spoke_dirs}"),
                          ignore_errors=True)

    def restart_empty(self) -> None:
        """Both caches start again with nothing cached."""
        self.stop_spoke()
        self.start_spoke()
        self.nginx.restart_empty()

    @property
    def spoke_url(self) -> str:
        assert self.spoke is not None
        return self.spoke.url

    def spoke_stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.spoke_url}/stats", timeout=10) as reply:
            stats: dict[str, Any] = json.loads(reply.read())
            return stats


@contextlib.contextmanager
def bench_servers(settings: Settings, root: str, work: str) -> Iterator[Bench]:
    """The hub, a 60 ms link per side (they never share one), nginx and a spoke."""
    log_dir = os.path.join(work, "logs")
    os.makedirs(log_dir, exist_ok=True)
    with Lab(log_dir=log_dir) as lab:
        hub = lab.hub(root, "--access-log", "off", "--log-level", "warning")
        links = {name: lab.link(hub.url, latency_ms=settings.latency_ms, name=name)
                 for name in ("bench-spoke", "bench-nginx", "bench-bare")}
        nginx_up = (links["bench-nginx"].host, links["bench-nginx"].port)
        nginx = lab.enter(start_nginx(nginx_up, file_root=root,
                                      cache_max_bytes=2 * settings.data_bytes))
        bench = Bench(settings, work, lab, hub, links["bench-spoke"].url, nginx,
                      links["bench-bare"].url)
        lab.callback(bench.stop_spoke)
        bench.start_spoke()
        yield bench


# --------------------------------------------------------------------------- the tests


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def warm_tests(lb: Bench, s: Settings, file_path: str) -> dict[str, Any]:
    """Sections 1 and 4: interleaved rounds of wrk over warm caches."""
    size = str(s.file_bytes)
    targets: list[tuple[str, Callable[[], str], Callable[[], int | None]]] = [
        ("hub direct", lambda: f"{lb.hub.url}/objects/{file_path}", lambda: lb.hub.pid),
        ("spoke", lambda: f"{lb.spoke_url}/objects/{file_path}",
         lambda: lb.spoke.pid if lb.spoke else None),
        ("nginx cache", lambda: f"{lb.nginx.url}/objects/{file_path}", lambda: lb.nginx.pid),
        ("nginx file", lambda: f"{lb.nginx.url}/file/{file_path}", lambda: lb.nginx.pid),
    ]
    tests = [
        # ALIGN = the range size: fixed-size records, as loaders read (the round is the seed).
        ("4MiB", "random_range.lua", [size, str(s.big_range), str(s.big_range)], s.big_conns, 1,
         targets),
        ("64KiB", "random_range.lua", [size, str(s.small_range), str(s.small_range)],
         s.small_conns, 1, targets),
        (f"batch{s.batch}x64KiB", "multi_range.lua",
         [size, str(s.small_range), str(s.batch)], s.batch_conns, s.batch, targets[:3]),
    ]
    runs: dict[tuple[str, str], list[WrkRun]] = {}
    for rnd in range(s.rounds):
        order = list(range(len(targets)))
        random.Random(rnd).shuffle(order)  # no side always runs right after another
        for test, script, args, conns, per_req, tgts in tests:
            for i in order:
                if i >= len(tgts):
                    continue
                name, url, pid = tgts[i]
                run = run_wrk(name, test, url(), script, [*args, str(rnd + 1)], conns,
                              s.wrk_seconds, per_req, pid(), s.wrk_threads)
                log(f"round {rnd + 1} {test:>14} {name:<11} {run.req_s:9.1f} req/s "
                    f"{run.gb_s:6.2f} GB/s p99 {run.p99_ms:7.1f} ms "
                    f"(server {run.server_cores:.2f} cores, wrk {run.wrk_cores:.2f}, "
                    f"other {run.background_cores:.2f})")
                runs.setdefault((test, name), []).append(run)
    out: dict[str, Any] = {}
    for (test, name), rs in runs.items():
        out.setdefault(test, {})[name] = median_run(rs)
        out[test][name]["runs"] = [asdict(r) for r in rs]
    return out


def multi_range_answers(lb: Bench, s: Settings, file_path: str) -> dict[str, Any]:
    ranges = ",".join(f"{i * s.small_range}-{(i + 1) * s.small_range - 1}"
                      for i in range(0, 2 * s.batch, 2))
    headers = {"Range": f"bytes={ranges}"}
    out = {}
    for name, url in (("hub direct", f"{lb.hub.url}/objects/{file_path}"),
                      ("spoke", f"{lb.spoke_url}/objects/{file_path}"),
                      ("nginx cache", f"{lb.nginx.url}/objects/{file_path}")):
        out[name] = probe(url, headers)
    return out


def cold_tests(lb: Bench, s: Settings, stream: list[Shard], file_path: str) -> dict[str, Any]:
    """Section 2: through 60 ms, with both caches restarted empty before each test.

    ``s.cold_rounds`` rounds, the order of the sides alternating between rounds; each
    cell reports the median over its rounds (with two rounds, the mean).
    """
    out: dict[str, Any] = {"stream": {}, "random": {}}
    stream_jobs: list[tuple[str, int, int | None]] = [(sh.path, 0, None) for sh in stream]
    chunks = s.file_bytes // s.big_range
    random_jobs: list[tuple[str, int, int | None]] = [
        (file_path, i * s.big_range, s.big_range) for i in range(chunks)]
    random.Random(7).shuffle(random_jobs)
    timeout = 300.0 if s.mode == "full" else 60.0
    sides: list[tuple[str, Callable[[], str], Callable[[], int | None]]] = [
        ("spoke", lambda: f"{lb.spoke_url}/objects",
         lambda: lb.spoke.pid if lb.spoke else None),
        ("nginx cache", lambda: f"{lb.nginx.url}/objects", lambda: lb.nginx.pid),
        ("hub through the link (no cache)", lambda: f"{lb.bare_link}/objects",
         lambda: lb.hub.pid),
        ("nginx file (no link, client ceiling)", lambda: f"{lb.nginx.url}/file",
         lambda: lb.nginx.pid),
    ]
    runs: dict[tuple[str, str], list[ClientRun]] = {}
    for rnd in range(s.cold_rounds):
        for test, jobs, conc in (("stream", stream_jobs, s.stream_readers),
                                 ("random", random_jobs, s.cold_random_conns)):
            lb.restart_empty()
            order = sides if rnd % 2 == 0 else [sides[1], sides[0], *sides[2:]]
            for name, base, pid in order:
                run = client_run(name, test, base(), jobs, conc, pid(), lb.hub.url, timeout)
                if name == "spoke":
                    stats = lb.spoke_stats()
                    run.notes.append(
                        f"{test}: hub_fetches {stats.get('hub_fetches')}, singleflight_joins "
                        f"{stats.get('singleflight_joins')}, prefetched "
                        f"{stats.get('prefetched_chunks')}, hub_fetch_p50_s "
                        f"{stats.get('hub_fetch_p50_s')}")
                log(f"cold {test:>6} round {rnd + 1} {name:<38} {run.gb_s:6.3f} GB/s "
                    f"({run.bytes / MiB:,.0f} MiB in {run.seconds:.2f} s, errors {run.errors}, "
                    f"hub egress {(run.hub_egress or 0) / MiB:,.0f} MiB, server "
                    f"{run.server_cores:.2f} cores)")
                runs.setdefault((test, name), []).append(run)
    for (test, name), rs in runs.items():
        med = statistics.median
        out[test][name] = {
            "target": name, "test": test, "rounds": len(rs), "objects": rs[0].objects,
            "bytes": rs[0].bytes, "gb_s": med(r.gb_s for r in rs),
            "seconds": med(r.seconds for r in rs),
            "p50_ms": med(r.p50_ms for r in rs), "p99_ms": med(r.p99_ms for r in rs),
            "errors": sum(r.errors for r in rs),
            "hub_egress": (None if any(r.hub_egress is None for r in rs)
                           else min(r.hub_egress or 0 for r in rs)),
            "server_cores": med(r.server_cores for r in rs),
            "client_cores": med(r.client_cores for r in rs),
            "all_gb_s": [round(r.gb_s, 4) for r in rs],
            "notes": [n for r in rs for n in r.notes],
            "runs": [asdict(r) | {"gb_s": r.gb_s} for r in rs],
        }
    return out


def warm_up(lb: Bench, s: Settings, file_path: str) -> dict[str, Any]:
    """Read the whole big file through both caches, then check a few answers are hits."""
    jobs: list[tuple[str, int, int | None]] = [
        (file_path, i * s.big_range, s.big_range) for i in range(s.file_bytes // s.big_range)]
    out: dict[str, Any] = {}
    for name, base in (("spoke", lb.spoke_url), ("nginx cache", lb.nginx.url)):
        nbytes, seconds, errors, _ = asyncio.run(fetch_many(f"{base}/objects", jobs, 4, 300))
        rng = random.Random(3)
        hits = 0
        checks = 20
        for _ in range(checks):
            off = rng.randrange(s.file_bytes // s.small_range) * s.small_range
            ans = probe(f"{base}/objects/{file_path}",
                        {"Range": f"bytes={off}-{off + s.small_range - 1}"})
            hits += ans.get("x_cache") == "HIT"
        out[name] = {"bytes": nbytes, "seconds": seconds, "errors": errors,
                     "hit_checks": f"{hits}/{checks}"}
        log(f"warm-up {name}: {nbytes / MiB:,.0f} MiB in {seconds:.1f} s; "
            f"X-Cache HIT on {hits}/{checks} random reads")
    return out


def replay_tests(lb: Bench, s: Settings, shards: list[Shard]) -> dict[str, Any]:
    """Section 3: the training replay, hub direct then a cold spoke through 60 ms."""
    deadline = 120.0 if s.mode == "full" else 20.0
    lb.stop_spoke()
    spoke = lb.start_spoke()
    local_parts: list[ReplayResult] = []
    spoke_parts: list[ReplayResult] = []
    # Epochs alternate between the two servers (L1 S1 L2 S2 ...), so that a change in
    # background load over the minute does not land on one side only.
    with CpuMeter(lb.hub.pid) as local_meter, CpuMeter(spoke.pid) as meter:
        for epoch in range(1, s.replay_epochs + 1):
            local_parts.append(asyncio.run(replay(
                lb.hub.url, shards, workers=s.replay_workers, epochs=1, first_epoch=epoch,
                label="hub direct (data local)", deadline_s=deadline)))
            spoke_parts.append(asyncio.run(replay(
                spoke.url, shards, workers=s.replay_workers, epochs=1, first_epoch=epoch,
                label="spoke, cold through 60 ms", stats_url=spoke.url,
                deadline_s=deadline)))
            log(f"replay epoch {epoch}: local {local_parts[-1].samples_per_s:,.0f}, spoke "
                f"{spoke_parts[-1].samples_per_s:,.0f} samples/s")
    local, cold = concat(local_parts), concat(spoke_parts)
    log(f"replay: client {local_meter.cores(local_meter.self_cpu):.2f} cores, hub "
        f"{local_meter.cores(local_meter.server):.2f}, spoke {meter.cores(meter.server):.2f}, "
        f"other {_background(meter):.2f}")
    stats = lb.spoke_stats()
    rss = rss_bytes(process_tree(spoke.pid))
    dataset_bytes = sum(sh.size for sh in shards)
    summary = summarize(local, cold, dataset_bytes)
    return {"local": local, "spoke": cold, "summary": summary,
            "client_cores": meter.cores(meter.self_cpu),
            "server_cores": {"hub": local_meter.cores(local_meter.server),
                             "spoke": meter.cores(meter.server)},
            "background_cores": _background(meter),
            "spoke_stats": stats, "spoke_rss_bytes": rss}


def _background(meter: CpuMeter) -> float:
    """Cores used on the machine by processes outside this benchmark during ``meter``."""
    return meter.cores(max(0.0, meter.machine - meter.ours))


# --------------------------------------------------------------------------- profile


def profile_spoke(lb: Bench, s: Settings, file_path: str, out_dir: str) -> dict[str, Any] | None:
    """py-spy the spoke during a warm 64 KiB run (after the measured ones), if installed."""
    pyspy = shutil.which("py-spy") or (
        os.path.join(os.path.dirname(sys.executable), "py-spy")
        if os.path.exists(os.path.join(os.path.dirname(sys.executable), "py-spy")) else None)
    if pyspy is None or lb.spoke is None:
        log("py-spy not found; no profile")
        return None
    raw = os.path.join(out_dir, "spoke-64k.folded")
    seconds = max(2, int(s.wrk_seconds))
    spy = subprocess.Popen([pyspy, "record", "--pid", str(lb.spoke.pid), "--duration",
                            str(seconds + 1), "--rate", "200", "--format", "raw", "--nonblocking",
                            "--output", raw], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        run_wrk("spoke", "profile", f"{lb.spoke_url}/objects/{file_path}", "random_range.lua",
                [str(s.file_bytes), str(s.small_range), str(s.small_range), "99"], s.small_conns,
                seconds, 1, None,
                s.wrk_threads)
        spy.wait(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()
    if not os.path.exists(raw):
        return None
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    with open(raw) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            samples += n
            # "func (path:line)" -> "func (path)": own time per function, not per line.
            frames = [re.sub(r":\d+\)$", ")", fr) for fr in stack.split(";") if fr]
            if frames[0].startswith("process ") or frames[0].startswith("thread "):
                frames = frames[1:]
            if not frames:
                continue
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for fr in set(frames):
                total[fr] = total.get(fr, 0) + n
    top = sorted(own.items(), key=lambda kv: -kv[1])[:20]
    return {"samples": samples, "file": os.path.basename(raw), "top": [
        {"frame": fr, "self_pct": 100 * n / max(1, samples),
         "total_pct": 100 * total.get(fr, 0) / max(1, samples)} for fr, n in top]}


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and durations (a smoke test, well under a minute)")
    parser.add_argument("--out", default="reports/bench", help="report directory")
    parser.add_argument("--data-dir", help="keep the generated dataset here (default: a "
                        "temp dir, removed at the end)")
    parser.add_argument("--seconds", type=float, help="wrk seconds per cell")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per wrk cell")
    parser.add_argument("--spoke-workers",
                        help="the spoke's --workers (default: its own, auto)")
    parser.add_argument("--spoke-cpu-affinity", choices=AFFINITIES,
                        help="the spoke's --cpu-affinity (default: its own, off)")
    parser.add_argument("--spoke-flags", default="",
                        help="more of the spoke's flags, as one shell-quoted string "
                             "(default: none; the bench measures the spoke's defaults)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the spoke with py-spy (if installed)")
    parser.add_argument("--from-json", metavar="REPORT_JSON",
                        help="start nothing: re-render report.md in --out from a report.json")
    return parser.parse_args(argv)


def _replay_from_json(data: dict[str, Any]) -> ReplayResult:
    def fields(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in raw.items() if k in names}

    result = ReplayResult(**fields(ReplayResult, data))
    result.epochs = [Epoch(**fields(Epoch, e)) for e in data["epochs"]]
    result.series = [Second(**fields(Second, sec)) for sec in data["series"]]
    return result


def settings_of(saved: dict[str, Any]) -> dict[str, Any]:
    """A report.json's settings as :class:`Settings` takes them: the spoke's flags as a
    tuple, and those of reports from before ``spoke_flags`` (when the bench tuned the
    spoke with ``--access-log off --meta-ttl 3600`` and its workers) as such flags."""
    saved = dict(saved)
    if "spoke_workers" in saved:
        saved["spoke_flags"] = [
            "--access-log", "off", "--log-level", "warning",
            "--workers", saved.pop("spoke_workers"),
            "--cpu-affinity", saved.pop("spoke_cpu_affinity", "off"), "--meta-ttl", "3600"]
    saved["spoke_flags"] = tuple(saved.get("spoke_flags", ()))
    return saved


def rerender(path: str, out: str) -> str:
    """report.md again from a report.json (after a change to the template)."""
    with open(path) as f:
        data = json.load(f)
    s = Settings(**settings_of(data["settings"]))
    r = data["replay"]
    rep = {"local": _replay_from_json(r["local"]), "spoke": _replay_from_json(r["spoke"]),
           "summary": ReplaySummary(**r["summary"]), "client_cores": r["client_cores"],
           "server_cores": r["server_cores"], "background_cores": r["background_cores"],
           "spoke_stats": r["spoke_stats"], "spoke_rss_bytes": r["spoke_rss_bytes"]}
    targets = evaluate(data["warm"], data["cold"], rep, s)
    text = render(data["meta"], data["warm"], data["multi_range_answers"], data["cold"], rep,
                  targets, data["warm_up"], s, data.get("profile"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def _loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _toxiproxy_kind() -> str:
    if os.environ.get("TOXIPROXY_URL"):
        return f"external ({os.environ['TOXIPROXY_URL']})"
    return "toxiproxy-server" if shutil.which("toxiproxy-server") else "the project's stand-in"


def spoke_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The spoke's flags beyond hub, cache directory, capacity and port (none: its defaults)."""
    flags = []
    if args.spoke_workers is not None:
        flags += ["--workers", args.spoke_workers]
    if args.spoke_cpu_affinity is not None:
        flags += ["--cpu-affinity", args.spoke_cpu_affinity]
    return (*flags, *shlex.split(args.spoke_flags))


def _raise_on_term(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.from_json:
        print(rerender(args.from_json, args.out))
        return 0
    s = QUICK if args.quick else FULL
    s = Settings(**{**asdict(s), "wrk_seconds": args.seconds or s.wrk_seconds,
                    "rounds": args.rounds or s.rounds, "spoke_flags": spoke_flags(args)})
    missing = [tool for tool, found in (("nginx", nginx_binary()), ("wrk", wrk_binary()))
               if found is None]
    if missing:
        print(f"missing on PATH: {', '.join(missing)} (apt-get install -y nginx wrk)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_on_term)
    started = time.perf_counter()
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count(),
        "python": platform.python_version(),
        "nginx": f"nginx {nginx_version(nginx_binary() or 'nginx')}",
        "wrk": wrk_version(), "toxiproxy": _toxiproxy_kind(), "loadavg_before": _loadavg(),
        "mode": s.mode,
    }
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="hubspoke-bench-")
    root = args.data_dir or os.path.join(work, "data")
    try:
        log(f"generating {s.data_bytes / MiB:,.0f} MiB of data in {root}")
        big = generate(root, 1, s.file_bytes, prefix="bench")[0]
        stream = generate(root, s.stream_shards, s.stream_shard_bytes, prefix="stream", seed=5)
        shards = generate(root, s.replay_shards, s.replay_shard_bytes, prefix="dataset", seed=9)
        with bench_servers(s, root, work) as lb:
            log(f"hub {lb.hub.url}, spoke {lb.spoke_url} via {lb.spoke_upstream}, nginx "
                f"{lb.nginx.url} (pid {lb.nginx.pid}), bare link {lb.bare_link}")
            cold = cold_tests(lb, s, stream, big.path)
            warmed = warm_up(lb, s, big.path)
            warm = warm_tests(lb, s, big.path)
            answers = multi_range_answers(lb, s, big.path)
            prof = profile_spoke(lb, s, big.path, args.out) if args.profile else None
            spoke_rss = rss_bytes(process_tree(lb.spoke.pid)) if lb.spoke else 0
            spoke_stats_warm = lb.spoke_stats()
            rep = replay_tests(lb, s, shards)
            plot(rep["local"], rep["spoke"], rep["summary"], os.path.join(args.out, "warmup.png"),
                 title=f"Training replay ({s.mode}): {s.replay_workers} workers, "
                       f"{SAMPLE_BYTES // 1024} KiB samples, cold spoke through "
                       f"{s.latency_ms} ms vs hub direct")
        meta["loadavg_after"] = _loadavg()
        meta["seconds"] = time.perf_counter() - started
        targets = evaluate(warm, cold, rep, s)
        text = render(meta, warm, answers, cold, rep, targets, warmed, s, prof)
        report = {
            "meta": meta, "settings": asdict(s),
            "targets": [asdict(t) | {"verdict": t.verdict} for t in targets],
            "warm": warm, "multi_range_answers": answers, "cold": cold, "warm_up": warmed,
            "replay": {"local": rep["local"].to_json(), "spoke": rep["spoke"].to_json(),
                       "summary": asdict(rep["summary"]), "client_cores": rep["client_cores"],
                       "server_cores": rep["server_cores"],
                       "background_cores": rep["background_cores"],
                       "spoke_stats": rep["spoke_stats"],
                       "spoke_rss_bytes": rep["spoke_rss_bytes"]},
            "spoke_after_warm_tests": {"rss_bytes": spoke_rss, "stats": spoke_stats_warm},
            "profile": prof,
        }
        with open(os.path.join(args.out, "report.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(text)
        log(f"wrote {args.out}/report.md, report.json, warmup.png in {meta['seconds']:.0f} s")
        return 0
    except BaseException:
        # Keep the servers' logs for the post-mortem; the rest of the temp dir goes.
        with contextlib.suppress(OSError):
            shutil.copytree(os.path.join(work, "logs"), os.path.join(args.out, "logs"),
                            dirs_exist_ok=True)
            log(f"failed; server logs copied to {args.out}/logs")
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""The supervisor: starts the process tree, restarts what dies, drains and stops on a signal.

Children start in dependency order (broker, mock model, scheduler, actors, gateway), each a
separate OS process in its own session, forked from a fork server that has their modules
imported already (agentos/forkserver.py), and stop in reverse order: SIGTERM, a grace period,
then SIGKILL to its process group. On SIGTERM or SIGINT the gateway drains first (no new turns,
in-flight turns get `kernel.drain_secs`); a second signal skips the wait. The signal handlers
only set an event. The live process table is written to the run directory for `agent-os status`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from agentos import cpu_layout, metrics, module_command, service, strays
from agentos.child import process_name
from agentos.config import Config
from agentos.forkserver import ForkedProcess, ForkServer
from agentos.restart_policy import RestartPolicy, is_crash_loop, next_failure_count, restart_delay
from agentos.rundir import RunDir
from broker import spill
from broker.address import bus_address
from broker.client import Bus
from broker.protocol import SUPERVISOR, Kind
from broker.sharding import log_writer

STOP_GRACE_SECS = 5.0
READY_TIMEOUT_SECS = 20.0
MONITOR_IDLE_SECS = 1.0     # a backstop: exits are noticed at once through pidfds
MONITOR_BUSY_SECS = 0.05
log = logging.getLogger("agent-os.supervisor")


@dataclass
class Child:
    role: str
    index: int = 0
    name: str = ""
    proc: subprocess.Popen | ForkedProcess | None = None
    started_at: float = 0.0
    started_wall: float = 0.0
    restarts: int = 0
    failures: int = 0
    restart_at: float = 0.0
    restart_times: list[float] = field(default_factory=list)
    in_crash_loop: bool = False
    exit_fd: int = -1           # a pidfd: readable once the process has exited

    def __post_init__(self) -> None:
        self.name = self.name or process_name(self.role, self.index)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class StartupError(RuntimeError):
    pass


class Supervisor:
    def __init__(self, config: Config, run_dir: RunDir, policy: RestartPolicy | None = None,
                 standby: bool = False) -> None:
        self.config = config
        self.run_dir = run_dir
        self.policy = policy or RestartPolicy()
        self.children = self.plan()
        self.stop_event = asyncio.Event()
        self.signals = 0
        self.stopping = False
        self.bus: Bus | None = None
        self.env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(run_dir.metrics_dir))
        self.standby = standby
        self.lease_keeper = None
        self.exit_code = service.EXIT_OK
        self.started_at = time.time()
        self.forks = ForkServer(self.env, log, enabled=config.kernel.fork_server)
        if config.storage.s3.bucket and config.kernel.fork_server:
            from storage import s3
            s3.warm(config.storage.s3)   # boto3's models then shared with the children forked
        self.forks.fork_first(os.getpid())   # before the event loop: see ForkServer.fork_first
        self.exited = asyncio.Event()   # a child's pidfd turned readable: the monitor looks now
        self.cpu_claim: int | None = None   # the descriptor whose lock holds the gateway's CPU

    def plan(self) -> list[Child]:
        children = [Child("broker")]
        if not self.config.provider.base_url:
            children.append(Child("mock-llm"))
        children += [Child("writer-log", i) for i in range(self.config.storage.log_writers)]
        children.append(Child("writer-store"))
        children.append(Child("scheduler"))
        children += [Child("actor", i) for i in range(self.config.actor_count)]
        children.append(Child("gateway"))
        return children

    def child(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    # -- lifecycle ------------------------------------------------------------------------

    def on_signal(self) -> None:
        self.signals += 1
        self.stop_event.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.on_signal)
        loop.add_signal_handler(signal.SIGINT, self.on_signal)
        if self.forks.proc is None:
            self.forks.launch()  # it imports while the lease is taken
        keeper_task = None
        if self.config.storage.s3.bucket:
            from agentos.lease import LeaseKeeper, node_id
            self.config.cluster.node_id = node_id(self.config)
            self.lease_keeper = LeaseKeeper(self.config)
            if not await self.lease_keeper.acquire(self.stop_event, self.standby):
                self.forks.close()
                return service.EXIT_OK
            self.config.cluster.epoch = self.lease_keeper.lease.epoch
            keeper_task = asyncio.create_task(self.lease_keeper.keep(self._lease_renewed, self._lease_lost))
        elif self.standby:
            log.error("--standby needs storage.s3: the lease lives in the bucket")
            self.forks.close()
            return service.EXIT_CONFIG
        self.write_config()
        self.claim_gateway_cpu()   # once the lease is ours: a standby holds no CPU while it waits
        try:
            await self.start_all()
        except StartupError as exc:
            log.error("%s", exc)
            await self.stop_all(grace=1.0)
            return service.EXIT_FAILURE
        monitor = asyncio.create_task(self.monitor())
        await self.stop_event.wait()
        monitor.cancel()
        if keeper_task is not None:
            keeper_task.cancel()
        await self.shutdown()
        if self.lease_keeper is not None and self.exit_code == service.EXIT_OK:
            await self.lease_keeper.release()
        return self.exit_code

    def _lease_renewed(self, epoch: int, valid_secs: float) -> None:
        if self.bus is None:
            return
        for i in range(self.config.logs):
            self.bus.send(log_writer(i), Kind.LEASE, {"epoch": epoch, "valid_secs": max(0.0, valid_secs)})

    async def _lease_lost(self) -> None:
        self.exit_code = service.EXIT_LEASE_LOST
        self.signals = 2  # no drain: nothing this node does can be acknowledged any more
        self.stop_event.set()

    async def start_all(self) -> None:
        await self.forks.wait_ready(READY_TIMEOUT_SECS)
        for child in self.children:
            if self.stop_event.is_set():
                return
            self.start(child)
            if child.role == "broker":
                await self.wait_for(child, lambda: bus_address(self.config, self.run_dir).ready(), "its socket")
                self.bus = Bus(SUPERVISOR, bus_address(self.config, self.run_dir),
                               heartbeat_secs=self.config.broker.heartbeat_secs,
                               spill_bytes=self.config.broker.spill_ring_bytes)
                await self.bus.start()
            elif child.role == "mock-llm":
                await self.wait_for(child, lambda: self.run_dir.read_port("mock-llm") is not None, "its port")
                port = self.run_dir.read_port("mock-llm")
                self.config.provider.base_url = f"http://127.0.0.1:{port}/v1"
                self.write_config()
                log.info("no provider.base_url configured: started the bundled mock model at %s "
                         "(ttft %gms, %g tok/s, %d tokens)", self.config.provider.base_url, self.config.mock.ttft_ms,
                         self.config.mock.tps, self.config.mock.tokens)
        gateway = self.child("gateway/0")
        await self.wait_for(gateway, lambda: self.run_dir.read_port("gateway") is not None, "its port")
        host, _ = self.config.listen_host_port
        self.write_table()
        log.info("serving on http://%s:%d (run dir %s)", host, self.run_dir.read_port("gateway"), self.run_dir.path)

    async def wait_for(self, child: Child, ready, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECS
        while not ready():
            if not child.alive:
                raise StartupError(f"{child.name} exited with code {child.proc.returncode} before {what} was ready")
            if time.monotonic() > deadline or self.stop_event.is_set():
                raise StartupError(f"{child.name}: {what} not ready within {READY_TIMEOUT_SECS:.0f}s")
            await asyncio.sleep(0.02)

    def start(self, child: Child) -> None:
        args = [child.role, str(child.index), str(self.run_dir.path), str(os.getpid())]
        child.proc = self.forks.spawn(args) or subprocess.Popen(
            module_command("agentos.child", *args), env=self.env, stdin=subprocess.DEVNULL,
            start_new_session=True)
        child.started_at = time.monotonic()
        child.started_wall = time.time()
        child.restart_at = 0.0
        self._watch_exit(child)
        metrics.processes_up.inc()
        self.write_table()

    async def monitor(self) -> None:
        """Woken when a child exits (its pidfd; uvloop keeps SIGCHLD to itself); otherwise it
        looks once a second, or sooner while a restart is due or a relaunched fork server has not
        said it is ready."""
        while True:
            try:
                await asyncio.wait_for(self.exited.wait(), self._monitor_wait())
            except asyncio.TimeoutError:
                pass
            self.exited.clear()
            self._check_children()

    def _watch_exit(self, child: Child) -> None:
        try:
            child.exit_fd = os.pidfd_open(child.proc.pid)
        except OSError:
            return    # no pidfd here (or already reaped): the once-a-second look finds the exit
        loop, fd = asyncio.get_running_loop(), child.exit_fd

        def exited() -> None:
            # once: a pidfd stays readable until closed, and a reader left in place ran at every turn
            # of the loop until the exit was handled (13,777 times in one tree's stop, no monitor running)
            loop.remove_reader(fd)
            self.exited.set()
        loop.add_reader(fd, exited)

    def _unwatch_exit(self, child: Child) -> None:
        if child.exit_fd >= 0:
            asyncio.get_running_loop().remove_reader(child.exit_fd)
            os.close(child.exit_fd)
            child.exit_fd = -1

    def _monitor_wait(self) -> float:
        if self.forks.sock is not None and not self.forks.pid:
            return MONITOR_BUSY_SECS
        due = [c.restart_at for c in self.children if c.proc is None and c.restart_at]
        if not due:
            return MONITOR_IDLE_SECS
        return min(MONITOR_IDLE_SECS, max(MONITOR_BUSY_SECS, min(due) - time.monotonic()))

    def _check_children(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                self.on_exit(child, now)
            elif child.proc is None and child.restart_at and now >= child.restart_at:
                log.info("restarting %s (restart #%d)", child.name, child.restarts)
                self.start(child)
        self.keep_fork_server()
        self.reap_strangers()

    def keep_fork_server(self) -> None:
        forks = self.forks
        if forks.proc is not None and forks.proc.poll() is not None:
            log.warning("the fork server (pid %d) exited with code %d; starting a new one", forks.proc.pid,
                        forks.proc.returncode)
            metrics.mark_dead(forks.proc.pid)
            forks.launch()
            self.write_table()
        forks.poll_ready()

    def reap_strangers(self) -> None:
        """As a subreaper we inherit any orphan of the tree: reap those not our children, kill our strays."""
        ours = {c.proc.pid for c in self.children if c.proc is not None}
        if self.forks.proc is not None:
            ours.add(self.forks.proc.pid)
        strays.kill_strays(ours, log)
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in ours:
                return  # ours are reaped by their own poll()
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                return

    def on_exit(self, child: Child, now: float) -> None:
        code = child.proc.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        log.warning("%s (pid %d) %s after %.1fs", child.name, child.proc.pid, how, now - child.started_at)
        metrics.mark_dead(child.proc.pid)
        metrics.processes_up.dec()
        self.remove_rings(rmdir=False)
        child.proc = None
        self._unwatch_exit(child)
        child.failures = next_failure_count(self.policy, child.failures, now - child.started_at)
        child.restart_times = [t for t in child.restart_times if now - t <= self.policy.loop_window_secs] + [now]
        crash_loop = is_crash_loop(self.policy, child.restart_times, now)
        if crash_loop and not child.in_crash_loop:
            log.error("%s is in a crash loop (%d restarts in %.0fs); still restarting, at most every %.0fs",
                      child.name, len(child.restart_times), self.policy.loop_window_secs, self.policy.cap_secs)
        child.in_crash_loop = crash_loop
        child.restarts += 1
        metrics.process_restarts.labels(child.role).inc()
        child.restart_at = now + restart_delay(self.policy, child.failures)
        self.write_table()

    async def shutdown(self) -> None:
        self.stopping = True
        gateway, broker = self.child("gateway/0"), self.child("broker")
        if self.signals < 2 and gateway.alive and broker.alive and self.bus is not None:
            await self.drain(gateway)
        await self.stop_all(STOP_GRACE_SECS)
        log.info("stopped")

    async def drain(self, gateway: Child) -> None:
        """Ask the gateway to drain; stop waiting on a second signal or if the gateway dies."""
        limit = self.config.kernel.drain_secs
        log.info("draining (up to %.0fs; signal again to stop at once)", limit)
        request = asyncio.ensure_future(self.bus.request(gateway.name, Kind.DRAIN, {"deadline_secs": limit},
                                                         timeout=limit + 5.0, attempt_secs=limit + 5.0))
        while not request.done() and self.signals < 2 and gateway.alive:
            await asyncio.wait([request], timeout=0.05)
        if not request.done():
            request.cancel()
            log.warning("stopped waiting for the drain")
        elif request.exception() is not None:
            log.warning("gateway did not confirm the drain: %s", request.exception())
        else:
            left = request.result().body["in_flight"]
            if left:
                log.warning("drain deadline passed with %d turns in flight", left)
            else:
                log.info("drained: no turns in flight")

    async def stop_all(self, grace: float) -> None:
        self.stopping = True
        for child in reversed(self.children):
            if child.role == "broker" and self.bus is not None:
                await self.bus.close()
                self.bus = None
            await self.stop_child(child, grace)
        if self.forks.proc is not None:
            metrics.mark_dead(self.forks.proc.pid, fold=False)
        metrics.fold_dead()   # once for every process stopped
        self.forks.close()
        if self.cpu_claim is not None:   # every child is gone: another server may take the CPU
            os.close(self.cpu_claim)
            self.cpu_claim = None
        self.remove_rings(rmdir=True)
        self.write_table()

    def remove_rings(self, rmdir: bool) -> None:
        """The big-body rings (broker/spill.py) of children that died without removing theirs."""
        if self.config.broker.transport == "ipc":
            spill.remove_leftovers(self.run_dir.bus_endpoint, rmdir)

    async def stop_child(self, child: Child, grace: float) -> None:
        proc = child.proc
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                log.warning("%s did not stop within %.0fs; killing it", child.name, grace)
        _signal_group(proc.pid, signal.SIGKILL)  # anything it left in its group goes too
        proc.wait()
        metrics.mark_dead(proc.pid, fold=False)   # stop_all folds them all at once
        child.proc = None
        self._unwatch_exit(child)

    # -- run directory --------------------------------------------------------------------

    def claim_gateway_cpu(self) -> None:
        """The CPU the gateway runs on, for the children to read (agentos/cpu_layout.py)."""
        cpu, self.cpu_claim = cpu_layout.choose_gateway_cpu(self.config, log)
        self.run_dir.write_json(self.run_dir.placement_path, {"gateway_cpu": cpu})

    def write_config(self) -> None:
        self.run_dir.write_json(self.run_dir.config_path, dataclasses.asdict(self.config))

    def write_table(self) -> None:
        rows = [{"name": c.name, "role": c.role, "pid": c.proc.pid if c.proc else None,
                 "started_at": c.started_wall if c.proc else None, "restarts": c.restarts,
                 "crash_loop": c.in_crash_loop} for c in self.children]
        self.run_dir.write_json(self.run_dir.processes_path, {
            "supervisor": {"pid": os.getpid(), "started_at": self.started_at},
            "forkserver": {"pid": self.forks.proc.pid if self.forks.proc else None,
                           "restarts": max(0, self.forks.launches - 1), "started_at": self.forks.started_wall},
            "listen": self.config.gateway.listen, "gateway_port": self.run_dir.read_port("gateway"),
            "stopping": self.stopping, "children": rows})


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

"""The Ray executor: one Ray task per process group, on a local Ray instance or a cluster.

Without an address a local instance is started with ``workers`` CPUs (and the GPUs Ray
detects); ``address='auto'`` joins the running cluster. A GPU run asks for 1/runs_per_gpu of
a GPU, so Ray packs that many on one device and sets each task's CUDA_VISIBLE_DEVICES itself
(Ray, not cuda:N, picks the GPU). A cancelled task stops where it is: it resumes later from its
last periodic checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from agents.errors import ConfigError
from benchmark.distributed_config import COLLECTOR_CPUS
from benchmark.execution import devices
from benchmark.execution.base import Executor, Submission, Task
from benchmark.execution.messages import Message, drain


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: make install (or pip install -e '.[ray]')") from None
    return ray


class RayExecutor(Executor):
    name = "ray"
    interrupt_note = "interrupted: cancelling Ray tasks"

    def __init__(self, requested_device: str, workers: int, runs_per_gpu: int | None = None, address: str | None = None):
        _import_ray()
        self.requested_device, self.workers, self.runs_per_gpu, self.address = requested_device, workers, runs_per_gpu, address

    def submit(self, tasks: list[Task], log: Callable[[str], None]) -> Submission:
        return _RaySubmission(self, tasks, log)


def collectors_of(task: Task) -> int:
    """The collectors of the task's distributed runs (the most of one run; 0 for none)."""
    return max(((spec.distributed or {}).get("collectors", 0) for spec in getattr(task, "group", [])), default=0)


def _run_task(task: Task, messages: Any, uses_gpu: bool) -> Any:
    """A Ray task: Ray has already set CUDA_VISIBLE_DEVICES to the GPU it assigned (if any).
    The CPUs of its runs' collectors were reserved with the task: its collectors reserve none."""
    os.environ[COLLECTOR_CPUS] = "0"
    where = f"GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '?')} (Ray)" if uses_gpu else "CPU (Ray)"
    if not uses_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return task(messages, "cuda:0" if uses_gpu else "cpu", where)


class _RaySubmission(Submission):
    def __init__(self, executor: RayExecutor, tasks: list[Task], log: Callable[[str], None]):
        ray = self._ray = _import_ray()
        from ray.util.queue import Queue

        self._started_here = not ray.is_initialized()
        if self._started_here:
            options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
            if executor.address:
                ray.init(address=executor.address, **options)
            else:
                os.environ.setdefault("RAY_worker_niceness", "0")  # Ray's default, 15, starves runs beside other work
                from benchmark.distributed_config import quiet_ray_banners

                quiet_ray_banners()
                # a distributed run takes a CPU for itself and one for each of its collectors
                cpus = executor.workers * (1 + max((collectors_of(task) for task in tasks), default=0))
                ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=100 * 1024**2, **options)
        self._messages: Any = None
        try:
            cluster_gpus = [str(index) for index in range(int(ray.cluster_resources().get("GPU", 0)))]
            slots = devices.plan_slots(executor.requested_device, cluster_gpus, executor.runs_per_gpu, executor.workers)
            gpu_slots = [slot for slot in slots if slot.is_gpu]
            gpu_share = len({slot.visible_devices for slot in gpu_slots}) / len(gpu_slots) if gpu_slots else 0.0
            log(
                f"Ray: {ray.cluster_resources().get('CPU', 0):.0f} CPUs, {len(cluster_gpus)} GPUs; "
                + (f"{gpu_share:g} GPU per run" if gpu_share else "runs on CPU")
            )
            self._messages = Queue(actor_options={"num_cpus": 0})
            # a GPU run gets a fresh worker process: CUDA must not have started on another device
            remote = ray.remote(max_calls=1 if gpu_share else 0, max_retries=0)(_run_task)
            self._references = {
                remote.options(num_cpus=1 + collectors_of(task), num_gpus=gpu_share).remote(task, self._messages, gpu_share > 0): index
                for index, task in enumerate(tasks)
            }
        except BaseException:
            self.close()
            raise
        self._pending = list(self._references)

    def wait(self, timeout: float) -> list[tuple[int, Any]]:
        ended, self._pending = self._ray.wait(self._pending, num_returns=1, timeout=timeout)
        return [(self._references[reference], self._result_of(reference)) for reference in ended]

    def _result_of(self, reference: Any) -> Any:
        try:
            return self._ray.get(reference)
        except Exception as error:  # noqa: BLE001 - the task raised, or its process died: its result
            return error

    def messages(self) -> list[Message]:
        return drain(self._messages)

    @property
    def done(self) -> bool:
        return not self._pending

    def cancel(self, grace_seconds: float = 30.0) -> None:
        """Interrupt every task; kill the workers of those still running after ``grace_seconds``,
        so that none is alive (holding its run's claim) when the launch closes its open runs."""
        references = list(self._references)
        for reference in references:
            self._ray.cancel(reference, force=False)
        _, running = self._ray.wait(references, num_returns=len(references), timeout=grace_seconds)
        for reference in running:
            self._ray.cancel(reference, force=True)
        if running:
            self._ray.wait(running, num_returns=len(running), timeout=grace_seconds)

    def close(self) -> None:
        try:
            if self._messages is not None:
                self._messages.shutdown()
        finally:
            if self._started_here:
                self._ray.shutdown()

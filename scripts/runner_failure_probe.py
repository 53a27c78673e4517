"""What a failing candidate costs a search on this GPU: the CheckingRunner replaces its worker
after a crash, with the standby started beforehand ("standby", as it does now) or with one
started at the failure ("cold", as it did before). Stand-in candidates: 30 that take 1 s each
and 2 that crash, 10 apart. Run on the GPU machine from the checkout:
    python3 scripts/runner_failure_probe.py
"""
import sys
import time

sys.path.insert(0, ".")
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.support.popen_pool import PopenPoolExecutor  # noqa: E402

from schedules.workloads import Workload  # noqa: E402
from tuning import candidates  # noqa: E402

CANDIDATES = ["ok"] * 10 + ["crash"] + ["ok"] * 10 + ["crash"] + ["ok"] * 10


def evaluate(path, best_ms=None):
    """measure.evaluate_artifact's stand-in."""
    import time

    if path == "crash":
        raise RuntimeError("CUDA error: misaligned address")
    time.sleep(1.0)  # a candidate's check and timing
    return 1e-3


def cold(self):
    """A worker that starts at its first task: CheckingRunner._new_pool before the standby."""
    return PopenPoolExecutor(max_workers=1, timeout=self.timeout_sec,
                             initializer=candidates._warm_up_runner)


inputs = [ms.runner.RunnerInput(path, "cuda", []) for path in CANDIDATES]
for label in ("standby", "cold"):
    runner = candidates.CheckingRunner(Workload("gemm", (1024, 512, 2048)))
    runner.evaluate = evaluate
    runner.outcomes(inputs[:1])  # the first worker warm
    time.sleep(15)  # the standby warms up meanwhile
    if label == "cold":
        runner.standby.shutdown()
        runner.standby = cold(runner)
        runner._new_pool = cold.__get__(runner)
    start = time.time()
    runner.outcomes(inputs)
    print(f"{label} 2 failures among 32 candidates (30 of them 1 s each): "
          f"{time.time() - start:.1f} s", flush=True)
    candidates.shut_down(runner)

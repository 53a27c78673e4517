"""The postprocessor that keeps MetaSchedule from building pipelined copies TVM lowers wrongly
(tuning/async_copy.py): it finds them, and only them, and the CUDA spaces use it."""

import pytest
import tvm

from schedules import Workload
from tests.test_tuning import split_k_candidates
from tuning import build, metaschedule
from tuning.async_copy import broken_async_copies

# One copy of A (256x512, float32) into shared memory, in a loop over K steps that may be an
# async pipeline stage; the copy's loops: x serial, t on threads, v the vector's lane.
COPY = '''
@T.prim_func(s_tir=True)
def main(A: T.Buffer((256, 512), "float32"{options})):
    A_shared = T.sblock_alloc_buffer((256, 512), scope="shared")
    for k in T.serial({k}, annotations={{{annotations}}}):
        for x in range({x}):
            for t in T.thread_binding({t}, thread="threadIdx.x"):
                for v in T.vectorized({lanes}):
                    with T.sblock("A_shared"):
                        v0 = T.axis.spatial(256, {row})
                        v1 = T.axis.spatial(512, {column})
                        A_shared[v0, v1] = {value}
'''
ASYNC = ('"software_pipeline_async_stages": [0], "software_pipeline_stage": [0, 1], '
         '"software_pipeline_order": [0, 1]')
COPIES = {  # name: (the loops, the copy's indices and value, whether it is copied wrongly)
    "along rows": (dict(k=128, x=1, t=256, lanes=4, row="t", column="k * 4 + v"), False),
    # the same in rows 513 elements apart (a strided buffer): every other row's vectors unaligned
    "along rows 513 apart": (dict(k=128, x=1, t=256, lanes=4, row="t", column="k * 4 + v",
                                  options=", strides=(513, 1)"), True),
    "along rows one element in": (dict(k=128, x=1, t=256, lanes=4, row="t", column="k * 4 + v",
                                       options=", elem_offset=1"), True),
    # what TVM's rules sample with a K tile of one element: each vector goes down a column
    "down a column": (dict(k=512, x=1, t=64, lanes=4, row="t * 4 + v", column="k"), True),
    "down a column, predicated": (dict(k=512, x=1, t=64, lanes=4, row="t * 4 + v", column="k",
                                       value="T.if_then_else(v0 < 200, A[v0, v1], T.float32(0))"),
                                  True),
    # 32 bytes: no cp.async takes them, so the pass copies element by element
    "down a column, 32 bytes": (dict(k=512, x=1, t=32, lanes=8, row="t * 8 + v", column="k"), False),
    "off by one element": (dict(k=127, x=1, t=256, lanes=4, row="t", column="k * 4 + v + 1"), True),
    # not equally spaced, so no Ramp: copied element by element
    "across two rows": (dict(k=256, x=1, t=128, lanes=4, row="(t * 4 + v) // 2",
                             column="k * 2 + (t * 4 + v) % 2"), False),
    # consecutive, but through divisions the simplifier leaves: judged at sample points
    "through fused loops": (dict(k=2, x=4, t=64, lanes=2, row="k * 2 + (x * 64 + t * 2 + v) // 128",
                                 column="(x * 64 + t * 2 + v) % 128"), False),
}


def _copy(name: str, pipelined: bool = True) -> tvm.tirx.PrimFunc:
    loops, _ = COPIES[name]
    return tvm.script.from_source(COPY.format(annotations=ASYNC if pipelined else "",
                                              **{"options": "", "value": "A[v0, v1]", **loops}))


@pytest.mark.parametrize("name", COPIES)
@pytest.mark.parametrize("pipelined", [True, False])
def test_a_pipelined_copy_is_refused_only_where_its_vectors_are_not_whole(name, pipelined):
    """A vector the pass makes one cp.async of must be consecutive elements of A, its first
    aligned to the vector; outside an async pipeline TVM loads a vector's elements one by one,
    and any copy goes."""
    broken = COPIES[name][1]
    assert broken_async_copies(_copy(name, pipelined)) == (["A_shared"] if broken and pipelined else [])


@pytest.mark.parametrize("space, tensor_cores", [("tvm", False), ("split-k", False), ("split-k", True)])
def test_every_cuda_space_ends_its_postprocessors_with_the_refusal(space, tensor_cores):
    """TVM's rules sample the broken copies in every CUDA space, so every one refuses them:
    its last postprocessor fails a schedule with one and passes one without."""
    from tvm.s_tir import meta_schedule as ms

    wl = Workload("gemm", (256, 128, 512), "float16" if tensor_cores else "float32")
    mod, target = tvm.IRModule({"main": wl.prim_func()}), build.cuda_target("sm_90")
    context = ms.TuneContext(mod=mod, target=target, task_name="main", num_threads=1,
                             space_generator=metaschedule.design_space(mod, target, space, tensor_cores))
    refusal = context.space_generator.postprocs[-1]
    assert not refusal.apply(tvm.s_tir.Schedule(_copy("down a column")))
    assert refusal.apply(tvm.s_tir.Schedule(_copy("along rows")))


@pytest.mark.slow
def test_the_split_k_space_builds_no_broken_copy():
    """The candidates of a split-K search's first batch, as the GPU tier checks a few of them:
    none has a broken copy (its random cost model draws a different batch each time)."""
    mods = split_k_candidates(Workload("gemm", (256, 128, 512)), build.cuda_target("sm_90"))
    assert mods and not [m for m in mods if broken_async_copies(m["main"])]

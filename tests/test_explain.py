"""tuning/explain.py: the instruction mix of rungs shows what their docstrings promise, ncu's raw
CSV becomes counters, a profiler failure records nothing, and explain's sentences tie each large
change to the hunk a rule says it follows from."""

import os
import shutil

import pytest

from schedules import Workload
from tuning import build, explain, measure
from tuning.explore import SearchResults, build_schedule, resolve

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "ncu-raw-two-kernels.csv")
LOADS, FP32, TENSOR = ("global loads (LDG/LDGSTS/TMA)", "fp32 (FFMA/FADD/FMUL)",
                       "tensor (HMMA/HGMMA)")
SHARED, SYNC, SHUFFLES = "shared (LDS/STS/LDSM)", "sync (BAR/SYNCS)", "shuffles (SHFL)"

needs_sass = pytest.mark.skipif(
    not shutil.which("nvcc") or explain.disassembler() is None,
    reason="nvcc on PATH and nvdisasm or cuobjdump (pip install nvidia-cuda-nvdisasm) are needed "
           "for the instruction mix")


@pytest.fixture(scope="module")
def mix():
    """mix(wl, rung) -> the instruction mix of the rung built for sm_90, cached."""
    cache = {}
    target = build.cuda_target("sm_90")

    def mix_of(wl, name):
        if (wl, name) not in cache:
            built = build_schedule(resolve(wl, name, SearchResults()), wl, target)
            cache[wl, name] = explain.instruction_mix(explain.sass(built.source, "sm_90"))
        return cache[wl, name]

    return mix_of


GEMV = Workload("gemv", (1024, 1024), "float16")


@needs_sass
def test_splitk_vec_loads_16_byte_vectors_so_fewer_global_loads_per_fma(mix):
    """splitk_vec's docstring: each thread reads its K slice as one 16-byte vector."""
    plain, vector = mix(GEMV, "splitk"), mix(GEMV, "splitk_vec")
    assert vector[LOADS] * 4 <= plain[LOADS]
    assert vector[LOADS] / vector[FP32] < plain[LOADS] / plain[FP32]


@needs_sass
def test_allreduce_reduces_by_shuffles_instead_of_shared_memory_and_barriers(mix):
    """allreduce's docstring: one warp per row, reduced by shuffles."""
    tree, warp = mix(GEMV, "splitk_vec"), mix(GEMV, "allreduce")
    assert tree[SHUFFLES] == 0 < warp[SHUFFLES]
    assert warp[SYNC] < tree[SYNC] and warp[SHARED] < tree[SHARED]


@needs_sass
def test_v6_multiplies_on_tensor_cores_where_v5_used_fmas(mix):
    """v6's docstring: mma.sync on tensor cores, fed by ldmatrix (LDSM) and cp.async (LDGSTS)."""
    wl = Workload("gemm", (256, 256, 512), "float16", "float32", "nt")
    cores, tensor = mix(wl, "v5"), mix(wl, "v6")
    assert cores[TENSOR] == 0 < tensor[TENSOR]
    assert tensor[FP32] < cores[FP32]


def test_listings_of_both_disassemblers_parse_and_normalise_alike():
    """nvdisasm -c and cuobjdump -sass print the same instructions in other frames; normalised,
    two register allocations of one instruction read the same."""
    nvdisasm = (".text.main_kernel:\n"
                "        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
                "        /*0010*/              @!P0 HMMA.16816.F32 R4, R8, R12, R4 ;\n")
    cuobjdump = ("\t\tFunction : main_kernel\n"
                 "        /*0000*/                   LDC R1, c[0x0][0x28] ;"
                 "                  /* 0x00000a00ff017b82 */\n"
                 "        /*0010*/              @!P1 HMMA.16816.F32 R6, R10, R14, R6 ;"
                 "    /* 0x000000000c04723c */\n")
    a, b = explain.listing(nvdisasm), explain.listing(cuobjdump)
    assert list(a) == list(b) == ["main_kernel"]
    assert explain.instruction_mix(a)[TENSOR] == 1 and explain.instruction_mix(a)["total"] == 2
    assert [explain.normalised(i) for i in a["main_kernel"]] == \
        [explain.normalised(i) for i in b["main_kernel"]]
    assert explain.sass_diff(a, b, "x", "y") == ""


def test_ncu_raw_csv_becomes_the_counters_of_one_call():
    """Two kernels of one call (a split-K GEMM and its sum): sums add, per-thread launch facts
    take the larger, rates are weighted by duration; the top stalls leave out 'selected'."""
    with open(FIXTURE) as f:
        rows = explain.parse_raw_csv(f.read())
    assert [r["Kernel Name"] for r in rows] == ["main_kernel", "main_kernel_1"]
    counters = explain.counters_of(rows)
    total = 30112 + 2048
    assert counters["duration_ns"] == total
    assert counters["dram_read_bytes"] == 8421376 + 4096
    assert counters["registers"] == 89 and counters["static_shared_bytes"] == 17920
    assert counters["occupancy_pct"] == pytest.approx((24.7 * 30112 + 88.0 * 2048) / total)
    assert counters["tensor_pipe_pct"] == 0 and counters["bank_conflicts_ld"] == 1024
    assert list(counters["stalls"]) == ["long_scoreboard", "mio_throttle", "barrier"]
    assert counters["stalls"]["long_scoreboard"] == pytest.approx(
        (3.47 * 30112 + 6.0 * 2048) / total)


@pytest.mark.parametrize("output, line", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
     "Performance Counters on the target device 0.", "ERR_NVGPUCTRPERM"),
    ("==WARNING== No kernels were profiled.", "profiled no kernel"),
    ("==ERROR== Failed to find metric dram__bytes_read.sum", "no metric dram__bytes_read.sum"),
    ("==PROF== Disconnected from process 1", None),
])
def test_ncu_failures_are_said_in_one_line(output, line):
    said = explain.ncu_failure(output)
    assert (said is None) if line is None else (line in said and "\n" not in said)


WL = Workload("gemm", (1024, 512, 2048), "float32")


def test_without_ncu_nothing_is_profiled_or_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(explain.shutil, "which", lambda tool: None)
    path = tmp_path / "counters.jsonl"
    with pytest.raises(explain.ProfilerFailed, match="ncu .* is not on PATH") as e:
        explain.record_counters(WL, ["v3"], str(path), say=lambda line: None)
    assert e.value.exit_status == 1 and not path.exists()


def exported(folder, name):
    """A stand-in for a schedule's exported build: a file in a directory of its own."""
    (folder / name).mkdir()
    (folder / name / "counted.tar").write_text("")
    return str(folder / name / "counted.tar")


def test_a_launch_ncu_cannot_profile_records_none_of_the_schedules(tmp_path, monkeypatch):
    """v2 profiles, v3 fails: nothing is written, v2's counters included."""
    def profile(wl, name, flush, module):
        if name == "v3":
            raise explain.ProfilerFailed("v3: ncu profiled no kernel of the launch")
        return {"duration_ns": 1.0, "stalls": {}}

    monkeypatch.setattr(explain, "ncu_path", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(explain, "exported_build", lambda wl, name: exported(tmp_path, name))
    monkeypatch.setattr(explain, "profile", profile)
    path = tmp_path / "counters.jsonl"
    with pytest.raises(explain.ProfilerFailed, match="v3: ncu profiled no kernel"):
        explain.record_counters(WL, ["v2", "v3"], str(path), say=lambda line: None)
    assert not path.exists()


def test_counter_records_are_keyed_as_timings_and_read_back(tmp_path, monkeypatch):
    facts = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.0", "arch": "sm_90"}
    monkeypatch.setattr(measure, "device_facts", lambda: facts)
    monkeypatch.setattr(explain, "ncu_path", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(explain, "exported_build", lambda wl, name: exported(tmp_path, name))
    monkeypatch.setattr(explain, "profile", lambda wl, name, flush, module: {
        "duration_ns": 2.0 if flush == "read" else 1.0, "registers": 32, "stalls": {"wait": 1}})
    path = str(tmp_path / "counters.jsonl")
    made = explain.record_counters(WL, ["v3"], path, say=lambda line: None)
    assert not (tmp_path / "v3").exists()  # the build, profiled twice, is cleaned up
    assert [r.flush for r in made] == ["none", "read"]
    assert all(explain.counters_problem(r.to_json()) is None and r.status == "counted"
               for r in made)
    assert made[0].params == resolve(WL, "v3", SearchResults()).defaults
    found = explain.recorded(path, WL, resolve(WL, "v3", SearchResults()), warn=print)
    assert found["read"]["counters"]["duration_ns"] == 2.0
    assert explain.recorded(path, WL, resolve(WL, "v2", SearchResults()), warn=print) == {}
    assert explain.counters_problem({**made[0].to_json(), "counters": {"registers": "many",
                                                                       "stalls": {}}}) is not None


DIFF = """--- v2 (lowered)
+++ v3 (lowered)
@@ -3,6 +3,8 @@
     C = T.match_buffer(c, (1024, 512))
+    A_shared = T.alloc_buffer((16, 16), scope="shared")
+    B_shared = T.alloc_buffer((16, 16), scope="shared")
@@ -20,4 +22,5 @@
-    C[i, j] = C[i, j] + A[i, k] * B[k, j]
+    T.ptx_mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", A_frag, B_frag, C_frag)
+    T.tvm_storage_sync("shared")
"""


def test_each_large_change_names_the_hunk_its_rule_ties_it_to():
    counts = explain.changes(
        {"dram_read_bytes": 4194304, "tensor_pipe_pct": 0.0, "registers": 40, "l2_hit_pct": 50.0,
         "achieved": 1, "stalls": {"wait": 1}},
        {"dram_read_bytes": 262144, "tensor_pipe_pct": 61.0, "registers": 42, "l2_hit_pct": 50.0,
         "achieved": 3, "stalls": {"wait": 2}})
    said = explain.sentences(counts, explain.hunks(DIFF))
    assert said == [
        "tensor_pipe_pct 0 -> 61 (new): follows from the hunk @@ -20,4 +22,5 @@, which adds "
        "tensor-core mma (mma.sync / wgmma / ldmatrix).",
        "dram_read_bytes 4194304 -> 262144 (-94%): follows from the hunk @@ -3,6 +3,8 @@, which "
        "adds a shared-memory allocation.",
        "achieved 1 -> 3 (+200%): no rule of the table ties it to a hunk of the IR diff.",
    ]  # 16x fewer bytes before 3x more achieved; registers +5% is under LARGE; l2_hit_pct
    # did not change


def test_a_count_that_moves_against_the_rule_follows_from_the_hunk_that_removes_the_feature():
    """v3 -> v2 read backwards: the shared tiles go, and DRAM bytes come back up."""
    backwards = "".join(
        {"+": "-", "-": "+"}.get(line[:1], line[:1]) + line[1:] + "\n"
        for line in DIFF.splitlines() if not line.startswith(("---", "+++")))
    counts = explain.changes({"dram_read_bytes": 262144}, {"dram_read_bytes": 4194304})
    (said,) = explain.sentences(counts, explain.hunks(backwards))
    assert said.endswith("@@ -3,6 +3,8 @@, which removes a shared-memory allocation.")


def test_explain_without_a_gpu_prints_the_static_part_and_says_counters_need_one(
        tmp_path, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(explain.shutil, "which", lambda tool: None if tool == "nvcc" else which(tool))
    lines = []
    explain.explain(GEMV, "splitk", "splitk_vec", SearchResults(), "sm_90", lines.append,
                    print, counters=str(tmp_path / "none.jsonl"))
    text = "\n".join(lines)
    assert "+                x_local[0:8] = x[T.Ramp(" in text  # the IR diff
    assert "| shared bytes" in text and "the instruction mix needs nvcc on PATH" in text
    assert "the counters need a GPU: none recorded for both splitk and splitk_vec" in text

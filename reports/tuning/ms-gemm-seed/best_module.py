# from tvm.script import ir as I
# from tvm.script import tirx as T
# from tvm.tirx.layout import Axis

@I.ir_module
class Module:
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((1024, 2048), "float32"), B: T.Buffer((2048, 512), "float32"), C: T.Buffer((1024, 512), "float32")):
        T.func_attr({"tirx.noalias": True})
        # with T.sblock("root"):
        C_local = T.sblock_alloc_buffer((1024, 512), scope="local")
        A_shared = T.sblock_alloc_buffer((1024, 2048), scope="shared")
        B_shared = T.sblock_alloc_buffer((2048, 512), scope="shared")
        for i_0_j_0_fused in T.thread_binding(128, thread="blockIdx.x", annotations={"pragma_auto_unroll_max_step": 128, "pragma_unroll_explicit": 1}):
            for i_1_j_1_fused in T.thread_binding(1, thread="vthread.x"):
                for i_2_j_2_fused in T.thread_binding(64, thread="threadIdx.x"):
                    for i_3_init, j_3_init, i_4_init, j_4_init in T.grid(2, 16, 2, 1):
                        with T.sblock("C_init"):
                            v_i = T.axis.spatial(1024, i_0_j_0_fused // 16 * 128 + i_2_j_2_fused // 2 * 4 + i_3_init * 2 + i_4_init)
                            v_j = T.axis.spatial(512, i_0_j_0_fused % 16 * 32 + i_2_j_2_fused % 2 * 16 + j_3_init + j_4_init)
                            T.reads()
                            T.writes(C_local[v_i, v_j])
                            T.sblock_attr({"meta_schedule.thread_extent_high_inclusive": 1024, "meta_schedule.thread_extent_low_inclusive": 32, "meta_schedule.tiling_structure": "SSSRRSRS"})
                            C_local[v_i, v_j] = T.float32(0.0)
                    for k_0_fused in T.serial(128, annotations={"software_pipeline_async_stages": [0], "software_pipeline_order": [0, 1, 2], "software_pipeline_stage": [0, 0, 2]}):
                        for ax0_ax1_fused_0 in range(8):
                            for ax0_ax1_fused_1 in T.thread_binding(64, thread="threadIdx.x"):
                                for ax0_ax1_fused_2 in T.vectorized(4):
                                    with T.sblock("A_shared"):
                                        v0 = T.axis.spatial(1024, i_0_j_0_fused // 16 * 128 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 16)
                                        v1 = T.axis.spatial(2048, k_0_fused * 16 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 16)
                                        T.reads(A[v0, v1])
                                        T.writes(A_shared[v0, v1])
                                        A_shared[v0, v1] = A[v0, v1]
                        for ax0_ax1_fused_0 in range(2):
                            for ax0_ax1_fused_1 in T.thread_binding(64, thread="threadIdx.x"):
                                for ax0_ax1_fused_2 in T.vectorized(4):
                                    with T.sblock("B_shared"):
                                        v0 = T.axis.spatial(2048, k_0_fused * 16 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 32)
                                        v1 = T.axis.spatial(512, i_0_j_0_fused % 16 * 32 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 32)
                                        T.reads(B[v0, v1])
                                        T.writes(B_shared[v0, v1])
                                        B_shared[v0, v1] = B[v0, v1]
                        for k_1, i_3, j_3, k_2, i_4, j_4 in T.grid(2, 2, 16, 8, 2, 1):
                            with T.sblock("C_update"):
                                v_i = T.axis.spatial(1024, i_0_j_0_fused // 16 * 128 + i_2_j_2_fused // 2 * 4 + i_3 * 2 + i_4)
                                v_j = T.axis.spatial(512, i_0_j_0_fused % 16 * 32 + i_2_j_2_fused % 2 * 16 + j_3 + j_4)
                                v_k = T.axis.reduce(2048, k_0_fused * 16 + k_1 * 8 + k_2)
                                T.reads(C_local[v_i, v_j], A_shared[v_i, v_k], B_shared[v_k, v_j])
                                T.writes(C_local[v_i, v_j])
                                T.sblock_attr({"meta_schedule.thread_extent_high_inclusive": 1024, "meta_schedule.thread_extent_low_inclusive": 32, "meta_schedule.tiling_structure": "SSSRRSRS"})
                                C_local[v_i, v_j] = C_local[v_i, v_j] + A_shared[v_i, v_k] * B_shared[v_k, v_j]
                    for ax0, ax1 in T.grid(4, 16):
                        with T.sblock("C_local"):
                            v0 = T.axis.spatial(1024, i_0_j_0_fused // 16 * 128 + i_2_j_2_fused // 2 * 4 + ax0)
                            v1 = T.axis.spatial(512, i_0_j_0_fused % 16 * 32 + i_2_j_2_fused % 2 * 16 + ax1)
                            T.reads(C_local[v0, v1])
                            T.writes(C[v0, v1])
                            C[v0, v1] = C_local[v0, v1]

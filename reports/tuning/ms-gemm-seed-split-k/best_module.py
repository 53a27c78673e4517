# from tvm.script import ir as I
# from tvm.script import tirx as T
# from tvm.tirx.layout import Axis

@I.ir_module
class Module:
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((1024, 2048), "float32"), B: T.Buffer((2048, 512), "float32"), C: T.Buffer((1024, 512), "float32")):
        T.func_attr({"tirx.noalias": True})
        # with T.sblock("root"):
        C_rf = T.sblock_alloc_buffer((8, 1024, 512))
        C_rf_local = T.sblock_alloc_buffer((8, 1024, 512), scope="local")
        A_shared = T.sblock_alloc_buffer((1024, 2048), scope="shared")
        B_shared = T.sblock_alloc_buffer((2048, 512), scope="shared")
        for k_0_0_i_0_j_0_fused in T.thread_binding(2048, thread="blockIdx.x"):
            for k_0_1_i_1_j_1_fused in T.thread_binding(16, thread="vthread.x"):
                for k_0_2_i_2_j_2_fused in T.thread_binding(64, thread="threadIdx.x"):
                    for k_0_3_init, i_3_init, j_3_init, k_0_4_init, i_4_init, j_4_init in T.grid(1, 1, 2, 1, 1, 1):
                        with T.sblock("C_rf_init"):
                            vk_0 = T.axis.spatial(8, k_0_0_i_0_j_0_fused // 256 + k_0_3_init + k_0_4_init)
                            v_i = T.axis.spatial(1024, k_0_0_i_0_j_0_fused % 256 // 8 * 32 + k_0_1_i_1_j_1_fused // 2 * 4 + k_0_2_i_2_j_2_fused // 16 + i_3_init + i_4_init)
                            v_j = T.axis.spatial(512, k_0_0_i_0_j_0_fused % 8 * 64 + k_0_1_i_1_j_1_fused % 2 * 32 + k_0_2_i_2_j_2_fused % 16 * 2 + j_3_init + j_4_init)
                            T.reads()
                            T.writes(C_rf_local[vk_0, v_i, v_j])
                            T.sblock_attr({"meta_schedule.thread_extent_high_inclusive": 1024, "meta_schedule.thread_extent_low_inclusive": 32, "meta_schedule.tiling_structure": "SSSRRSRS"})
                            C_rf_local[vk_0, v_i, v_j] = T.float32(0.0)
                    for k_1_0_fused in T.serial(8, annotations={"software_pipeline_async_stages": [0], "software_pipeline_order": [0, 1, 2], "software_pipeline_stage": [0, 0, 2]}):
                        for ax0_ax1_fused_0 in range(4):
                            for ax0_ax1_fused_1 in T.thread_binding(64, thread="threadIdx.x"):
                                for ax0_ax1_fused_2 in T.vectorized(4):
                                    with T.sblock("A_shared"):
                                        v0 = T.axis.spatial(1024, k_0_0_i_0_j_0_fused % 256 // 8 * 32 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 32)
                                        v1 = T.axis.spatial(2048, k_0_0_i_0_j_0_fused // 256 * 256 + k_1_0_fused * 32 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 32)
                                        T.reads(A[v0, v1])
                                        T.writes(A_shared[v0, v1])
                                        A_shared[v0, v1] = A[v0, v1]
                        for ax0_ax1_fused_0 in range(8):
                            for ax0_ax1_fused_1 in T.thread_binding(64, thread="threadIdx.x"):
                                for ax0_ax1_fused_2 in T.vectorized(4):
                                    with T.sblock("B_shared"):
                                        v0 = T.axis.spatial(2048, k_0_0_i_0_j_0_fused // 256 * 256 + k_1_0_fused * 32 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 64)
                                        v1 = T.axis.spatial(512, k_0_0_i_0_j_0_fused % 8 * 64 + (ax0_ax1_fused_0 * 256 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 64)
                                        T.reads(B[v0, v1])
                                        T.writes(B_shared[v0, v1])
                                        B_shared[v0, v1] = B[v0, v1]
                        for k_1_1, k_0_3, i_3, j_3, k_1_2, k_0_4, i_4, j_4 in T.grid(32, 1, 1, 2, 1, 1, 1, 1):
                            with T.sblock("C_rf_update"):
                                vk_0 = T.axis.spatial(8, k_0_0_i_0_j_0_fused // 256 + k_0_3 + k_0_4)
                                v_i = T.axis.spatial(1024, k_0_0_i_0_j_0_fused % 256 // 8 * 32 + k_0_1_i_1_j_1_fused // 2 * 4 + k_0_2_i_2_j_2_fused // 16 + i_3 + i_4)
                                v_j = T.axis.spatial(512, k_0_0_i_0_j_0_fused % 8 * 64 + k_0_1_i_1_j_1_fused % 2 * 32 + k_0_2_i_2_j_2_fused % 16 * 2 + j_3 + j_4)
                                vk_1 = T.axis.reduce(256, k_1_0_fused * 32 + k_1_1 + k_1_2)
                                T.reads(C_rf_local[vk_0, v_i, v_j], A_shared[v_i, vk_0 * 256 + vk_1], B_shared[vk_0 * 256 + vk_1, v_j])
                                T.writes(C_rf_local[vk_0, v_i, v_j])
                                T.sblock_attr({"meta_schedule.thread_extent_high_inclusive": 1024, "meta_schedule.thread_extent_low_inclusive": 32, "meta_schedule.tiling_structure": "SSSRRSRS"})
                                C_rf_local[vk_0, v_i, v_j] = C_rf_local[vk_0, v_i, v_j] + A_shared[v_i, vk_0 * 256 + vk_1] * B_shared[vk_0 * 256 + vk_1, v_j]
                    for ax0, ax1, ax2 in T.grid(1, 1, 2):
                        with T.sblock("C.rf_local"):
                            v0 = T.axis.spatial(8, k_0_0_i_0_j_0_fused // 256 + ax0)
                            v1 = T.axis.spatial(1024, k_0_0_i_0_j_0_fused % 256 // 8 * 32 + k_0_1_i_1_j_1_fused // 2 * 4 + k_0_2_i_2_j_2_fused // 16 + ax1)
                            v2 = T.axis.spatial(512, k_0_0_i_0_j_0_fused % 8 * 64 + k_0_1_i_1_j_1_fused % 2 * 32 + k_0_2_i_2_j_2_fused % 16 * 2 + ax2)
                            T.reads(C_rf_local[v0, v1, v2])
                            T.writes(C_rf[v0, v1, v2])
                            C_rf[v0, v1, v2] = C_rf_local[v0, v1, v2]
        for i_j_fused_1 in T.thread_binding(256, thread="blockIdx.x"):
            for i_j_fused_2 in T.thread_binding(1024, thread="threadIdx.x"):
                for i_j_fused_0 in range(2):
                    with T.sblock("C_init"):
                        v_i = T.axis.spatial(1024, (i_j_fused_0 * 262144 + i_j_fused_1 * 1024 + i_j_fused_2) // 512)
                        v_j = T.axis.spatial(512, (i_j_fused_0 * 262144 + i_j_fused_1 * 1024 + i_j_fused_2) % 512)
                        T.reads()
                        T.writes(C[v_i, v_j])
                        C[v_i, v_j] = T.float32(0.0)
                    for k_0 in range(8):
                        with T.sblock("C_update"):
                            vk_0 = T.axis.reduce(8, k_0)
                            v_i = T.axis.spatial(1024, (i_j_fused_0 * 262144 + i_j_fused_1 * 1024 + i_j_fused_2) // 512)
                            v_j = T.axis.spatial(512, (i_j_fused_0 * 262144 + i_j_fused_1 * 1024 + i_j_fused_2) % 512)
                            T.reads(C[v_i, v_j], C_rf[vk_0, v_i, v_j])
                            T.writes(C[v_i, v_j])
                            C[v_i, v_j] = C[v_i, v_j] + C_rf[vk_0, v_i, v_j]

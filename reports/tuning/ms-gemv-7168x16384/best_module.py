# from tvm.script import ir as I
# from tvm.script import tirx as T
# from tvm.tirx.layout import Axis

@I.ir_module
class Module:
    @T.prim_func(s_tir=True)
    def main(B: T.Buffer((7168, 16384), "float16"), x: T.Buffer((16384,), "float16"), y: T.Buffer((7168,), "float16")):
        T.func_attr({"tirx.noalias": True})
        # with T.sblock("root"):
        y_acc_local = T.sblock_alloc_buffer((7168,), scope="local")
        x_shared = T.sblock_alloc_buffer((16384,), "float16", scope="shared")
        B_shared = T.sblock_alloc_buffer((7168, 16384), "float16", scope="shared")
        for n_0_fused in T.thread_binding(224, thread="blockIdx.x", annotations={"pragma_auto_unroll_max_step": 1024, "pragma_unroll_explicit": 1}):
            for n_1_fused in T.thread_binding(1, thread="vthread.x"):
                for n_2_fused in T.thread_binding(32, thread="threadIdx.x"):
                    for n_3_init, n_4_init in T.grid(1, 1):
                        with T.sblock("y_acc_init"):
                            v_n = T.axis.spatial(7168, n_0_fused * 32 + n_2_fused + n_3_init + n_4_init)
                            T.reads()
                            T.writes(y_acc_local[v_n])
                            T.sblock_attr({"meta_schedule.thread_extent_high_inclusive": 1024, "meta_schedule.thread_extent_low_inclusive": 32, "meta_schedule.tiling_structure": "SSSRRSRS"})
                            y_acc_local[v_n] = T.float32(0.0)
                    for k_0 in range(128):
                        for ax0_fused_0 in range(2):
                            for ax0_fused_1 in T.thread_binding(32, thread="threadIdx.x"):
                                for ax0_fused_2 in T.vectorized(2):
                                    with T.sblock("x_shared"):
                                        v0 = T.axis.spatial(16384, k_0 * 128 + ax0_fused_0 * 64 + ax0_fused_1 * 2 + ax0_fused_2)
                                        T.reads(x[v0])
                                        T.writes(x_shared[v0])
                                        x_shared[v0] = x[v0]
                        for ax0_ax1_fused_0 in range(32):
                            for ax0_ax1_fused_1 in T.thread_binding(32, thread="threadIdx.x"):
                                for ax0_ax1_fused_2 in T.vectorized(4):
                                    with T.sblock("B_shared"):
                                        v0 = T.axis.spatial(7168, n_0_fused * 32 + (ax0_ax1_fused_0 * 128 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 128)
                                        v1 = T.axis.spatial(16384, k_0 * 128 + (ax0_ax1_fused_0 * 128 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 128)
                                        T.reads(B[v0, v1])
                                        T.writes(B_shared[v0, v1])
                                        B_shared[v0, v1] = B[v0, v1]
                        for k_1, n_3, k_2, n_4 in T.grid(2, 1, 64, 1):
                            with T.sblock("y_acc_update"):
                                v_n = T.axis.spatial(7168, n_0_fused * 32 + n_2_fused + n_3 + n_4)
                                v_k = T.axis.reduce(16384, k_0 * 128 + k_1 * 64 + k_2)
                                T.reads(y_acc_local[v_n], x_shared[v_k], B_shared[v_n, v_k])
                                T.writes(y_acc_local[v_n])
                                T.sblock_attr({"meta_schedule.thread_extent_high_inclusive": 1024, "meta_schedule.thread_extent_low_inclusive": 32, "meta_schedule.tiling_structure": "SSSRRSRS"})
                                y_acc_local[v_n] = y_acc_local[v_n] + T.Cast("float32", x_shared[v_k]) * T.Cast("float32", B_shared[v_n, v_k])
                    for ax0 in range(1):
                        with T.sblock("y_acc_local"):
                            v0 = T.axis.spatial(7168, n_0_fused * 32 + n_2_fused + ax0)
                            T.reads(y_acc_local[v0])
                            T.writes(y[v0])
                            y[v0] = T.Cast("float16", y_acc_local[v0])

# The GPU test binaries, named once for scripts/test.sh (what the cuda and hip presets build), scripts/device-check.sh
# (what runs on a device) and scripts/device-bundle.sh (what travels there). Sourced, not run.
# GPU_TESTS: paths under a cuda build folder; GPU_TESTS_HIP: the targets the hip preset builds (the kernel tests: the
# others link the whole runtime, which the hip preset does not build).
GPU_TESTS=(tests/unit/test_gpu_ops tests/unit/test_gpu_moe_ops tests/unit/test_gpu_tree_attention
           tests/unit/test_gpu_prefill_attention tests/unit/test_gpu_fp8 tests/unit/test_gpu_sample
           tests/integration/test_gpu_parity)
GPU_TESTS_HIP=(test_gpu_ops test_gpu_moe_ops test_gpu_tree_attention test_gpu_prefill_attention test_gpu_fp8)
# The cmake targets of GPU_TESTS.
GPU_TEST_TARGETS=()
for gpu_test in "${GPU_TESTS[@]}"; do GPU_TEST_TARGETS+=("$(basename "$gpu_test")"); done
unset gpu_test

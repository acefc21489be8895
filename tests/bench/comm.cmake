servetune_bench(bench_comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_comm.cpp LIBS servetune_comm)

servetune_bench(bench_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.cpp LIBS servetune_tokenizer)

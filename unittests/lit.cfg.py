# -*- Python -*-
# The gtest suites, run by lit's GoogleTest format: every TEST becomes a lit
# test and failures print their gtest output.
import os

import lit.formats

config.name = "mtpc-unit-" + os.path.basename(config.unittest_dir)
# The sanitizer build's suites (scripts/test.sh runs both in one lit run).
if getattr(config, "mtpc_sanitize", ""):
    config.name += "-sanitized"
    # LLVM and MLIR are prebuilt without ASan: their BumpPtrAllocator's
    # manual poisoning, inlined into our code, would report false
    # use-after-poison (allow_user_poisoning=0). A runaway allocation returns null (std::bad_alloc) instead of taking the
    # machine: ASan reserves too much address space for RLIMIT_AS to work.
    config.environment["ASAN_OPTIONS"] = (
        "detect_leaks=0:abort_on_error=0:strict_string_checks=1:allow_user_poisoning=0:"
        "allocator_may_return_null=1:max_allocation_size_mb=8192:"
        "detect_stack_use_after_return=1:check_initialization_order=1")
    config.environment["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
config.test_format = lit.formats.GoogleTest(".", "Tests")
config.test_source_root = config.unittest_dir
config.test_exec_root = config.unittest_dir

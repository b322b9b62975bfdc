# -*- Python -*-
# The gtest suites, run by lit's GoogleTest format: every TEST becomes a lit
# test and failures print their gtest output.
import lit.formats

config.name = "mtpc-unit"
config.test_format = lit.formats.GoogleTest(".", "Tests")
config.test_source_root = config.mtprt_unittest_dir
config.test_exec_root = config.mtprt_unittest_dir

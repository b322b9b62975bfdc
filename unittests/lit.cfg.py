# -*- Python -*-
# The gtest suites, run by lit's GoogleTest format: every TEST becomes a lit
# test and failures print their gtest output.
import os

import lit.formats

config.name = "mtpc-unit-" + os.path.basename(config.unittest_dir)
config.test_format = lit.formats.GoogleTest(".", "Tests")
config.test_source_root = config.unittest_dir
config.test_exec_root = config.unittest_dir

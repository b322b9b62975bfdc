# -*- Python -*-
# lit configuration for the mtpc compiler tests (dialect, frontend, passes,
# codegen, e2e).
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "mtpc"
# The sanitizer build's suite (scripts/test.sh runs both in one lit run).
# Leak checking is off: LLVM's and LibTorch's process-lifetime singletons
# are not leaks worth failing on; every other error fails the test.
if getattr(config, "mtpc_sanitize", ""):
    config.name = "mtpc-sanitized"
    config.available_features.add("sanitized")
    # LLVM and MLIR are prebuilt without ASan: their BumpPtrAllocator's
    # manual poisoning, inlined into our code, would report false
    # use-after-poison (allow_user_poisoning=0). A runaway allocation returns null (std::bad_alloc) instead of taking the
    # machine: ASan reserves too much address space for RLIMIT_AS to work.
    config.environment["ASAN_OPTIONS"] = (
        "detect_leaks=0:abort_on_error=0:strict_string_checks=1:allow_user_poisoning=0:"
        "allocator_may_return_null=1:max_allocation_size_mb=8192:"
        "detect_stack_use_after_return=1:check_initialization_order=1")
    config.environment["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".mtp", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "README.md", "lit.cfg.py",
                   "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.mtpc_obj_root, "test")

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%examples", os.path.join(config.mtpc_src_root,
                                                        "examples")))

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

tool_dirs = [config.mtpc_tools_dir, config.llvm_tools_dir]
# The driver's path, for scripts that run it themselves.
config.substitutions.append(("%mtpc", os.path.join(config.mtpc_tools_dir, "mtpc")))
tools = ["mtp-opt", "mtp-translate", "mtpc"]
llvm_config.add_tool_substitutions(tools, tool_dirs)

# `not`, `count` and `split-file` as commands in pipelines, and our tools
# wherever a test spells them out.
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.mtpc_tools_dir, append_path=True)

# The frontend fuzzer, when scripts/build.sh built it (clang-19 present).
fuzzer = os.path.join(config.mtpc_obj_root, "fuzz", "mtp-fuzz-frontend")
if os.path.exists(fuzzer):
    config.available_features.add("fuzzer")
    config.substitutions.append(("%mtp-fuzz-frontend", fuzzer))

# The runtime's plan runner, when scripts/build.sh built the runtime.
import sys
config.substitutions.append(("%python", sys.executable))

# The project's own torch (scripts/setup.sh's venv): the benchmarks' PyTorch
# peer runs with it.
import glob
config.substitutions.append(("%bench", os.path.join(config.mtpc_src_root, "bench")))
cache = os.environ.get("MTPC_CACHE",
                       os.path.join(os.path.expanduser("~"), ".cache", "mtpc"))
torch_python = os.path.join(cache, "venv", "bin", "python")
if os.path.exists(torch_python) and glob.glob(
        os.path.join(cache, "venv", "lib", "python*", "site-packages", "torch",
                     "__init__.py")):
    config.available_features.add("torch-python")
    config.substitutions.append(("%torch-python", torch_python))
    # transformers beside it (scripts/setup.sh installs it): the pretrained
    # backbones' tests build small random models and compare against them.
    if glob.glob(os.path.join(cache, "venv", "lib", "python*", "site-packages",
                              "transformers", "__init__.py")):
        config.available_features.add("transformers")
    # `mtpc prepare` runs its Python with the tokenizers package.
    if glob.glob(os.path.join(cache, "venv", "lib", "python*", "site-packages",
                              "tokenizers", "__init__.py")):
        config.available_features.add("tokenizers")
        config.environment["MTPC_PYTHON"] = torch_python
    for package in ("sentencepiece", "sklearn", "scipy", "seqeval"):
        if glob.glob(os.path.join(cache, "venv", "lib", "python*", "site-packages",
                                  package, "__init__.py")):
            config.available_features.add(package)

plan_runner = os.path.join(config.mtpc_obj_root, "runtime", "tools", "mtprt-run")
if os.path.exists(plan_runner):
    config.available_features.add("runtime")
    config.substitutions.append(("%mtprt-run", plan_runner))
    config.substitutions.append(("%mtprt-metrics", os.path.join(
        config.mtpc_obj_root, "runtime", "tools", "mtprt-metrics")))
    # The hand-written demo program: it writes the shards and checkpoints
    # the reader fuzzers start from.
    config.substitutions.append(("%mtprt-demo", os.path.join(
        config.mtpc_obj_root, "runtime", "tools", "mtprt-demo")))

# The runtime readers' fuzzers (runtime/fuzz/), when scripts/build.sh built
# them (clang-19 present).
reader_fuzzers = {name: os.path.join(config.mtpc_obj_root, "fuzz-runtime",
                                     "mtprt-fuzz-" + name)
                  for name in ["jsonl", "shard", "checkpoint", "plan",
                               "safetensors"]}
if all(os.path.exists(p) for p in reader_fuzzers.values()):
    config.available_features.add("reader-fuzzers")
    for name, path in reader_fuzzers.items():
        config.substitutions.append(("%mtprt-fuzz-" + name, path))

# The CUDA toolkit compiles the emitted kernels (it runs them only on a GPU).
if os.path.exists("/usr/local/cuda/bin/nvcc"):
    config.available_features.add("nvcc")
    config.substitutions.append(("%nvcc", "/usr/local/cuda/bin/nvcc"))

# A usable GPU (the lent machine): CUDA binaries run there, and are refused
# with what to do elsewhere.
import shutil
import subprocess
if shutil.which("nvidia-smi"):
    try:
        if subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                          timeout=30).returncode == 0:
            config.available_features.add("gpu")
    except (OSError, subprocess.SubprocessError):
        pass

# Headless Chromium (Debian's `chromium`, scripts/setup.sh) loads the pages
# `mtpc report` writes.
chromium = shutil.which("chromium")
if chromium:
    config.available_features.add("chromium")
    config.substitutions.append(("%chromium", chromium))

# What the declarations in this folder were written and checked for
# (README.md): the LibTorch release, and gloo's commit in that release's
# third_party/gloo. runtime/CMakeLists.txt refuses any other LibTorch.
set(MTPRT_GLOO_ABI_TORCH_VERSION 2.11.0)
set(MTPRT_GLOO_ABI_GLOO_COMMIT 3135b0b41b67dde590eef0938a0bf3d6238df5f7)

#include "kernels/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace kimi::cuda {
namespace {

// The soname of the toolkit this was built against (cuBLAS keeps its ABI within a major version).
std::string Soname() { return absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR); }

absl::StatusOr<CublasLtApi> Open() {
  const std::string name = Soname();
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", name, " (CUDA toolkit libraries on the loader path?): ",
                     why ? why : "unknown error"));
  }
  CublasLtApi api{};
  absl::Status missing = absl::OkStatus();
  auto bind = [&](auto& fn, const char* symbol) {
    void* p = dlsym(lib, symbol);
    if (p == nullptr && missing.ok()) {
      missing = absl::FailedPreconditionError(absl::StrCat(name, " lacks ", symbol));
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  bind(api.Create, "cublasLtCreate");
  bind(api.Destroy, "cublasLtDestroy");
  bind(api.GetStatusName, "cublasLtGetStatusName");
  bind(api.GetStatusString, "cublasLtGetStatusString");
  bind(api.Matmul, "cublasLtMatmul");
  bind(api.MatmulAlgoCheck, "cublasLtMatmulAlgoCheck");
  bind(api.MatmulAlgoConfigGetAttribute, "cublasLtMatmulAlgoConfigGetAttribute");
  bind(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  bind(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  bind(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  bind(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  bind(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  bind(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  bind(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  if (!missing.ok()) {
    dlclose(lib);
    return missing;
  }
  return api;  // the library stays open for the life of the process
}

}  // namespace

absl::StatusOr<const CublasLtApi*> LoadCublasLt() {
  static const absl::StatusOr<CublasLtApi> api = Open();
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace kimi::cuda

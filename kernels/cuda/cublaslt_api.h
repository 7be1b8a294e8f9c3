// cuBLASLt, opened with dlopen on first use instead of linked into every binary.
//
// Why: libcublasLt carries about 94 KiB of static TLS. Linked, it raises the minimum stack of every
// thread in the process, and libraries that create threads with small fixed stacks then fail
// (civetweb, under the Prometheus exposer, could no longer start its threads). Opened on demand,
// its TLS is allocated dynamically and only a process that runs GEMMs on a GPU loads it.
#pragma once

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace kimi::cuda {

struct CublasLtApi {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtGetStatusName) GetStatusName;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoCheck) MatmulAlgoCheck;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) MatmulAlgoConfigGetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// Opens the library (once per process; thread-safe) and resolves every entry point, or says which
// file or symbol is missing.
absl::StatusOr<const CublasLtApi*> LoadCublasLt();

}  // namespace kimi::cuda

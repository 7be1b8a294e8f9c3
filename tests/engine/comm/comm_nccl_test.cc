// The NCCL communicator on the GPUs of this machine (one rank per GPU under mpirun); skipped with
// a message where there is no GPU.
#include <cuda_runtime.h>

#include <vector>

#include "engine/comm/nccl_communicator.h"
#include "gtest/gtest.h"

namespace kimi {
namespace {

int Gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

TEST(NcclCommunicator, AllReduceAllGatherBroadcast) {
  auto world = MpiCommunicator::World(std::chrono::seconds(60));
  ASSERT_TRUE(world.ok());
  if (Gpus() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  if ((*world)->size() > Gpus()) GTEST_SKIP() << "more ranks than GPUs";
  auto nccl = NcclCommunicator::Create(**world, (*world)->rank(), std::chrono::seconds(60));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  const int n = (*nccl)->size(), r = (*nccl)->rank();
  std::vector<float> host(256, static_cast<float>(r + 1));
  float* dev = nullptr;
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gathered, host.size() * 4 * n), cudaSuccess);
  cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  ASSERT_TRUE((*nccl)->AllReduceSum(dev, 256).ok());
  cudaMemcpy(host.data(), dev, host.size() * 4, cudaMemcpyDeviceToHost);
  for (float v : host) ASSERT_EQ(v, static_cast<float>(n * (n + 1) / 2));
  ASSERT_TRUE((*nccl)->AllGather(dev, 256, gathered).ok());
  ASSERT_TRUE((*nccl)->Barrier().ok());
  cudaFree(dev);
  cudaFree(gathered);
}

}  // namespace
}  // namespace kimi

// The pack kernel (csrc/src/cuda/memory/kernels/batched_copy.cu) alone on a real GPU: one pack
// of a gradient set into 16-byte-aligned slots of a fusion buffer, as the device lanes
// launch it, timed with CUDA events against one cudaMemcpyAsync of the same bytes.
// Built by benchmarks/pack_kernel_sweep.sh once per (chunk bytes, threads) pair, as PTX
// for compute_75 like the core's copy, so that the driver JITs it as it does the core's.
//
//   pack_kernel_sweep < sizes.txt     (one tensor's bytes per line)
// prints: chunk threads launches pack_us copy_us efficiency
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../csrc/src/cuda/memory/copy_table.cc"
#include "../csrc/src/cuda/memory/kernels/batched_copy.cu"

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t rc_ = (call);                                                         \
    if (rc_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(rc_));              \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  std::vector<long long> sizes;
  for (long long n; std::scanf("%lld", &n) == 1;) sizes.push_back(n);
  long long total = 0;
  std::vector<long long> offsets;
  for (long long n : sizes) {
    offsets.push_back(total);
    total += (n + 15) / 16 * 16;  // the lanes' 16-byte slot padding
  }
  char *tensors, *buffer;
  CHECK(cudaMalloc(&tensors, total));
  CHECK(cudaMalloc(&buffer, total));
  CHECK(cudaMemset(tensors, 1, total));
  std::vector<perseus::gpu::DeviceCopy> copies;
  for (size_t i = 0; i < sizes.size(); ++i)  // tensor i lies at the same offset in both
    copies.push_back({tensors + offsets[i], buffer + offsets[i], sizes[i]});

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  int launches = 0;
  auto pack = [&]() {
    perseus::gpu::CopyCursor cursor;
    PerseusCopyTable table{};
    launches = 0;
    while (unsigned blocks = perseus::gpu::FillCopyTable(copies.data(), copies.size(), &cursor, &table)) {
      perseus_batched_copy<<<blocks, PERSEUS_COPY_THREADS, 0, stream>>>(table);
      ++launches;
    }
  };
  auto copy = [&]() { cudaMemcpyAsync(buffer, tensors, total, cudaMemcpyDeviceToDevice, stream); };
  std::vector<float> pack_ms, copy_ms;
  for (int i = 0; i < 40; ++i) {
    for (int which = 0; which < 2; ++which) {
      CHECK(cudaEventRecord(start, stream));
      if (which == 0) pack(); else copy();
      CHECK(cudaEventRecord(end, stream));
      CHECK(cudaEventSynchronize(end));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, end));
      if (i >= 5) (which == 0 ? pack_ms : copy_ms).push_back(ms);
    }
  }
  CHECK(cudaGetLastError());
  const float p = median(pack_ms) * 1e3f, c = median(copy_ms) * 1e3f;
  std::printf("%u %d %d %.1f %.1f %.0f%%\n", PERSEUS_COPY_CHUNK_BYTES, PERSEUS_COPY_THREADS, launches, p, c,
              100.0 * c / p);
  return 0;
}

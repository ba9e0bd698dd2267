// Two CUDA green contexts over disjoint SM partitions, one stream each, for perf/green_probe.py (built there with
// nvcc -shared ... -lcuda). C against cuda.h rather than ctypes: the resource structs' layout is the header's.
#include <cuda.h>

extern "C" int green_streams(unsigned want_sms, CUstream* a, CUstream* b, unsigned* sms_a, unsigned* sms_b) {
  CUresult r;
  CUdevice dev;
  if ((r = cuInit(0)) != CUDA_SUCCESS) return (int)r;
  if ((r = cuDeviceGet(&dev, 0)) != CUDA_SUCCESS) return (int)r;
  CUdevResource all, part, rest;
  unsigned groups = 1;
  if ((r = cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM)) != CUDA_SUCCESS) return (int)r;
  if ((r = cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, want_sms)) != CUDA_SUCCESS) return (int)r;
  CUdevResourceDesc da, db;
  if ((r = cuDevResourceGenerateDesc(&da, &part, 1)) != CUDA_SUCCESS) return (int)r;
  if ((r = cuDevResourceGenerateDesc(&db, &rest, 1)) != CUDA_SUCCESS) return (int)r;
  CUgreenCtx ga, gb;
  if ((r = cuGreenCtxCreate(&ga, da, dev, CU_GREEN_CTX_DEFAULT_STREAM)) != CUDA_SUCCESS) return (int)r;
  if ((r = cuGreenCtxCreate(&gb, db, dev, CU_GREEN_CTX_DEFAULT_STREAM)) != CUDA_SUCCESS) return (int)r;
  if ((r = cuGreenCtxStreamCreate(a, ga, CU_STREAM_NON_BLOCKING, 0)) != CUDA_SUCCESS) return (int)r;
  if ((r = cuGreenCtxStreamCreate(b, gb, CU_STREAM_NON_BLOCKING, 0)) != CUDA_SUCCESS) return (int)r;
  *sms_a = part.sm.smCount;
  *sms_b = rest.sm.smCount;
  return 0;
}

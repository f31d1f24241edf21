/* device_cuda_kernels — the GPU code of the CUDA device stage (device_cuda.c launches
 * it on the stream's copy stream): the on-GPU cast and normalize of a uint8 image
 * field. Each output element is a table look-up, (v / 255 - mean) / std already
 * computed on the host exactly as the host pipeline computes it, so the device batch is
 * bit-identical to the host one; the kernel only moves bytes and reorders HWC to CHW.
 * Built by nvcc only when CUDA is on; C callers see one extern "C" function. */
#include <stdint.h>

#define NORM_MAX_C 4

struct device_cuda_norm_args {
    uint32_t rows, c, h, w;
    int from_hwc;
    int f16;
};

__global__ void device_cuda_normalize_kernel(const uint8_t *__restrict__ src, void *__restrict__ dst,
                                             const void *__restrict__ lut, struct device_cuda_norm_args a)
{
    uint64_t plane = (uint64_t)a.h * a.w;
    uint64_t per_row = plane * a.c;
    uint64_t total = per_row * a.rows;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        /* i indexes the output, [n][ch][y][x]. */
        uint64_t n = i / per_row, r = i % per_row;
        uint32_t ch = (uint32_t)(r / plane);
        uint64_t yx = r % plane;
        uint64_t s = a.from_hwc ? n * per_row + yx * a.c + ch : i;
        uint8_t v = src[s];
        if (a.f16)
            ((uint16_t *)dst)[i] = ((const uint16_t *)lut)[ch * 256u + v];
        else
            ((float *)dst)[i] = ((const float *)lut)[ch * 256u + v];
    }
}

/* Queues the kernel on `stream` (a cudaStream_t); returns the cudaError_t of the launch. */
extern "C" __attribute__((visibility("hidden"))) int device_cuda_normalize(const void *src, void *dst, const void *lut,
                                                                           uint32_t rows, uint32_t c, uint32_t h,
                                                                           uint32_t w, int from_hwc, int f16,
                                                                           void *stream)
{
    struct device_cuda_norm_args a = {rows, c, h, w, from_hwc, f16};
    uint64_t total = (uint64_t)rows * c * h * w;
    if (total == 0)
        return 0;
    uint64_t blocks = (total + 255) / 256;
    if (blocks > 65535u * 8u)
        blocks = 65535u * 8u; /* grid-stride loop covers the rest */
    device_cuda_normalize_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>((const uint8_t *)src, dst, lut, a);
    return (int)cudaGetLastError();
}

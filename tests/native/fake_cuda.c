/*
 * fake_cuda.c - a shared library that stands for the CUDA driver in
 * test_cuda_probe (named by GDRKV_CUDA_LIB): it has none of the driver's
 * symbols, so once it is noticed, loading the driver's table fails.
 */
int gk_fake_cuda(void);

int gk_fake_cuda(void)
{
    return 1;
}

import torch
from nvfp4train.formats import nvfp4, hadamard, triton_kernels as tk
from nvfp4train.formats.rounding import random_bits_like
from nvfp4train.formats import sr_generator
g = torch.Generator().manual_seed(0)
for T, C in ((64, 48), (32, 80), (128, 64)):
  x = torch.randn(T, C, generator=g); x[::7, ::5] *= 300; x[3] *= 1e-3
  for xx in (x, x.bfloat16()):
    a = nvfp4.rht_quantize_t(xx, impl="triton"); b = nvfp4.rht_quantize_t(xx, impl="reference")
    print(T, C, xx.dtype, torch.equal(a.codes, b.codes), torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8)), torch.equal(a.amax, b.amax), torch.equal(a.global_decode_scale, b.global_decode_scale))
    v1, s1 = nvfp4.rht_fake_quantize_t(xx, out_dtype=torch.float32, impl="triton"); v2, s2 = nvfp4.rht_fake_quantize_t(xx, out_dtype=torch.float32, impl="reference")
    print('  dense', torch.equal(v1.view(torch.int32), v2.view(torch.int32)))
    bits = random_bits_like(torch.empty(C, T), sr_generator(4))
    c1 = tk.rht_nvfp4_t(xx, hadamard.resolve_signs(16), "sr", dense=False, random_bits=bits)
    r = nvfp4.rht_quantize_t(xx, "sr", sr_generator(4), impl="reference")
    print('  sr', torch.equal(c1[0], r.codes), torch.equal(c1[1], r.scales.view(torch.uint8)))

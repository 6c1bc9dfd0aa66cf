import time, inspect, sys
import cupy, numpy as np
print("cupy", cupy.__version__, "numpy", np.__version__)
from cupy_backends.cuda.api import driver as drv
print("launchKernel" in dir(drv), getattr(drv, "launchKernel", None).__doc__)
print([n for n in dir(drv) if "emset" in n or "raph" in n or "aunch" in n])
print([n for n in dir(cupy.cuda.graph)])
print("Stream attrs", [n for n in dir(cupy.cuda.Stream) if not n.startswith("_")])
src = r'''extern "C" __global__ void add1(const float* x, float* y, int n){int i=blockIdx.x*blockDim.x+threadIdx.x; if(i<n) y[i]=x[i]+1.f;}'''
m = cupy.RawModule(code=src); f = m.get_function("add1")
print("Function attrs", [n for n in dir(f.kernel) if not n.startswith("_")])
x = cupy.random.rand(1<<16, dtype=cupy.float32); y = cupy.empty_like(x)
import ctypes
args = [ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(y.data.ptr), ctypes.c_int(1<<16)]
params = (ctypes.c_void_p*3)(*[ctypes.addressof(a) for a in args])
s = cupy.cuda.get_current_stream()
drv.launchKernel(f.kernel.ptr, 256,1,1, 256,1,1, 0, s.ptr, ctypes.addressof(params), 0)
cupy.cuda.Device().synchronize(); print("ok", bool((y==x+1).all()))
N=2000
t=time.perf_counter()
for _ in range(N): drv.launchKernel(f.kernel.ptr, 256,1,1, 256,1,1, 0, s.ptr, ctypes.addressof(params), 0)
print("driver launch us", (time.perf_counter()-t)/N*1e6)
cupy.cuda.Device().synchronize()
t=time.perf_counter()
for _ in range(N): f((256,),(256,),(x,y,np.int32(1<<16)))
print("cupy Function call us", (time.perf_counter()-t)/N*1e6)
cupy.cuda.Device().synchronize()
t=time.perf_counter()
for _ in range(N): z = cupy.empty((256,256), cupy.float32)
print("cupy.empty us", (time.perf_counter()-t)/N*1e6)
t=time.perf_counter()
for _ in range(N): s2 = cupy.cuda.get_current_stream().ptr
print("get_current_stream us", (time.perf_counter()-t)/N*1e6)
import torch
tx = torch.rand(256,256, device="cuda")
t=time.perf_counter()
for _ in range(N): p = tx.data_ptr(); st = tx.stride(); sh=tx.shape; dt=tx.dtype; dv=tx.device
print("torch attrs us", (time.perf_counter()-t)/N*1e6)
t=time.perf_counter()
for _ in range(N): z = torch.empty((256,256), dtype=torch.float32, device=tx.device)
print("torch.empty us", (time.perf_counter()-t)/N*1e6)
t=time.perf_counter()
for _ in range(N): ts = torch.cuda.current_stream().cuda_stream
print("torch current_stream us", (time.perf_counter()-t)/N*1e6)
t=time.perf_counter()
for _ in range(N): ts = torch._C._cuda_getCurrentRawStream(0)
print("torch raw stream us", (time.perf_counter()-t)/N*1e6)
t=time.perf_counter()
for _ in range(N): cp=cupy.asarray(tx)
print("cupy.asarray(torch) us", (time.perf_counter()-t)/N*1e6)
# graph capture
st = cupy.cuda.Stream(non_blocking=True)
with st:
    st.begin_capture()
    for _ in range(9): drv.launchKernel(f.kernel.ptr, 256,1,1, 256,1,1, 0, st.ptr, ctypes.addressof(params), 0)
    g = st.end_capture()
print("graph", type(g), [n for n in dir(g) if not n.startswith("_")])
t=time.perf_counter()
for _ in range(N): g.launch(s)
print("graph launch us (9 kernels)", (time.perf_counter()-t)/N*1e6)
cupy.cuda.Device().synchronize()
print(inspect.signature(st.begin_capture) if hasattr(inspect,'signature') else '')
print(drv.get_build_version() if hasattr(drv,'get_build_version') else '', cupy.cuda.runtime.runtimeGetVersion(), cupy.cuda.driver.get_build_version())
from cupy_backends.cuda.libs import nvrtc; print("nvrtc", nvrtc.getVersion())
